r"""What the calibrated physics misses, learned from the labeled snapshots (beyond the paper).

The paper's GP (Sec. III) learns the perturbation of the LoS phase with one kernel shared by
every AP, on two features of the floor's geometry. On measured data the perturbation is
whatever the physics leaves: diffuse multipath, the hardware around each antenna. It is
different for every AP and decorrelates over a fraction of a wavelength, and it is not
small against :math:`2\pi`, so it is learned here on the circle: for each AP, a GP over
the UE position on the real and imaginary parts of the residual phasor

.. math:: z_{lm} = e^{j(r_{lm} - \mu_m(\mathbf x_l) - \hat\phi_l)}, \qquad
          \hat\phi_l = \arg\sum_m e^{j(r_{lm} - \mu_m(\mathbf x_l))}

(the CPO of eq. 15 profiled out, :math:`\mu` the physical model's mean), with a constant
prior mean per AP. The posterior mean :math:`g_m(\mathbf x)` corrects the phase by
:math:`\arg g_m` and its modulus says how well the residual is known there:
:math:`|g_m| = e^{-\sigma_m^2/2}` for a wrapped-normal error, so

.. math:: \mu^{\rm field}_m(\mathbf x) = \mu_m(\mathbf x) + \arg g_m(\mathbf x), \qquad
          \sigma^{2,\rm field}_m(\mathbf x) = \sigma^2_m(\mathbf x)
          + \mathrm{clip}(-2\ln|g_m(\mathbf x)|,\ 0,\ \pi^2/3),

a PhaseModel like any other: the paper's idea (a physics prior plus a learned
perturbation) on a better prior. Kernel and conditioning are tinygp's (Matern-3/2).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike
from tinygp import GaussianProcess, kernels

from dmimo_jax._checks import check_phases, check_positions, check_scalar
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.pytree import jit_or_eager, pytree_dataclass
from dmimo_jax.scene import Scene

RESIDUAL_LENGTH_SCALE = 0.25
"""The Matern-3/2 length scale of :func:`fit_residual_field`, m, chosen on Techtile's
EXP003/EXP005 at L = 50 (docs/real_data_measurements.md)."""
RESIDUAL_NOISE = 1.0
"""The noise variance of :func:`fit_residual_field` (of a unit phasor's real or imaginary
part), chosen with :data:`RESIDUAL_LENGTH_SCALE`."""
_MAX_VARIANCE = np.pi**2 / 3  # a uniform phase: the model knows nothing there
# the noise variance of a masked-out snapshot: its weight in the posterior mean is ~1e-12
_OFF_NOISE = 1e12


def residual_phasors(model: PhaseModel, x: ArrayLike, r: ArrayLike) -> Array:
    r""":math:`z_{lm}` of the module docstring (L, M) complex: the residual phasors with each
    snapshot's CPO profiled out."""
    return _phasors(model, jnp.asarray(x), jnp.asarray(r))


def _residual_phasors(model: PhaseModel, x: Array, r: Array) -> Array:
    mean = jax.vmap(model.mean)(x)
    e = jnp.exp(1j * (r - mean))
    cpo = jnp.angle(jnp.sum(e, axis=1, keepdims=True))
    return e * jnp.exp(-1j * cpo)


def _matern(length_scale: ArrayLike) -> kernels.Kernel:
    # Euclidean distance: tinygp's default for Matern kernels is L1, which is not a positive
    # definite kernel in 2-D or 3-D (a (100 x 100) raster's matrix has eigenvalues < 0)
    return kernels.Matern32(scale=length_scale, distance=kernels.distance.L2Distance())


def _condition(model: PhaseModel, x: Array, r: Array, length_scale, noise, mask: Array):
    """(2M, L) alphas and (2M,) prior means of the per-AP residual GPs, unchecked; the
    snapshots where ``mask`` is False carry a noise of ``_OFF_NOISE`` (no weight)."""
    z = _residual_phasors(model, x, r)
    y = jnp.concatenate([z.real, z.imag], axis=1).T  # (2M, L)
    prior = jnp.sum(jnp.where(mask, y, 0.0), axis=1) / jnp.sum(mask)
    kernel = _matern(length_scale)
    diag = jnp.where(mask, noise, _OFF_NOISE)

    def alpha(col: Array, mean: Array) -> Array:
        gp = GaussianProcess(kernel, x, diag=diag, mean=mean)
        return gp.condition(col).gp.mean_function.alpha

    return jax.vmap(alpha)(y, prior), prior


