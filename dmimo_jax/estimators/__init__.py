"""Position estimators: the model-based MLE (Sec. II-D) and its grid search."""

from dmimo_jax.estimators.grid import EgsResult, Grid, egs, grid_points, make_grid, phase_table
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
    "phase_table",
    "RefineResult",
    "compressed_residuals",
    "cpo_estimate",
    "ls_cost",
    "ml_cost",
    "refine",
    "refine_batch",
    "wrap_corrected_residuals",
]
