"""The offline stage of Fig. 1: labeled snapshots -> phase model -> synthetic set -> networks.

:func:`run_offline` runs every step for the requested coarse estimators, cached on disk by a
key of everything that determines the result (:mod:`~dmimo_jax.pipeline.cache`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import warnings
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax import gp
from dmimo_jax._checks import check_int, is_concrete
from dmimo_jax.calibration import Calibration
from dmimo_jax.estimators import (
    CellTable,
    PhasorTable,
    cell_grid,
    cell_table,
    phasor_table,
    search_grid,
)
from dmimo_jax.gp.kernel import check_training_data
from dmimo_jax.learning.cells import CellClassifier
from dmimo_jax.learning.data import load_dataset, write_dataset
from dmimo_jax.learning.io import ESTIMATORS, load_model, save_model
from dmimo_jax.learning.mlp import MLPConfig
from dmimo_jax.learning.nets import jit_method
from dmimo_jax.learning.popt import POPTConfig
from dmimo_jax.learning.presets import CellsPreset, Preset, get_preset
from dmimo_jax.learning.train import TrainConfig, train, train_many
from dmimo_jax.physics import PhaseModel
from dmimo_jax.pipeline.cache import cache_key, default_cache_dir, made_folder
from dmimo_jax.pipeline.online import coarse_estimate
from dmimo_jax.scene import Scene

# ----------------------------------------------------------------------------- offline

#: the coarse estimators run_offline trains
KINDS = tuple(ESTIMATORS)
"""The coarse stages :func:`run_offline` trains: ("popt", "mlp", "hi", "cells"), declared by
the networks."""


def fit_phase_model(
    x: ArrayLike, r: ArrayLike, noise_var: ArrayLike, scene: Scene, **fit_kwargs: Any
) -> gp.GPPhaseModel:
    """Step 1: fit the shared GP on L labeled snapshots (eqs. 23-24) and condition it (eq. 25).

    ``scene`` supplies the geometry and wavelength only; its permittivity is not used.
    """
    result = gp.fit(x, r, noise_var, scene, **fit_kwargs)
    return gp.GPPhaseModel.from_fit(result, x, r, noise_var, scene)


def stored_phase_model(
    path: str | pathlib.Path,
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    **fit_kwargs: Any,
) -> gp.GPPhaseModel:
    """Step 1 once per cache folder: :func:`fit_phase_model`, its every leaf saved to ``path``
    (``.npz``); a later call loads them instead of fitting again (``fit_kwargs`` go to
    :func:`~dmimo_jax.gp.fit`).

    A refit of the same snapshots can differ in the last bits (reductions on a GPU are not
    bit-reproducible), and the synthetic set a resumed run continues must come from the
    model it started with, bit for bit (:func:`~dmimo_jax.learning.data.model_fingerprint`).

    Raises:
        ValueError: ``path`` holds leaves of another shape or dtype (another deployment).
    """
    path = pathlib.Path(path)
    if not path.is_file():
        model = fit_phase_model(x, r, noise_var, scene, **fit_kwargs)
        leaves = jax.tree_util.tree_leaves(model)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, *(np.asarray(v) for v in leaves))
        tmp.replace(path)  # atomic: a kill leaves no partial file under ``path``
        return model
    # the tree structure, shapes and dtypes of a GP conditioned on the same snapshots
    # (abstractly: no conditioning is computed)
    x, r = jnp.asarray(x), jnp.asarray(r)
    params, cpo = gp.initial_params(x, r, scene), gp.initial_cpos(x, r, scene)
    template = jax.eval_shape(
        lambda: gp.GPPhaseModel.from_data(params, cpo, x, r, noise_var, scene)
    )
    leaves, treedef = jax.tree_util.tree_flatten(template)
    with np.load(path) as f:
        stored = [f[f"arr_{i}"] for i in range(len(f.files))]
    if [(v.shape, v.dtype) for v in stored] != [(v.shape, v.dtype) for v in leaves]:
        raise ValueError(f"{path} holds another GP (leaf shapes or dtypes differ); remove it")
    return jax.tree_util.tree_unflatten(treedef, [jnp.asarray(v) for v in stored])


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
    preset: str | Preset = "cpu",
    config: TrainConfig | None = None,
    network: POPTConfig | MLPConfig | None = None,
    checkpoint_dir: str | pathlib.Path | None = None,
    seed: int = 0,
    progress: bool = True,
    on_epoch_end: Any = None,
):
    """Step 3: build and train ``kind`` in ``{"popt", "mlp", "hi", "cells"}`` on ``data``.

    ``preset`` (a name in :data:`~dmimo_jax.learning.presets.PRESETS` or a
    :class:`~dmimo_jax.learning.presets.Preset`) picks POPT's network and the loop settings;
    ``config`` / ``network`` override them. Returns the :class:`~dmimo_jax.learning.train.TrainResult`.
    """
    p = get_preset(preset)
    cls = ESTIMATORS.get(kind)
    if cls is None:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    net = cls.for_training(scene, p, network, rngs=nnx.Rngs(seed))
    if config is None or config is p.train:
        config = cls.training_config(p)
    return train(
        net,
        data,
        config,
        checkpoint_dir=checkpoint_dir,
        progress=progress,
        on_epoch_end=on_epoch_end,
    )


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

    model: PhaseModel
    """The fine stage's model: the exact GP (eq. 27), or the given model."""
    screen: PhaseModel
    """The screens' model: the GP's tables (eq. 27), or the given model."""
    table: PhasorTable
    """The phasor table of ``screen`` over the UE region (wide windows, the region screens):
    with the "cells" estimator, its cell table's (``cells.table``, a grid aligned with the
    cells at most lambda/4 apart, held once); else a lambda/4 grid of the region."""
    estimators: dict
    """kind -> coarse estimator (POPT / MLP network, HIEstimator)."""
    radii: dict
    """kind -> safeguard radius, m."""
    info: dict
    """kind -> training record (history, validation RMSE and max, radius)."""
    cache: pathlib.Path
    """The folder of this configuration."""
    cells: CellTable | None = None
    """The cell table of the "cells" estimator's screen."""


