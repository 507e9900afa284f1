r"""The offline/online positioning framework of Fig. 1, one function per stage.

Offline (Steps 1-4):

1. :func:`fit_phase_model`: L labeled snapshots -> the shared GP PhaseModel (Sec. III).
2. :func:`make_training_set`: the GP PhaseModel -> a synthetic set on disk (Sec. III-C).
3. :func:`train_estimator`: the synthetic set -> POPT (or the MLP / HI benchmarks) (Sec. IV).
4. :func:`search_radius`: the trained estimator's validation errors -> the safeguard radius.

Online (for every snapshot, batched):

1. :func:`coarse_estimate`: the learned estimator's position (float32 network, returned
   as float64).
2. :func:`~dmimo_jax.estimators.window_search` (the safeguard): the LS cost of eq. (17)
   on a :math:`\lambda/4` grid in a cube of half-width ``radius`` around the coarse
   estimate, with the tabulated GP mean (:class:`~dmimo_jax.gp.TabulatedGPModel`),
   then a multi-start refinement under the same cheap model.
3. :func:`~dmimo_jax.estimators.refine_batch` with the exact GP PhaseModel (eq. 27 in
   place of the analytic model): the fine estimate.

:func:`locate` runs the three online steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax import gp
from dmimo_jax._checks import check_phases
from dmimo_jax.estimators import (
    CellTable,
    PhasorTable,
    candidate_search,
    cell_grid,
    cell_table,
    coarse_to_fine,
    phasor_table,
    refine_batch,
    search_grid,
    window_search,
)
from dmimo_jax.learning.cells import CellClassifier
from dmimo_jax.learning.data import load_dataset, write_dataset
from dmimo_jax.learning.hi import AmbiguityClassifier, HIEstimator
from dmimo_jax.learning.io import load_model, save_model
from dmimo_jax.learning.mlp import MLPConfig, MLPRegressor
from dmimo_jax.learning.popt import POPT, POPTConfig
from dmimo_jax.learning.presets import CellsPreset, get_preset
from dmimo_jax.learning.train import TrainConfig, train
from dmimo_jax.physics import PhaseModel
from dmimo_jax.scene import Scene

__all__ = [
    "CandidateOnlineResult",
    "HIEstimator",
    "cell_probabilities",
    "locate_candidates",
    "Offline",
    "run_offline",
    "OnlineResult",
    "coarse_estimate",
    "fit_phase_model",
    "locate",
    "make_training_set",
    "search_radius",
    "train_estimator",
    "window_search",  # re-exported from dmimo_jax.estimators (its home)
]


# ----------------------------------------------------------------------------- offline

#: the coarse estimators run_offline trains
KINDS = ("popt", "mlp", "hi", "cells")


def fit_phase_model(
    x: ArrayLike, r: ArrayLike, noise_var: ArrayLike, scene: Scene, **fit_kwargs: Any
) -> gp.GPPhaseModel:
    """Step 1: fit the shared GP on L labeled snapshots (eqs. 23-24) and condition it (eq. 25).

    ``scene`` supplies the geometry and wavelength only; its permittivity is not used.
    """
    result = gp.fit(x, r, noise_var, scene, **fit_kwargs)
    return gp.GPPhaseModel.from_fit(result, x, r, noise_var, scene)


def make_training_set(
    path: str | pathlib.Path,
    key: Array,
    model: PhaseModel,
    num: int,
    *,
    chunk_size: int = 8192,
    progress: bool = True,
):
    """Step 2: write ``num`` synthetic snapshots of ``model`` to ``path`` (resumable) and
    return them as memory-mapped arrays (``.x``, ``.r``, ``.cpo``)."""
    write_dataset(path, key, model, num, chunk_size=chunk_size, progress=progress)
    return load_dataset(path)


def train_estimator(
    kind: str,
    data: Any,
    scene: Scene,
    *,
    preset: str = "cpu",
    config: TrainConfig | None = None,
    network: POPTConfig | MLPConfig | None = None,
    checkpoint_dir: str | pathlib.Path | None = None,
    seed: int = 0,
    progress: bool = True,
    on_epoch_end: Any = None,
):
    """Step 3: build and train ``kind`` in ``{"popt", "mlp", "hi", "cells"}`` on ``data``.

    ``preset`` picks POPT's network and the loop settings (:data:`~dmimo_jax.learning.presets.PRESETS`);
    ``config`` / ``network`` override them. Returns the :class:`~dmimo_jax.learning.train.TrainResult`.
    """
    p = get_preset(preset)
    config = config or p.train
    rngs = nnx.Rngs(seed)
    low, high = scene.ue_low, scene.ue_high
    if kind == "popt":
        net = POPT(scene.num_aps, network or p.popt, low=low, high=high, rngs=rngs)
    elif kind == "mlp":
        net = MLPRegressor(scene.num_aps, network or MLPConfig(), low=low, high=high, rngs=rngs)
    elif kind == "hi":
        net = AmbiguityClassifier.for_scene(scene, network or MLPConfig(), rngs=rngs)
    elif kind == "cells":
        c = p.cells
        cells = cell_grid(scene, c.cell_size)
        net = CellClassifier(scene.num_aps, network or c.network, cells=cells, rngs=rngs)
        config = config if config is not None and config is not p.train else c.train
    else:
        raise ValueError(f"kind must be 'popt', 'mlp', 'hi' or 'cells', got {kind!r}")
    return train(
        net,
        data,
        config,
        checkpoint_dir=checkpoint_dir,
        progress=progress,
        on_epoch_end=on_epoch_end,
    )


def coarse_estimate(estimator: Any, r: ArrayLike) -> Array:
    """Online step 1: (B, 3) float64 positions from a trained estimator (POPT, MLP or HI).

    A Flax network runs as a pure jitted function of its current state (split on every
    call, so further training of the network is always seen; nothing is cached here
    beyond JAX's own compilation cache, keyed by the network's structure).
    """
    r = jnp.asarray(r)
    r = r[None, :] if r.ndim == 1 else r
    num_aps = getattr(estimator, "num_aps", None)
    if num_aps is not None:
        check_phases("r", r, num_aps, batched=True)
    if isinstance(estimator, nnx.Module):
        graphdef, state = nnx.split(estimator)
        out = _apply_network(graphdef, state, r.astype(jnp.float32))
    else:
        out = estimator(r)
    return jnp.asarray(out, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)


@partial(jax.jit, static_argnums=(0,))
def _apply_network(graphdef: Any, state: Any, r: Array) -> Array:
    return nnx.merge(graphdef, state)(r)


def search_radius(
    estimator: Any,
    r: ArrayLike,
    x: ArrayLike,
    *,
    quantile: float = 1.0,
    factor: float = 1.5,
    minimum: float = 0.1,
) -> float:
    """Step 4: the safeguard radius from held-out errors: ``factor`` x their ``quantile``.

    With the default (1.5 x the largest validation error, at least 10 cm) the window
    covers every coarse error seen in validation with margin.
    """
    err = np.linalg.norm(np.asarray(coarse_estimate(estimator, r)) - np.asarray(x), axis=-1)
    return float(max(minimum, factor * np.quantile(err, quantile)))


class Offline(NamedTuple):
    """Everything the online stage needs, from :func:`run_offline`."""

    model: gp.GPPhaseModel  # the exact GP PhaseModel (fine refinement)
    screen: gp.TabulatedGPModel  # its tabulated mean (safeguard)
    table: PhasorTable  # lambda/4 phasor table of ``screen`` over the UE region (wide windows)
    estimators: dict  # kind -> coarse estimator (POPT / MLP network, HIEstimator)
    radii: dict  # kind -> safeguard radius, m
    info: dict  # kind -> training record (history, validation RMSE and max, radius)
    cache: pathlib.Path  # the folder of this configuration
    cells: CellTable | None = None  # the cell table of the "cells" estimator's screen


def _config_key(scene: Scene, x: Array, r: Array, config: dict) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(config, sort_keys=True).encode())
    for a in (scene.ap_positions, scene.wavelength, x, r):
        h.update(np.ascontiguousarray(np.asarray(a, np.float64)).tobytes())
    return h.hexdigest()[:16]


def run_offline(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    *,
    kinds: tuple[str, ...] = ("popt",),
    preset: str = "cpu",
    num_samples: int | None = None,
    cache_dir: str | pathlib.Path = "cache",
    seed: int = 0,
    progress: bool = True,
    on_epoch_end: Any = None,
    cells: CellsPreset | None = None,
) -> Offline:
    """Steps 1-4 for the estimators ``kinds``, cached by a key of their configuration.

    The cache folder ``cache_dir/<key>`` (the key hashes the training snapshots, the scene
    geometry, the preset, the sample count and the seed) holds the synthetic set and one
    folder per estimator with its orbax checkpoints and final model. A finished model is
    loaded instead of retrained; an interrupted synthesis or training resumes.

    Args:
        x, r, noise_var: the L labeled snapshots (positions, wrapped phases, noise variances).
        scene: geometry and wavelength (its permittivity is not used).
        kinds: estimators to train, from ``{"popt", "mlp", "hi"}``.
        preset: ``"cpu"`` or ``"paper"`` (:data:`~dmimo_jax.learning.presets.PRESETS`).
        num_samples: synthetic set size (default: the preset's).
        cache_dir: root of the cache.
        seed: seeds the synthetic set and the initializations.
        progress: tqdm bars.
        on_epoch_end: passed to :func:`~dmimo_jax.learning.train` (e.g. to stop at an
            epoch boundary when a time budget is spent; the next call resumes).
        cells: the cell classifier's settings (default: the preset's ``cells``).
    """
    p = get_preset(preset)
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"kinds must be from {KINDS}, got {kind!r}")
    num = p.num_samples if num_samples is None else int(num_samples)
    x, r = jnp.asarray(x), jnp.asarray(r)
    model = fit_phase_model(x, r, noise_var, scene)
    screen = gp.TabulatedGPModel.from_model(model)
    table = phasor_table(screen, search_grid(scene, float(scene.wavelength) / 4, region="ue"))
    config = dict(
        preset=preset,
        num_samples=num,
        seed=seed,
        train=dataclasses.asdict(p.train),
        popt=dataclasses.asdict(p.popt),
    )
    folder = pathlib.Path(cache_dir) / _config_key(scene, x, r, config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    estimators, radii, info = {}, {}, {}
    cells = None
    if "cells" in kinds:
        settings = get_preset(preset).cells if cells is None else cells
        net, meta, cells = _offline_cells(
            folder, screen, scene, settings, seed, progress, on_epoch_end
        )
        estimators["cells"], radii["cells"], info["cells"] = net, float(meta["radius"]), meta
    if not [k for k in kinds if k != "cells"]:
        return Offline(model, screen, table, estimators, radii, info, folder, cells)
    data = make_training_set(folder / "data", jax.random.key(seed), model, num, progress=progress)
    n_val = max(1, int(round(p.train.val_fraction * num)))
    val = slice(num - min(n_val, 4096), num)
    for kind in (k for k in kinds if k != "cells"):
        out = folder / kind / "model"
        if (out / "spec.json").is_file():
            net, meta = load_model(out)
        else:
            res = train_estimator(
                kind,
                data,
                scene,
                preset=preset,
                checkpoint_dir=folder / kind / "ckpt",
                seed=seed,
                progress=progress,
                on_epoch_end=on_epoch_end,
            )
            net = res.model
            meta = dict(history=res.history)
            est = HIEstimator(net, scene) if kind == "hi" else net
            xv, rv = np.asarray(data.x[val]), np.asarray(data.r[val])
            err = np.linalg.norm(np.asarray(coarse_estimate(est, rv)) - xv, axis=-1)
            meta.update(
                radius=search_radius(est, rv, xv),
                val_rmse_m=float(np.sqrt(np.mean(err**2))),
                val_max_m=float(err.max()),
            )
            save_model(out, net, meta=meta)
        estimators[kind] = HIEstimator(net, scene) if kind == "hi" else net
        radii[kind] = float(meta["radius"])
        info[kind] = meta
    return Offline(model, screen, table, estimators, radii, info, folder, cells)


def _offline_cells(folder, screen, scene, c, seed, progress, on_epoch_end):
    """The cell classifier of settings ``c`` (its own synthetic set from the tabulated GP
    mean, cached under ``folder/cells-<hash of its settings>``) and the cell table."""
    settings = dataclasses.asdict(c)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
    sub = folder / f"cells-{digest}"
    sub.mkdir(parents=True, exist_ok=True)
    (sub / "config.json").write_text(json.dumps(settings, indent=1))
    out = sub / "model"
    if (out / "spec.json").is_file():
        net, meta = load_model(out)
    else:
        # the tabulated GP mean synthesizes ~100x faster than the exact GP (same mean to
        # ~1e-4 rad): the classifier needs about a million samples
        data = make_training_set(
            sub / "data",
            jax.random.key(seed + 1),
            screen,
            c.num_samples,
            chunk_size=65536,
            progress=progress,
        )
        net = CellClassifier(
            scene.num_aps, c.network, cells=cell_grid(scene, c.cell_size), rngs=nnx.Rngs(seed)
        )
        res = train(
            net,
            data,
            c.train,
            checkpoint_dir=sub / "ckpt",
            progress=progress,
            on_epoch_end=on_epoch_end,
        )
        net = res.model
        n_val = max(1, int(round(c.train.val_fraction * c.num_samples)))
        xv = np.asarray(data.x[c.num_samples - n_val :])
        rv = np.asarray(data.r[c.num_samples - n_val :])
        miss = np.asarray(net.error(rv, xv))
        meta = dict(history=res.history, val_top_k_miss=float(miss.mean()), radius=c.cell_size)
        save_model(out, net, meta=meta)
    table = cell_table(screen, cell_grid(scene, c.cell_size))  # float64 corners
    return net, meta, table


# ----------------------------------------------------------------------------- online


class OnlineResult(NamedTuple):
    coarse: Array  # (B, 3) learned estimate
    screened: Array  # (B, 3) best point of the safeguard window (after its cheap refinement)
    fine: Array  # (B, 3) refined with the exact phase model
    cost: Array  # (B,) ML cost (eq. 17) at the fine estimate
    cpo: Array  # (B,) CPO estimate at the fine estimate


def locate(
    r: ArrayLike,
    estimator: Any,
    model: PhaseModel,
    *,
    screen: PhaseModel | None = None,
    radius: float = 0.5,
    spacing: float | None = None,
    num_starts: int = 8,
    refine_steps: int = 15,
    table: PhasorTable | None = None,
) -> OnlineResult:
    """The online stage: coarse estimate -> safeguard window -> refinement with ``model``.

    Args:
        r: (M,) or (B, M) wrapped phases.
        estimator: trained POPT / MLP / :class:`HIEstimator` (anything r -> positions).
        model: the exact PhaseModel for the fine estimate (the GP model; or the analytic
            model for a matched-model study).
        screen: the cheap model of the window search (default: the tabulated ``model`` when
            it is a :class:`~dmimo_jax.gp.GPPhaseModel`, else ``model`` itself).
        radius, spacing, num_starts: the window (:func:`window_search`).
        refine_steps: LM steps of the final refinement.
        table: a :class:`~dmimo_jax.estimators.PhasorTable` of ``screen`` for wide windows.
    """
    r = jnp.asarray(r)
    r = r[None, :] if r.ndim == 1 else r
    if screen is None:
        screen = (
            gp.TabulatedGPModel.from_model(model) if isinstance(model, gp.GPPhaseModel) else model
        )
    x0 = coarse_estimate(estimator, r)
    r = r.astype(x0.dtype)
    xs = window_search(
        r, screen, x0, radius=radius, spacing=spacing, num_starts=num_starts, table=table
    )
    fine = refine_batch(xs, r, model, num_steps=refine_steps)
    return OnlineResult(x0, xs, fine.x, fine.cost, fine.cpo)


# ----------------------------------------------------------------------------- candidates


class CandidateOnlineResult(NamedTuple):
    """Output of :func:`locate_candidates` (leading batch axis B)."""

    cells: Array  # (B, K) candidate cells, most likely first
    mass: Array  # (B,) their total probability (the confidence signal)
    fallback: Array  # (B,) bool: screened over the whole region instead
    screened: Array  # (B, 3) best point of the candidate screen (or the fallback)
    fine: Array  # (B, 3) after the final exact refinement steps
    cost: Array  # (B,) ML cost (eq. 17) of ``fine`` under the exact model
    cpo: Array  # (B,) CPO estimate at ``fine``


def cell_probabilities(classifier: nnx.Module, r: ArrayLike, k: int) -> tuple[Array, Array]:
    """The ``k`` most likely cells (B, k) of a :class:`~dmimo_jax.learning.cells.CellClassifier`
    and their total probability (B,), run as one jitted pure function of the current weights."""
    r = jnp.asarray(r)
    r = r[None, :] if r.ndim == 1 else r
    check_phases("r", r, classifier.num_aps, batched=True)
    graphdef, state = nnx.split(classifier)
    return _top_cells(graphdef, state, r.astype(jnp.float32), k)


@partial(jax.jit, static_argnums=(0, 3))
def _top_cells(graphdef: Any, state: Any, r: Array, k: int) -> tuple[Array, Array]:
    return nnx.merge(graphdef, state).top_cells(r, k)


def locate_candidates(
    r: ArrayLike,
    classifier: nnx.Module,
    model: PhaseModel,
    *,
    screen: PhaseModel,
    table: CellTable,
    fallback_table: PhasorTable | None = None,
    num_cells: int = 16,
    min_mass: float = 0.5,
    num_starts: int = 4,
    screen_steps: int = 8,
    fine_steps: int = 2,
) -> CandidateOnlineResult:
    """The online stage with a cell classifier: candidates -> cell screen -> exact steps.

    1. the classifier's ``num_cells`` most likely cells and their probability mass;
    2. snapshots whose mass is at least ``min_mass`` are screened in those cells
       (:func:`~dmimo_jax.estimators.candidate_search` under the cheap ``screen`` model,
       ``num_starts`` refinements of ``screen_steps``); the others fall back to the
       whole-region hierarchical screen (:func:`~dmimo_jax.estimators.coarse_to_fine` on
       ``fallback_table``);
    3. ``fine_steps`` Levenberg-Marquardt steps under the exact ``model`` finish (the
       screen's refinement already sits in the right basin, within the tabulation error).

    Raises:
        ValueError: a fallback is needed and no ``fallback_table`` was given, or bad input.
    """
    r = jnp.asarray(r)
    r = r[None, :] if r.ndim == 1 else r
    check_phases("r", r, model.num_aps, batched=True)
    if classifier.num_aps != model.num_aps:
        raise ValueError(
            f"classifier was trained for {classifier.num_aps} APs, the model has {model.num_aps}"
        )
    own, used = classifier.cells, table.cells
    if own.shape != used.shape or not (
        np.allclose(np.asarray(own.low), np.asarray(used.low), atol=1e-4)
        and abs(own.cell_size - used.cell_size) < 1e-9
    ):
        raise ValueError(
            "classifier was trained for another scene or partition: its cells "
            f"{own.shape} of {own.cell_size} m from {np.asarray(own.low)}, the table's "
            f"{used.shape} of {used.cell_size} m from {np.asarray(used.low)}"
        )
    cells, mass = cell_probabilities(classifier, r, num_cells)
    fallback = np.asarray(mass) < min_mass
    r64 = r.astype(jnp.result_type(float))
    xs = jnp.zeros((r.shape[0], 3), r64.dtype)
    ok = np.flatnonzero(~fallback)
    if ok.size:
        found = candidate_search(
            r64[ok], screen, table, cells[ok], num_starts=num_starts, num_steps=screen_steps
        )
        xs = xs.at[ok].set(found.x)
    bad = np.flatnonzero(fallback)
    if bad.size:
        if fallback_table is None:
            raise ValueError(
                f"{bad.size} snapshots fell below min_mass={min_mass}; pass fallback_table"
            )
        xs = xs.at[bad].set(coarse_to_fine(r64[bad], screen, fallback_table).x)
    fine = refine_batch(xs, r64, model, num_steps=fine_steps)
    return CandidateOnlineResult(
        cells, mass, jnp.asarray(fallback), xs, fine.x, fine.cost, fine.cpo
    )
