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

Beyond the paper, :func:`locate_candidates` replaces the regression network by a cell
classifier: its most likely cells -> the two-tier candidate screen
(:func:`screen_candidates`, the whole region only when the classifier itself is unsure)
-> refinement under the tabulated GP model of eq. (27) (``Offline.screen``: mean and
variance read from tables, no kernel evaluation online).
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
from dmimo_jax._checks import check_int, check_phases, check_scalar
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
    "CandidateScreen",
    "screen_candidates",
    "HIEstimator",
    "bucket_size",
    "bucketed",
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
    screen: gp.TabulatedGPModel  # mean and variance tables, eq. (27): screens, cheap fine
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
    cell_corners = None
    if "cells" in kinds:
        settings = p.cells if cells is None else cells
        net, meta, cell_corners = _offline_cells(
            folder, screen, scene, settings, seed, progress, on_epoch_end
        )
        estimators["cells"], radii["cells"], info["cells"] = net, float(meta["radius"]), meta
    if not [k for k in kinds if k != "cells"]:
        return Offline(model, screen, table, estimators, radii, info, folder, cell_corners)
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
    return Offline(model, screen, table, estimators, radii, info, folder, cell_corners)


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
        # ~1e-5 rad): the classifier needs about a million samples
        data = make_training_set(
            sub / "data",
            jax.random.key(seed + 1),
            screen.without_variance(),  # the GP mean + the LoS phase noise
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
        screen: the cheap model of the window search (default: the tabulated mean of
            ``model`` when it is a :class:`~dmimo_jax.gp.GPPhaseModel`, else ``model``).
        radius, spacing, num_starts: the window (:func:`window_search`).
        refine_steps: LM steps of the final refinement.
        table: a :class:`~dmimo_jax.estimators.PhasorTable` of ``screen`` for wide windows.
    """
    r = jnp.asarray(r)
    r = r[None, :] if r.ndim == 1 else r
    if screen is None:
        screen = (
            gp.TabulatedGPModel.from_model(model, variance=False)
            if isinstance(model, gp.GPPhaseModel)
            else model
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
    narrow: Array  # (B,) bool: confident enough to screen only the first few cells
    screened: Array  # (B, 3) refined best point of the screen (under the tabulated model)
    fine: Array  # (B, 3) after the fine stage's steps under ``model``
    cost: Array  # (B,) ML cost (eq. 17) of ``fine`` under ``model``
    cpo: Array  # (B,) CPO estimate at ``fine``


def cell_probabilities(classifier: nnx.Module, r: ArrayLike, k: int) -> tuple[Array, Array]:
    """The ``k`` most likely cells (B, k) of a :class:`~dmimo_jax.learning.cells.CellClassifier`,
    most likely first, and their probabilities (B, k), run as one jitted pure function of
    the current weights."""
    r = jnp.asarray(r)
    r = r[None, :] if r.ndim == 1 else r
    check_phases("r", r, classifier.num_aps, batched=True)
    graphdef, state = nnx.split(classifier)
    return _top_cells(graphdef, state, r.astype(jnp.float32), k)


@partial(jax.jit, static_argnums=(0, 3))
def _top_cells(graphdef: Any, state: Any, r: Array, k: int) -> tuple[Array, Array]:
    return nnx.merge(graphdef, state).top_cells(r, k)


def bucket_size(n: int) -> int:
    """The padded size of a part of n rows: n rounded up to a multiple of 2^(b - 3), b the
    bit length of n (at most 4 sizes per octave, under 25% padding)."""
    q = 1 << max(int(n).bit_length() - 3, 0)
    return -(-int(n) // q) * q


def bucketed(fn: Any, rows: np.ndarray, *arrays: Array) -> Array:
    """``fn(*(a[rows] for a in arrays))`` with ``rows`` padded to :func:`bucket_size`.

    The online stage splits a batch by confidence; padding each part (repeating its last
    row) bounds the shapes a jitted stage ever sees to a few per octave of the batch size,
    so a new mix of confident and unsure snapshots rarely compiles anything.
    """
    n = rows.size
    if n == 0:
        raise ValueError("rows must name at least one row (skip an empty part instead)")
    size = bucket_size(n)
    padded = np.concatenate([rows, np.full(size - n, rows[-1])])
    out = fn(*(a[padded] for a in arrays))
    return jax.tree.map(lambda v: v[:n], out)


class CandidateScreen(NamedTuple):
    """Output of :func:`screen_candidates` (leading batch axis B)."""

    x: Array  # (B, 3) refined best point of the screen
    narrow: Array  # (B,) bool: only the first cells were screened (confident)
    fallback: Array  # (B,) bool: the whole region was screened (unsure)
    mass: Array  # (B,) probability of the num_cells candidates (the confidence signal)


def screen_candidates(
    r: ArrayLike,
    cells: ArrayLike,
    probs: ArrayLike,
    screen: PhaseModel,
    table: CellTable,
    *,
    fallback_table: PhasorTable | None = None,
    first_cells: int | None = None,
    first_mass: float = 0.999,
    min_mass: float = 0.5,
    num_starts: int = 4,
    screen_steps: int = 4,
) -> CandidateScreen:
    """The candidate safeguard: screen each snapshot's candidate cells, in two tiers.

    A snapshot whose first ``first_cells`` candidates (default ``min(4, K)``) hold at
    least ``first_mass`` of the probability screens only those (most snapshots); one whose
    K candidates hold at least ``min_mass`` screens all K; the others (the classifier
    itself is unsure) fall back to the whole-region hierarchical screen
    (:func:`~dmimo_jax.estimators.coarse_to_fine` on ``fallback_table``). Thresholds above
    1 are never met (``min_mass > 1``: every snapshot falls back). Each part runs
    :func:`~dmimo_jax.estimators.candidate_search` under ``screen`` (``num_starts``
    Levenberg-Marquardt refinements of ``screen_steps``), padded by :func:`bucketed`.

    Args:
        r: (B, M) wrapped phases.
        cells: (B, K) candidate cells, most likely first (:func:`cell_probabilities`).
        probs: (B, K) their probabilities.
        screen: the cheap PhaseModel ``table`` was built from.
        table: :func:`~dmimo_jax.estimators.cell_table` of ``screen``.

    Raises:
        ValueError: a fallback is needed and no ``fallback_table`` was given, or bad input.
    """
    r = jnp.asarray(r)
    r = r[None, :] if r.ndim == 1 else r
    check_phases("r", r, screen.num_aps, batched=True)
    cells, p = jnp.asarray(cells), np.asarray(probs, np.float64)
    if cells.ndim != 2 or cells.shape != p.shape or cells.shape[0] != r.shape[0]:
        raise ValueError(
            f"cells and probs must both have shape ({r.shape[0]}, K), got {cells.shape} "
            f"and {p.shape}"
        )
    num_cells = cells.shape[1]
    first_cells = min(4, num_cells) if first_cells is None else first_cells
    check_int("first_cells", first_cells, minimum=1)
    if first_cells > num_cells:
        raise ValueError(f"first_cells={first_cells} must be <= the K={num_cells} candidates")
    for name, v in (("first_mass", first_mass), ("min_mass", min_mass)):
        check_scalar(name, v)
        if v < 0:
            raise ValueError(f"{name} must be a probability threshold >= 0, got {v}")
    mass = p.sum(axis=-1)
    fallback = mass < min_mass
    narrow = ~fallback & (p[:, :first_cells].sum(axis=-1) >= first_mass)
    r64 = r.astype(jnp.result_type(float))
    xs = jnp.zeros((r.shape[0], 3), r64.dtype)

    def search(k):
        return lambda ri, ci: (
            candidate_search(
                ri, screen, table, ci[:, :k], num_starts=num_starts, num_steps=screen_steps
            ).x
        )

    tiers = (
        (np.flatnonzero(narrow), first_cells),
        (np.flatnonzero(~narrow & ~fallback), num_cells),
    )
    for rows, k in tiers:
        if rows.size:
            xs = xs.at[rows].set(bucketed(search(k), rows, r64, cells))
    bad = np.flatnonzero(fallback)
    if bad.size:
        if fallback_table is None:
            raise ValueError(
                f"{bad.size} snapshots fell below min_mass={min_mass}; pass fallback_table"
            )
        found = bucketed(lambda ri: coarse_to_fine(ri, screen, fallback_table).x, bad, r64)
        xs = xs.at[bad].set(found)
    return CandidateScreen(xs, jnp.asarray(narrow), jnp.asarray(fallback), jnp.asarray(mass))


def locate_candidates(
    r: ArrayLike,
    classifier: nnx.Module,
    model: PhaseModel,
    *,
    screen: PhaseModel,
    table: CellTable,
    fallback_table: PhasorTable | None = None,
    num_cells: int = 16,
    first_cells: int | None = None,
    first_mass: float = 0.999,
    min_mass: float = 0.5,
    num_starts: int = 4,
    screen_steps: int = 4,
    fine_steps: int = 2,
) -> CandidateOnlineResult:
    """The online stage with a cell classifier: candidates -> cell screen -> refinement.

    1. :func:`cell_probabilities`: the classifier's ``num_cells`` most likely cells;
    2. :func:`screen_candidates`, the candidate safeguard in two tiers (the first
       ``first_cells`` cells when they hold ``first_mass``, all ``num_cells`` when they hold
       ``min_mass``, else the whole region from ``fallback_table``);
    3. the fine stage: ``fine_steps`` Levenberg-Marquardt steps under ``model``. With the
       tabulated GP model of eq. (27) (:class:`~dmimo_jax.gp.TabulatedGPModel` with its
       variance table, what :func:`run_offline` returns as ``screen``) as ``model`` the
       whole stage runs on tables: its estimate agrees with the exact GP model's to a few
       tens of nm on noise-free snapshots (``tests/test_candidates.py``) at a fraction of
       the cost; with the exact :class:`~dmimo_jax.gp.GPPhaseModel` the same steps
       finish exactly.

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
    check_int("num_cells", num_cells, minimum=1)
    if num_cells > own.num_cells:
        raise ValueError(f"num_cells={num_cells} exceeds the classifier's {own.num_cells} cells")
    check_int("fine_steps", fine_steps, minimum=1)
    cells, probs = cell_probabilities(classifier, r, num_cells)
    found = screen_candidates(
        r,
        cells,
        probs,
        screen,
        table,
        fallback_table=fallback_table,
        first_cells=first_cells,
        first_mass=first_mass,
        min_mass=min_mass,
        num_starts=num_starts,
        screen_steps=screen_steps,
    )
    r64 = r.astype(jnp.result_type(float))
    fine = refine_batch(found.x, r64, model, num_steps=fine_steps)
    return CandidateOnlineResult(
        cells, found.mass, found.fallback, found.narrow, found.x, fine.x, fine.cost, fine.cpo
    )
