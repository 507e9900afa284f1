r"""Fisher information and the position error bound, eqs. (10)-(14) and the Appendix.

Route of Sec. II-C: channel FIM :math:`\mathbf{J}(\boldsymbol\eta)` over
:math:`\boldsymbol\eta = [\phi, \boldsymbol\alpha^\top, \boldsymbol\theta^\top]^\top`
(eq. 10, by autodiff of the noise-free signal) :math:`\to` EFIM of the phases by Schur
complement (eq. 13a), equal to the closed form (eq. 13b) :math:`\to` position FIM
:math:`\mathbf{J}(\mathbf{x}) = \mathbf{H}^\top\mathbf{J}(\boldsymbol\theta)\mathbf{H}`
(eq. 14) with :math:`\mathbf{H} = \partial\boldsymbol\theta/\partial\mathbf{x}` from
``jax.jacfwd`` :math:`\to` :math:`\mathrm{PEB} = \sqrt{\mathrm{tr}\,\mathbf{J}(\mathbf{x})^{-1}}`.

Since :math:`1/\sigma_m^2 = 2P\alpha_m^2/\sigma_w^2` (eq. 9), eq. (13b) is
:math:`\mathrm{diag}(\mathbf{w}) - \mathbf{w}\mathbf{w}^\top / \sum_m w_m` with
:math:`w_m = 1/\sigma_m^2`, which needs only a PhaseModel's mean and variance: the
position FIM and PEB therefore accept any PhaseModel (a Scene means its two-ray model).

All position functions take one position (3,); :func:`peb_map` evaluates many.

* :mod:`~dmimo_jax.bounds.information`: the FIM and the PEB of all APs (and of complex
  snapshots);
* :mod:`~dmimo_jax.bounds.integrity`: the PEB of a subset of the APs, the protection level,
  the chance that noise alone fits with APs left out.
"""

from dmimo_jax.bounds.information import (
    channel_fim,
    check_position,
    complex_fim,
    complex_peb,
    efim,
    efim_from_variance,
    efim_schur,
    fim_from_jacobian,
    information_floor,
    jacobian_analytic,
    linearize,
    peb_from_fim,
    phase_jacobian,
)
from dmimo_jax.bounds.integrity import (
    move_statistic_unchecked,
    noise_fit_probability,
    position_chi2_quantile,
    protection_level,
    protection_level_unchecked,
    subset_fim_unchecked,
    subset_peb,
    subset_peb_unchecked,
)

# isort: split
# At the top of the package (their home is `dmimo_jax`, e.g. `dj.peb`): kept here so the
# older paths keep working; they are not in this module's __all__.
from dmimo_jax.bounds.information import peb, peb_map, position_fim  # noqa: F401

__all__ = [
    "channel_fim",
    "check_position",
    "efim_schur",
    "efim",
    "efim_from_variance",
    "fim_from_jacobian",
    "information_floor",
    "complex_fim",
    "complex_peb",
    "phase_jacobian",
    "jacobian_analytic",
    "linearize",
    "move_statistic_unchecked",
    "noise_fit_probability",
    "peb_from_fim",
    "position_chi2_quantile",
    "protection_level",
    "protection_level_unchecked",
    "subset_fim_unchecked",
    "subset_peb",
    "subset_peb_unchecked",
]