def calibrated_model(cal: Calibration) -> PhaseModel:
    """The model of a :class:`~dmimo_jax.calibration.Calibration` that the offline stage may
    build on: ``ValueError`` for a fit that did not converge (its values are no optimum), a
    loud ``UserWarning`` for a misfit (the model misses what the data show: every stage
    built on it inherits that) or overstated noise."""
    if cal.status == "not_converged":
        raise ValueError(
            "model: the calibration did not converge (Calibration.status 'not_converged'); "
            "its values are not an optimum: re-run calibrate with more max_steps"
        )
    if cal.status != "converged":
        warnings.warn(
            f"run_offline: the calibration's status is {cal.status!r} (reduced chi-square "
            f"{float(cal.reduced_chi2):.3g}): the stages built on it inherit what its model "
            "misses",
            UserWarning,
            stacklevel=3,
        )
    if cal.receivers is not None:
        raise ValueError(
            "model: this calibration fitted receivers (gains and constants of complex "
            "snapshots); the offline stage learns from phases, and its model would drop them. "
            "Train on the phases of the snapshots with the constants removed, under "
            "ReceiverModel(cal.model, cal.receivers) as the model"
        )
    return cal.model


def _check_model(model: Any, scene: Scene, num_aps: int) -> None:
    if isinstance(model, str):
        if model != "gp":
            raise ValueError(f"model must be 'gp' or a PhaseModel, got {model!r}")
        return
    missing = [a for a in ("mean", "variance", "scene", "num_aps") if not hasattr(model, a)]
    if missing:
        raise ValueError(
            f"model must be 'gp' or a PhaseModel (mean, variance, scene, num_aps), got "
            f"{type(model).__name__} (missing {', '.join(missing)})"
        )
    if model.num_aps != num_aps or scene.num_aps != num_aps:
        raise ValueError(
            f"model has {model.num_aps} APs and scene {scene.num_aps}, the snapshots r have "
            f"{num_aps} columns: they must agree"
        )
    if is_concrete(model.scene.wavelength, scene.wavelength) and not np.isclose(
        float(model.scene.wavelength), float(scene.wavelength), rtol=1e-9
    ):
        raise ValueError(
            f"model's wavelength {float(model.scene.wavelength):.6g} m differs from the scene's "
            f"{float(scene.wavelength):.6g} m: they describe different carriers"
        )
    leaves = jax.tree_util.tree_leaves(model)
    if not leaves or not all(
        isinstance(v, jax.Array | np.ndarray | float | int | complex) for v in leaves
    ):
        raise ValueError(
            f"model must be a pytree of arrays (its leaves enter the cache key), got "
            f"{type(model).__name__} with leaves of types {sorted({type(v).__name__ for v in leaves})}"
        )


