r"""The shared quasi-periodic Gaussian-process phase model of Sec. III (tinygp).

* :mod:`~dmimo_jax.gp.kernel`: features, the eq. (22) kernel, the likelihood (eq. 23);
* :mod:`~dmimo_jax.gp.fit`: :func:`fit` maximizes eq. (23) over the hyperparameters
  with the L CPOs profiled out in closed form, and :func:`fit_blocks` one
  :math:`\psi` for many local blocks of training pairs (tiles);
* :mod:`~dmimo_jax.gp.model`: :class:`GPPhaseModel` (eqs. 25-27), a **PhaseModel** built
  from tinygp's conditioned process, and its tabulated mean :class:`TabulatedGPModel`;
* :mod:`~dmimo_jax.gp.nuts`: numpyro NUTS over the hyperparameters and
  :class:`GPMixtureModel` (beyond the paper).
"""

from dmimo_jax.gp.fit import (
    BlocksFit,
    GPFit,
    fit,
    fit_blocks,
    initial_cpos,
    initial_params,
    profile_cpos,
    profiled_cpos,
)
from dmimo_jax.gp.kernel import (
    GPParams,
    build_kernel,
    check_training_data,
    features,
    flat_features,
    kernel_factors,
    log_marginal_likelihood,
    los_noise_var,
    los_phase,
    residuals,
    training_process,
)
from dmimo_jax.gp.model import GPMeanModel, GPPhaseModel, TabulatedGPModel, interpolate, table_grids
from dmimo_jax.gp.nuts import GPMixtureModel, GPPosterior, fit_nuts

__all__ = [
    "BlocksFit",
    "GPFit",
    "GPMeanModel",
    "GPMixtureModel",
    "GPParams",
    "GPPhaseModel",
    "GPPosterior",
    "TabulatedGPModel",
    "interpolate",
    "table_grids",
    "build_kernel",
    "check_training_data",
    "features",
    "fit",
    "fit_blocks",
    "fit_nuts",
    "flat_features",
    "kernel_factors",
    "initial_cpos",
    "initial_params",
    "log_marginal_likelihood",
    "los_noise_var",
    "los_phase",
    "profile_cpos",
    "profiled_cpos",
    "residuals",
    "training_process",
]
