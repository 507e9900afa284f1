"""Position estimators: the model-based MLE (Sec. II-D)."""

from dmimo_jax.estimators.mle import (
    RefineResult,
    cpo_estimate,
    ls_cost,
    ml_cost,
    refine,
    refine_batch,
    wrap_corrected_residuals,
)

__all__ = [
    "RefineResult",
    "cpo_estimate",
    "ls_cost",
    "ml_cost",
    "refine",
    "refine_batch",
    "wrap_corrected_residuals",
]
