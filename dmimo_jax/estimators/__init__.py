"""Position estimators: the model-based MLE (Sec. II-D) and its grid search."""

from dmimo_jax.estimators.grid import (
    CoarseToFineResult,
    EgsResult,
    Grid,
    PhasorTable,
    coarse_to_fine,
    egs,
    grid_points,
    make_grid,
    phasor_table,
    search_grid,
)
from dmimo_jax.estimators.mle import (
    RefineResult,
    compressed_residuals,
    cpo_estimate,
    ls_cost,
    ml_cost,
    refine,
    refine_batch,
    wrap_corrected_residuals,
)

__all__ = [
    "EgsResult",
    "Grid",
    "egs",
    "grid_points",
    "make_grid",
    "phasor_table",
    "PhasorTable",
    "search_grid",
    "coarse_to_fine",
    "CoarseToFineResult",
    "RefineResult",
    "compressed_residuals",
    "cpo_estimate",
    "ls_cost",
    "ml_cost",
    "refine",
    "refine_batch",
    "wrap_corrected_residuals",
]