# one compiled program per model and shape (not an eager dispatch per operation)
_phasors = jit_or_eager(_residual_phasors)
_conditioned = jit_or_eager(_condition)


@pytree_dataclass
class ResidualFieldModel:
    """A physical model plus the learned residual field (a PhaseModel, a pytree).

    Attributes:
        base: the physical PhaseModel (e.g. LoS with calibrated offsets).
        kernel: the tinygp kernel.
        x_train: (L, 3) labeled positions.
        alpha: (2M, L) :math:`K^{-1}(\\mathbf z - \\bar z)` per output (tinygp's conditioning):
            real parts of APs 0..M-1, then imaginary parts.
        prior: (2M,) the constant prior means.
    """

    base: Any
    kernel: Any
    x_train: Array
    alpha: Array
    prior: Array

    @property
    def scene(self) -> Scene:
        """The deployment the model describes."""
        return self.base.scene

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.base.num_aps

    def phasor(self, x: ArrayLike) -> Array:
        """The posterior mean residual phasor :math:`g_m(\\mathbf x)` (M,) complex."""
        k = self.kernel(jnp.asarray(x)[None], self.x_train)[0]  # (L,)
        out = self.prior + self.alpha @ k
        m = self.num_aps
        return out[:m] + 1j * out[m:]

    def mean(self, x: ArrayLike) -> Array:
        return self.base.mean(x) + jnp.angle(self.phasor(x))

    def variance(self, x: ArrayLike) -> Array:
        mod = jnp.abs(self.phasor(x))
        # |g| > 1 (a GP mean is not bounded to the disc) means certain: no extra variance
        extra = jnp.clip(-2.0 * jnp.log(jnp.maximum(mod, 1e-12)), 0.0, _MAX_VARIANCE)
        return self.base.variance(x) + extra


def fit_residual_field(
    model: PhaseModel,
    x: ArrayLike,
    r: ArrayLike,
    *,
    length_scale: float = RESIDUAL_LENGTH_SCALE,
    noise: float = RESIDUAL_NOISE,
    mask: ArrayLike | None = None,
) -> ResidualFieldModel:
    """Condition the per-AP residual-phasor GPs on L labeled snapshots (module docstring).

    Args:
        model: the physical PhaseModel whose residuals are learned.
        x: (L, 3) labeled positions, m.
        r: (L, M) their wrapped phases.
        length_scale: Matern-3/2 length scale, m.
        noise: the GP's noise variance (per real/imaginary part of a unit phasor).
        mask: optional (L,) bool, the snapshots to condition on; the others are carried
            with a noise variance of 1e12 (a weight of ~1e-12 in the mean), so repeated
            fits on changing subsets keep one shape and compile once.

    Raises:
        ValueError: bad shapes, non-finite values, fewer than 2 snapshots (in ``mask``),
            non-positive ``length_scale`` or ``noise``.
    """
    model = as_phase_model(model)
    check_positions("x", x, batched=True)
    check_phases("r", r, model.num_aps, batched=True)
    x, r = jnp.asarray(x), jnp.asarray(r)
    if x.shape[0] != r.shape[0] or x.shape[0] < 2:
        raise ValueError(
            f"x and r must hold the same L >= 2 labeled snapshots, got {x.shape[0]} and "
            f"{r.shape[0]}"
        )
    check_scalar("length_scale", length_scale, positive=True)
    check_scalar("noise", noise, positive=True)
    if mask is None:
        mask = np.ones(x.shape[0], bool)
    mask = np.asarray(mask)
    if mask.shape != (x.shape[0],) or mask.dtype != bool or mask.sum() < 2:
        raise ValueError(
            f"mask must be ({x.shape[0]},) bool with at least 2 True, got {mask.shape} "
            f"{mask.dtype} with {int(np.sum(mask))} True"
        )
    alpha, prior = _conditioned(model, x, r, float(length_scale), float(noise), mask)
    return ResidualFieldModel(model, _matern(length_scale), x, alpha, prior)
