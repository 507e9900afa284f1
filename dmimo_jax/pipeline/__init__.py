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

Beyond the paper, :class:`Locator` with ``kind="cells"`` replaces the regression network
by a cell classifier: its most likely cells -> the two-tier candidate screen
(:func:`cell_screen`, the whole region only when the classifier itself is unsure) ->
refinement under the tabulated GP model of eq. (27) (``Offline.screen``: mean and
variance read from tables, no kernel evaluation online) -> the cost gate.

Beyond the paper too, every step runs on **any PhaseModel**: ``run_offline(..., model=m)``
with a calibrated two-ray or room model (:func:`~dmimo_jax.calibration.calibrate`) fits no
GP and trains, screens and refines under ``m``. :class:`Locator` is the one online object
(``coarse``, ``screen``, ``fine_stage``, ``certify`` and ``__call__``: ``dj.Locator``).

Modules: :mod:`~dmimo_jax.pipeline.offline` (steps 1-4), :mod:`~dmimo_jax.pipeline.online`
(the online stages as functions), :mod:`~dmimo_jax.pipeline.locator` (the Locator, one
program), :mod:`~dmimo_jax.pipeline.stages` (its coarse stages as pytrees),
:mod:`~dmimo_jax.pipeline.cache` (where the offline work is kept and the key that names it),
:mod:`~dmimo_jax.pipeline.tiled` (a building located tile by tile: :func:`run_offline_tiled`,
:class:`TiledLocator`), :mod:`~dmimo_jax.pipeline.tiled_screen` (one screen for the rows
of every tile).
"""

from dmimo_jax.estimators.rows import bucket_size
from dmimo_jax.pipeline.batches import (
    BUCKETS,
    PROGRAM_COMPILER_OPTIONS,
    bucket_for,
    jit_cache_size,
    program_jit,
    snug_parts,
)
from dmimo_jax.pipeline.cache import (
    CACHE_ENV,
    COMPILATION_CACHE_ENV,
    cache_key,
    default_cache_dir,
    use_compilation_cache,
)
from dmimo_jax.pipeline.export import ExportedLocator, export_locator, load_locator, sharded
from dmimo_jax.pipeline.heal import HealReport
from dmimo_jax.pipeline.offline import (
    KINDS,
    Offline,
    calibrated_model,
    fit_phase_model,
    make_training_set,
    offline_folder,
    search_radius,
    stored_phase_model,
    train_cell_classifier,
    train_cell_classifiers,
    train_estimator,
)
from dmimo_jax.pipeline.online import (
    CandidateScreen,
    OnlineResult,
    cell_probabilities,
    cell_screen,
    coarse_estimate,
    locate,
)
from dmimo_jax.pipeline.rescues import LocatorResult, Status
from dmimo_jax.pipeline.settings import LocatorSettings
from dmimo_jax.pipeline.stages import CellStage, WindowScreen, WindowStage
from dmimo_jax.pipeline.tiled import (
    SHARED_SCREEN_TILES,
    TiledLocator,
    TiledResult,
    checked_ring,
    refine_on_ring,
)
from dmimo_jax.pipeline.tiled_offline import (
    TILE_CELLS,
    TILE_CLASSIFIER,
    TiledOffline,
    run_offline_tiled,
    tile_grid,
    tile_offlines,
)
from dmimo_jax.pipeline.tiled_screen import TiledCells, TiledCellTable, tile_results

# isort: split
# At the top of the package (their home is `dmimo_jax`, e.g. `dj.window_search`): kept here so the
# older paths keep working; they are not in this module's __all__.
from dmimo_jax.estimators import window_search  # noqa: F401
from dmimo_jax.learning.hi import HIEstimator  # noqa: F401
from dmimo_jax.pipeline.locator import Locator  # noqa: F401
from dmimo_jax.pipeline.offline import run_offline  # noqa: F401

__all__ = [
    "TILE_CELLS",
    "TILE_CLASSIFIER",
    "SHARED_SCREEN_TILES",
    "TiledLocator",
    "TiledOffline",
    "TiledResult",
    "refine_on_ring",
    "checked_ring",
    "run_offline_tiled",
    "tile_grid",
    "tile_offlines",
    "TiledCellTable",
    "TiledCells",
    "tile_results",
    "train_cell_classifier",
    "train_cell_classifiers",
    "offline_folder",
    "CACHE_ENV",
    "KINDS",
    "CandidateScreen",
    "CellStage",
    "WindowScreen",
    "WindowStage",
    "LocatorResult",
    "LocatorSettings",
    "ExportedLocator",
    "export_locator",
    "HealReport",
    "load_locator",
    "sharded",
    "cell_screen",
    "Offline",
    "calibrated_model",
    "OnlineResult",
    "bucket_size",
    "cache_key",
    "cell_probabilities",
    "coarse_estimate",
    "default_cache_dir",
    "BUCKETS",
    "PROGRAM_COMPILER_OPTIONS",
    "program_jit",
    "jit_cache_size",
    "bucket_for",
    "snug_parts",
    "Status",
    "use_compilation_cache",
    "COMPILATION_CACHE_ENV",
    "fit_phase_model",
    "stored_phase_model",
    "locate",
    "make_training_set",
    "search_radius",
    "train_estimator",
]
