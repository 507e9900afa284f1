"""The offline stage of a building located tile by tile (:mod:`dmimo_jax.pipeline.tiled`):
every tile's :func:`~dmimo_jax.pipeline.run_offline` on its K APs and the tile classifier
over all M APs (:func:`run_offline_tiled`; the tiles' stages alone, for any tiles,
:func:`tile_offlines`), the tiles as a classifier's cell grid (:func:`tile_grid`).
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from dmimo_jax._checks import check_int
from dmimo_jax.estimators import CellGrid, cell_grid
from dmimo_jax.gp.kernel import check_training_data
from dmimo_jax.learning.cells import CellClassifier, CellConfig
from dmimo_jax.learning.presets import CellsPreset, Preset
from dmimo_jax.learning.train import TrainConfig
from dmimo_jax.physics import PhaseModel, TwoRayModel
from dmimo_jax.pipeline.cache import cache_key, default_cache_dir
from dmimo_jax.pipeline.offline import (
    Offline,
    offline_folder,
    run_offline,
    train_cell_classifier,
    train_cell_classifiers,
)
from dmimo_jax.scene import Scene
from dmimo_jax.tiles import TileModels, Tiling, tile_scene

TILE_CELLS = CellsPreset(
    CellConfig(),
    TrainConfig(epochs=2, batch_size=1024, peak_lr=1e-3, pct_start=0.05, val_fraction=0.01),
    600_000,
)
"""The tiles' cell classifiers' default settings (:func:`run_offline_tiled`,
:func:`tile_offlines`): 1024 x 3 GELU, 600,000 samples, 2 epochs, the settings every hall
and floor of docs/locality_measurements.md was measured with (the ``"quick"`` preset's until
its classifier was narrowed for the single room)."""

TILE_CLASSIFIER = dataclasses.replace(
    TILE_CELLS,
    network=CellConfig(top_k=2),
    train=dataclasses.replace(TILE_CELLS.train, epochs=4),
)
"""The tile classifier's default settings (:func:`run_offline_tiled`): :data:`TILE_CELLS`'
network and samples trained 4 epochs, its validation error the top-2 miss. It ranks the
UE's own tile first for more rows than with 2 epochs, so fewer go on to a later tile (why
this size and training: docs/locality_measurements.md, "The tile classifier's training")."""


def tile_grid(tiling: Tiling) -> tuple[CellGrid, np.ndarray]:
    """The tiles of ``tiling`` as a :class:`~dmimo_jax.estimators.CellGrid` (one layer of
    square cells, the tiles' edge) and the map from its flat cell index to the tile index
    (``(grid, tile_of)``; :func:`~dmimo_jax.tiles.tile_boxes` numbers tiles row by row, the
    grid in C order).

    Raises:
        ValueError: ``tiling`` not a :class:`~dmimo_jax.tiles.Tiling`, or tiles that are not
            squares of one size on a regular grid.
    """
    if not isinstance(tiling, Tiling):
        raise ValueError(f"tiling must be tile_aps' Tiling, got {type(tiling).__name__}")
    low, high = np.asarray(tiling.low, float), np.asarray(tiling.high, float)
    edge = high[:, :2] - low[:, :2]
    size = float(edge[0, 0])
    if not np.allclose(edge, size, rtol=1e-9, atol=1e-12):
        raise ValueError(
            f"tiling: the tile classifier needs square tiles of one size, got edges from "
            f"{edge.min():.6g} to {edge.max():.6g} m (tile a square region, or choose a size "
            "that divides both sides equally)"
        )
    origin = low.min(axis=0)
    ij = np.rint((low[:, :2] - origin[:2]) / size).astype(int)
    shape = (int(ij[:, 0].max()) + 1, int(ij[:, 1].max()) + 1, 1)
    if shape[0] * shape[1] != tiling.num_tiles:
        raise ValueError(f"tiling: {tiling.num_tiles} tiles do not form a {shape[:2]} grid")
    tile_of = np.empty(tiling.num_tiles, int)
    tile_of[ij[:, 0] * shape[1] + ij[:, 1]] = np.arange(tiling.num_tiles)
    return CellGrid(jnp.asarray(origin), size, shape), tile_of


class TiledOffline(NamedTuple):
    """Output of :func:`run_offline_tiled`."""

    tiling: Tiling
    """The tiles and their APs."""
    tiles: tuple[Offline, ...]
    """Each tile's :func:`~dmimo_jax.pipeline.run_offline` (its K APs, its box)."""
    classifier: CellClassifier
    """The tile classifier over all M APs (its cells: :func:`tile_grid`)."""
    tile_of: np.ndarray
    """(T,) the tile of each of the classifier's cells."""
    info: dict
    """The tile classifier's training record (``val_top_k_miss``: the share of validation
    snapshots whose tile is not among its ``top_k``)."""


def run_offline_tiled(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    tiling: Tiling,
    models: TileModels,
    *,
    whole_model: PhaseModel | None = None,
    preset: str | Preset = "quick",
    cells: CellsPreset | None = None,
    classifier: CellsPreset = TILE_CLASSIFIER,
    cache_dir: str | pathlib.Path | None = None,
    seed: int = 0,
    together: int | None = None,
    devices: list | None = None,
    progress: bool = True,
) -> TiledOffline:
    """The offline stage of a tiled building (:mod:`~dmimo_jax.pipeline.tiled`'s docstring).

    Tile t's stage is :func:`~dmimo_jax.pipeline.run_offline` (``kinds=("cells",)``) on its
    scene, under its GP model ``models.tile(t)``, its labels those it was conditioned on
    (``models.labels[t]``, their phases at its APs). The tile classifier
    (:func:`~dmimo_jax.pipeline.train_cell_classifier` over :func:`tile_grid`) learns from
    ``whole_model``'s snapshots. Everything is cached under ``cache_dir`` by what determines
    it: a second call loads, an interrupted one resumes.

    Args:
        x: the L labeled positions (L, 3), m.
        r: their wrapped phases at all M APs (L, M).
        noise_var: their phase-noise variances (L, M).
        scene: the building.
        tiling: :func:`~dmimo_jax.tiles.tile_aps` of ``scene`` (square tiles).
        models: :func:`~dmimo_jax.tiles.fit_tiles` of these labels and ``tiling``.
        whole_model: the tile classifier's model of all M APs (default: ``scene``'s
            two-ray model).
        preset: the tiles' :func:`~dmimo_jax.pipeline.run_offline` preset (part of their
            cache key; their classifiers' settings are ``cells``).
        cells: the tiles' cell classifier settings (default: :data:`TILE_CELLS`).
        classifier: the tile classifier's settings (:data:`TILE_CLASSIFIER`).
        cache_dir: root of the cache.
        seed: seeds the synthetic sets and initializations.
        together: the tiles' cell classifiers train this many at a time as one program
            (:func:`~dmimo_jax.pipeline.train_cell_classifiers`: sharded over ``devices``,
            vmapped on an accelerator); 1: one after another
            (:func:`~dmimo_jax.pipeline.train_cell_classifier`). Default: 16 on an
            accelerator, 1 on a CPU (where one after another is as fast or faster:
            docs/locality_measurements.md).
        devices: the devices the tiles' classifiers are sharded over (default: all).
        progress: tqdm bars.

    Raises:
        ValueError: bad labeled snapshots, a tiling or models of another scene, tiles that
            are not squares of one size, ``together`` below 1.
    """
    together = _checked_tiles(x, r, noise_var, scene, tiling, models, together, devices)
    grid, tile_of = tile_grid(tiling)
    # the tile classifier first: its synthetic set is freed before the tiles' tables are held
    whole = TwoRayModel(scene) if whole_model is None else whole_model
    if whole.num_aps != scene.num_aps:
        raise ValueError(f"whole_model has {whole.num_aps} APs, the scene {scene.num_aps}")
    root = default_cache_dir() if cache_dir is None else pathlib.Path(cache_dir)
    folder = root / cache_key(dict(tile_classifier=type(whole).__name__, seed=seed), whole)
    net, meta = train_cell_classifier(folder, whole, grid, classifier, seed=seed, progress=progress)
    offlines = tile_offlines(x, r, noise_var, scene, tiling, models, preset=preset, cells=cells,
                             cache_dir=cache_dir, seed=seed, together=together, devices=devices,
                             progress=progress)  # fmt: skip
    return TiledOffline(tiling, offlines, net, tile_of, meta)


def _checked_tiles(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    tiling: Tiling,
    models: TileModels,
    together: int | None,
    devices: list | None,
) -> int:
    """The offline stages' arguments checked (``ValueError``); ``together`` resolved."""
    if together is None:
        together = 1 if (devices or jax.devices())[0].platform == "cpu" else 16
    check_int("together", together, minimum=1)
    check_training_data(x, r, noise_var, scene.num_aps)
    if not isinstance(tiling, Tiling) or int(tiling.aps.max()) >= scene.num_aps:
        raise ValueError("tiling must be tile_aps' Tiling of this scene")
    if not isinstance(models, TileModels) or models.labels.shape[0] != tiling.num_tiles:
        raise ValueError(f"models must be fit_tiles' TileModels of these {tiling.num_tiles} tiles")
    return together


def tile_offlines(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    tiling: Tiling,
    models: TileModels,
    *,
    preset: str | Preset = "quick",
    cells: CellsPreset | None = None,
    cache_dir: str | pathlib.Path | None = None,
    seed: int = 0,
    together: int | None = None,
    devices: list | None = None,
    progress: bool = True,
) -> tuple[Offline, ...]:
    """Every tile's offline stage (:func:`run_offline_tiled` without the tile classifier):
    tile t's :func:`~dmimo_jax.pipeline.run_offline` (``kinds=("cells",)``) on its scene
    under ``models.tile(t)``, its labels those the model was conditioned on. Any tiles of
    one size and K (a sample of a building's, ``Tiling`` rows and their ``fit_tiles``), so a
    floor too large to run whole is measured on some of its tiles. Arguments: see
    :func:`run_offline_tiled`.

    Raises:
        ValueError: bad labeled snapshots, a tiling or models of another scene, ``together``
            below 1.
    """
    together = _checked_tiles(x, r, noise_var, scene, tiling, models, together, devices)
    x, r, noise_var = (np.asarray(v, float) for v in (x, r, noise_var))

    def tile_args(t: int) -> tuple:
        rows, aps = models.labels[t], tiling.aps[t]
        pick = np.ix_(rows, aps)
        return x[rows], r[pick], noise_var[pick], tile_scene(scene, tiling, t)

    settings = TILE_CELLS if cells is None else cells
    # the tiles' classifiers first, ``together`` at a time, into the folders run_offline reads
    groups = range(0, tiling.num_tiles, together) if together > 1 else ()
    for start in groups:
        group = range(start, min(start + together, tiling.num_tiles))
        args, tile_models = [tile_args(t) for t in group], [models.tile(t) for t in group]
        folders = [offline_folder(*a, model=mt, preset=preset, cache_dir=cache_dir, seed=seed)
                   for a, mt in zip(args, tile_models, strict=True)]  # fmt: skip
        grids = [cell_grid(a[3], settings.cell_size) for a in args]
        train_cell_classifiers(folders, tile_models, grids, settings, seed=seed,
                               devices=devices, progress=progress)  # fmt: skip
    steps = range(tiling.num_tiles)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="tiles' offline stages", unit="tile")
    # each tile's classifier trained above is loaded from its folder
    return tuple(
        run_offline(*tile_args(t), model=models.tile(t), kinds=("cells",), preset=preset,
                    cells=settings, cache_dir=cache_dir, seed=seed, progress=progress)
        for t in steps
    )  # fmt: skip