def offline_folder(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    *,
    model: str | PhaseModel = "gp",
    preset: str | Preset = "cpu",
    num_samples: int | None = None,
    cache_dir: str | pathlib.Path | None = None,
    seed: int = 0,
) -> pathlib.Path:
    """The cache folder of :func:`run_offline` with these arguments (created, its
    ``config.json`` written): ``cache_dir/<key>``, the key
    (:func:`~dmimo_jax.pipeline.cache.cache_key`) of the labeled snapshots, every leaf of
    ``scene`` and ``model``, the preset, the sample count and the seed. What a caller that
    prepares part of the stage itself (the tiles' classifiers trained together,
    :func:`~dmimo_jax.pipeline.tiled_offline.run_offline_tiled`) writes into, for
    :func:`run_offline` to find."""
    p = get_preset(preset)
    if num_samples is not None:
        check_int("num_samples", num_samples, minimum=1)
    check_int("seed", seed, minimum=-(2**63))
    config = dict(
        model=model if isinstance(model, str) else type(model).__name__,
        preset=p.name,
        num_samples=p.num_samples if num_samples is None else int(num_samples),
        seed=seed,
        train=dataclasses.asdict(p.train),
        popt=dataclasses.asdict(p.popt),
    )
    x, r, noise_var = (jnp.asarray(v) for v in (x, r, noise_var))
    trees = (scene, x, r, noise_var) + (() if isinstance(model, str) else (model,))
    root = default_cache_dir() if cache_dir is None else pathlib.Path(cache_dir)
    folder = made_folder("cache_dir", root / cache_key(config, *trees))
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    return folder


def run_offline(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    *,
    model: str | PhaseModel | Calibration = "gp",
    kinds: tuple[str, ...] = ("popt",),
    preset: str | Preset = "cpu",
    num_samples: int | None = None,
    cache_dir: str | pathlib.Path | None = None,
    seed: int = 0,
    progress: bool = True,
    on_epoch_end: Any = None,
    cells: CellsPreset | None = None,
) -> Offline:
    """Steps 1-4 for the estimators ``kinds``, cached by a key of everything that determines them.

    With ``model="gp"`` (the paper) step 1 fits the shared GP on the labeled snapshots; its
    tables (:class:`~dmimo_jax.gp.TabulatedGPModel`, eq. 27) serve the screens and the cell
    classifier's synthetic set. With a PhaseModel (typically
    ``calibration.calibrate(...).model``, a calibrated two-ray or room model) no GP is
    fitted: synthesis, every network, the screens (its phasor tables over the UE region) and
    the fine stage all use that model, and the labeled snapshots only enter the cache key.

    The cache folder ``cache_dir/<key>`` (:func:`~dmimo_jax.pipeline.cache.cache_key` of the
    labeled snapshots, every leaf of ``scene`` and ``model``, the preset, the sample count and
    the seed) holds the synthetic sets and one folder per estimator with its orbax
    checkpoints and final model. A finished model is loaded instead of retrained; an
    interrupted synthesis or training resumes.

    Args:
        x: the L labeled snapshots (positions, wrapped phases, noise variances).
        r: see ``x``.
        noise_var: see ``x``.
        scene: the deployment: UE region (what the networks cover), geometry, wavelength,
            powers (with ``model="gp"``, its permittivity is not used).
        model: ``"gp"``, a PhaseModel of ``scene``'s M APs, or a
            :class:`~dmimo_jax.calibration.Calibration` (its model; refused when it did not
            converge, a loud warning when its status is not ``"converged"``).
        kinds: estimators to train, from ``{"popt", "mlp", "hi", "cells"}``.
        preset: a name in :data:`~dmimo_jax.learning.presets.PRESETS` (``"quick"``,
            ``"cpu"``, ``"paper"``) or a :class:`~dmimo_jax.learning.presets.Preset` of your
            own (its name, network, loop and sample count enter the cache key).
        num_samples: synthetic set size (default: the preset's).
        cache_dir: root of the cache (default :func:`~dmimo_jax.pipeline.cache.default_cache_dir`).
        seed: seeds the synthetic set and the initializations.
        progress: tqdm bars (in a terminal; quiet when stderr is not one).
        on_epoch_end: passed to :func:`~dmimo_jax.learning.train` (e.g. to stop at an
            epoch boundary when a time budget is spent; the next call resumes).
        cells: the cell classifier's settings (default: the preset's ``cells``).

    Raises:
        ValueError: an unknown kind, a model that is neither ``"gp"`` nor a PhaseModel of the
            same M, bad labeled snapshots.
    """
    p = get_preset(preset)
    if isinstance(model, Calibration):
        model = calibrated_model(model)
    if isinstance(kinds, str):
        raise ValueError(f"kinds must be a tuple of names, ({kinds!r},), got the text {kinds!r}")
    if cells is not None and not isinstance(cells, CellsPreset):
        raise ValueError(f"cells must be a CellsPreset or None, got {type(cells).__name__}")
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"kinds must be from {KINDS}, got {kind!r}")
    check_training_data(x, r, noise_var, scene.num_aps)
    _check_model(model, scene, np.shape(r)[1])
    num = p.num_samples if num_samples is None else num_samples  # offline_folder checks it
    x, r, noise_var = (jnp.asarray(v) for v in (x, r, noise_var))
    folder = offline_folder(x, r, noise_var, scene, model=model, preset=p, num_samples=num,
                            cache_dir=cache_dir, seed=seed)  # fmt: skip
    if isinstance(model, str):
        fine = stored_phase_model(folder / "gp.npz", x, r, noise_var, scene)
        screen = gp.TabulatedGPModel.from_model(fine)
        cell_data_model = screen.without_variance()  # the GP mean + the LoS phase noise
    else:
        fine = screen = cell_data_model = model
    estimators, radii, info = {}, {}, {}
    cells_table = None
    if "cells" in kinds:
        settings = p.cells if cells is None else cells
        net, meta, cells_table = _offline_cells(
            folder, cell_data_model, screen, scene, settings, seed, progress, on_epoch_end
        )
        estimators["cells"], radii["cells"], info["cells"] = net, float(meta["radius"]), meta
        table = cells_table.table  # the region screens read the cells' table: one copy
    else:
        table = phasor_table(screen, search_grid(scene, float(scene.wavelength) / 4, region="ue"))
    if not [k for k in kinds if k != "cells"]:
        return Offline(fine, screen, table, estimators, radii, info, folder, cells_table)
    data = make_training_set(folder / "data", jax.random.key(seed), fine, num, progress=progress)
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
                preset=p,
                checkpoint_dir=folder / kind / "ckpt",
                seed=seed,
                progress=progress,
                on_epoch_end=on_epoch_end,
            )
            net = res.model
            meta = dict(history=res.history)
            est = ESTIMATORS[kind].as_estimator(net, scene)
            xv, rv = np.asarray(data.x[val]), np.asarray(data.r[val])
            err = np.linalg.norm(np.asarray(coarse_estimate(est, rv)) - xv, axis=-1)
            meta.update(
                radius=search_radius(est, rv, xv),
                val_rmse_m=float(np.sqrt(np.mean(err**2))),
                val_max_m=float(err.max()),
            )
            save_model(out, net, meta=meta)
        estimators[kind] = ESTIMATORS[kind].as_estimator(net, scene)
        radii[kind] = float(meta["radius"])
        info[kind] = meta
    return Offline(fine, screen, table, estimators, radii, info, folder, cells_table)


def _offline_cells(folder, data_model, screen, scene, c, seed, progress, on_epoch_end):
    """The cell classifier of settings ``c`` (:func:`train_cell_classifier` over the UE
    region's cells) and the cell table of ``screen``."""
    cells = cell_grid(scene, c.cell_size)
    net, meta = train_cell_classifier(
        folder, data_model, cells, c, seed=seed, progress=progress, on_epoch_end=on_epoch_end
    )
    table = cell_table(screen, cells)  # float64 corners; the region's table as well
    return net, meta, table


def _cells_folder(
    folder: Any, model: PhaseModel, cells: Any, settings: CellsPreset
) -> pathlib.Path:
    """``folder/cells-<hash of settings and cells>`` (created, its config written)."""
    record = dataclasses.asdict(settings)
    if cells.shape != cell_grid(model.scene, settings.cell_size).shape or not np.allclose(
        np.asarray(cells.low), np.asarray(model.scene.ue_low)
    ):  # a grid of its own (e.g. the tiles of a building): part of the key
        record["cells"] = dict(
            low=np.asarray(cells.low, float).tolist(), size=cells.cell_size, shape=cells.shape
        )
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:10]
    sub = pathlib.Path(folder) / f"cells-{digest}"
    sub.mkdir(parents=True, exist_ok=True)
    (sub / "config.json").write_text(json.dumps(record, indent=1))
    return sub


def _cells_data(sub: pathlib.Path, model: PhaseModel, settings: CellsPreset, seed: int, progress):
    # the classifier needs about a million samples: for the GP, its tabulated mean
    # synthesizes ~100x faster than the exact GP (same mean to ~1e-5 rad)
    key = jax.random.key(seed + 1)
    return make_training_set(
        sub / "data", key, model, settings.num_samples, chunk_size=65536, progress=progress
    )


def _save_cells(sub: pathlib.Path, net: CellClassifier, history: list, data: Any, c: CellsPreset):
    """The trained ``net``'s record (its validation top-K miss on ``data``'s held-out
    samples), saved to ``sub/model``: ``(net, meta)``."""
    n_val = max(1, int(round(c.train.val_fraction * c.num_samples)))
    xv = np.asarray(data.x[c.num_samples - n_val :])
    rv = np.asarray(data.r[c.num_samples - n_val :])
    miss = np.asarray(jit_method(net, "error", rv, xv))
    meta = dict(history=history, val_top_k_miss=float(miss.mean()), radius=c.cell_size)
    save_model(sub / "model", net, meta=meta)
    return net, meta


def train_cell_classifier(
    folder: str | pathlib.Path,
    model: PhaseModel,
    cells: Any,
    settings: CellsPreset,
    *,
    seed: int = 0,
    progress: bool = True,
    on_epoch_end: Any = None,
) -> tuple[CellClassifier, dict]:
    """A :class:`~dmimo_jax.learning.CellClassifier` over the partition ``cells`` (a
    :class:`~dmimo_jax.estimators.CellGrid`) of ``model``'s phases, trained on its own
    synthetic set of ``settings.num_samples`` snapshots of ``model`` (eq. 26: positions
    uniform in ``model.scene``'s UE region, random CPOs, the model's phase noise), cached
    under ``folder/cells-<hash of settings and cells>``: a finished network is loaded, an
    interrupted synthesis or training resumes.

    Returns:
        ``(network, meta)``: ``meta`` holds the training history, the validation top-K miss
        rate (``val_top_k_miss``) and ``radius`` (the cell size).
    """
    sub = _cells_folder(folder, model, cells, settings)
    if (sub / "model" / "spec.json").is_file():
        return load_model(sub / "model")
    data = _cells_data(sub, model, settings, seed, progress)
    net = CellClassifier(model.num_aps, settings.network, cells=cells, rngs=nnx.Rngs(seed))
    res = train(
        net,
        data,
        settings.train,
        checkpoint_dir=sub / "ckpt",
        progress=progress,
        on_epoch_end=on_epoch_end,
    )
    return _save_cells(sub, res.model, res.history, data, settings)


def train_cell_classifiers(
    folders: Sequence[str | pathlib.Path],
    models: Sequence[PhaseModel],
    cells: Sequence[Any],
    settings: CellsPreset,
    *,
    seed: int = 0,
    devices: list | None = None,
    progress: bool = True,
) -> list[tuple[CellClassifier, dict]]:
    """:func:`train_cell_classifier` of each ``(folders[i], models[i], cells[i])`` (the same
    folders, synthetic sets and files: a later :func:`train_cell_classifier` or
    :func:`run_offline` loads what this one trained), with the networks not yet finished
    trained **together** by :func:`~dmimo_jax.learning.train_many`: one vmapped program, the
    networks sharded over ``devices``. The models must have one number of APs and the cell
    grids one shape and cell size (the tiles of a building,
    :func:`~dmimo_jax.pipeline.tiled_offline.run_offline_tiled`).

    A network's labels are the index of a position's cell, which moves with the grid: every
    network trains in the first pending grid's frame (its positions moved by the offset
    between the grids, so the networks share one graph) and then takes its own grid's
    corner. Each ends where :func:`train_cell_classifier` would, to float32 rounding.

    Returns:
        ``(network, meta)`` per entry, in order.

    Raises:
        ValueError: sequences of different lengths, models of different numbers of APs or
            grids of different shapes or cell sizes.
    """
    folders, models, cells = list(folders), list(models), list(cells)
    if not (len(folders) == len(models) == len(cells)):
        raise ValueError(
            f"folders, models and cells must have one length, got {len(folders)}, "
            f"{len(models)} and {len(cells)}"
        )
    subs = [
        _cells_folder(f, m, c, settings) for f, m, c in zip(folders, models, cells, strict=True)
    ]
    todo = [i for i, sub in enumerate(subs) if not (sub / "model" / "spec.json").is_file()]
    if todo:
        first = cells[todo[0]]
        for i in todo:
            if models[i].num_aps != models[todo[0]].num_aps:
                raise ValueError(
                    f"models must have one number of APs: models[{i}] has {models[i].num_aps}, "
                    f"models[{todo[0]}] {models[todo[0]].num_aps}"
                )
            if cells[i].shape != first.shape or cells[i].cell_size != first.cell_size:
                raise ValueError(
                    f"cells must have one shape and cell size: cells[{i}] is {cells[i].shape} "
                    f"of {cells[i].cell_size} m, cells[{todo[0]}] {first.shape} of "
                    f"{first.cell_size} m"
                )
        datas = [_cells_data(subs[i], models[i], settings, seed, progress) for i in todo]
        moved = [
            SimpleNamespace(x=np.asarray(d.x) + np.asarray(first.low - cells[i].low), r=d.r)
            for d, i in zip(datas, todo, strict=True)
        ]
        nets = [
            CellClassifier(models[i].num_aps, settings.network, cells=first, rngs=nnx.Rngs(seed))
            for i in todo
        ]
        # one checkpoint of the pending networks together (a killed run resumes the group)
        names = ",".join(str(subs[i].resolve()) for i in todo)
        group = hashlib.sha256(names.encode()).hexdigest()[:10]
        results = train_many(nets, moved, settings.train, devices=devices, progress=progress,
                             checkpoint_dir=subs[todo[0]] / f"ckpt-together-{group}")  # fmt: skip
        for i, data, res in zip(todo, datas, results, strict=True):
            res.model.cell_low = tuple(float(v) for v in np.asarray(cells[i].low))
            _save_cells(subs[i], res.model, res.history, data, settings)
    return [load_model(sub / "model") for sub in subs]
