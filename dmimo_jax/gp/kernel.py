r"""The shared GP of Sec. III: features, the quasi-periodic kernel (eq. 22), likelihood (eq. 23).

The measured phase of AP m at UE location i is modelled as (eq. 19)

.. math:: r_{m,i} = \mathrm{wrap}(2\pi d^{(1)}_{m,i}/\lambda + \phi_i + g(\mathbf s_q) + n_{m,i}),

with one zero-mean GP :math:`g` shared by all APs, whose inputs are the features
:math:`\Delta d = d^{(2)} - d^{(1)}` and the incidence angle :math:`\gamma` (Sec. III-A),
and the quasi-periodic kernel of eq. (22):

.. math:: k = \sigma_f^2\,k_{pe}(\Delta d\mid\ell_1^2)\,k_{se}(\Delta d\mid\ell_2^2)\,k_{se}(\gamma\mid\ell_3^2).

Neither :math:`\varepsilon_r` nor the polarization is used: only the geometry (AP
positions, the ground plane z = 0) and the wavelength.

Shapes: training positions ``x`` (L, 3), phases ``r`` (L, M), noise variances (L, M).
Observations are flattened UE-major, ``q = i M + m`` as in the paper.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import tinygp
from jax import Array
from jax.typing import ArrayLike
from tinygp import kernels, transforms

from dmimo_jax._checks import check_finite, check_positions, is_concrete
from dmimo_jax.antenna import is_isotropic
from dmimo_jax.phase import wrap
from dmimo_jax.physics import geometry, noise_var_from_amplitude, path_gains, safe_norm
from dmimo_jax.scene import Scene


class GPParams(NamedTuple):
    r"""Hyperparameters :math:`\psi = [\sigma_f^2, \ell_1^2, \ell_2^2, \ell_3^2]` in log space."""

    log_sigma_f2: Array
    """Magnitude, rad^2."""
    log_ell1_sq: Array
    """Periodic length-scale (dimensionless, in sin^2 units)."""
    log_ell2_sq: Array
    """Quasi-periodic decay along Delta d, m^2."""
    log_ell3_sq: Array
    """Decay along the incidence angle, rad^2."""

    @classmethod
    def from_natural(cls, sigma_f2, ell1_sq, ell2_sq, ell3_sq) -> GPParams:
        return cls(*(jnp.log(jnp.asarray(v, float)) for v in (sigma_f2, ell1_sq, ell2_sq, ell3_sq)))

    def natural(self) -> dict[str, float]:
        """The four hyperparameters as plain floats (for reports)."""
        names = ("sigma_f2", "ell1_sq", "ell2_sq", "ell3_sq")
        return {n: float(jnp.exp(v)) for n, v in zip(names, self, strict=True)}


def features(x: ArrayLike, scene: Scene) -> Array:
    r"""GP inputs :math:`[\Delta d_m, \gamma_m]` (M, 2) for one UE position ``x`` (3,).

    :math:`\Delta d = d^{(2)} - d^{(1)}` (m, computed as :math:`4 z z_m/(d^{(1)}+d^{(2)})`
    without cancellation) and :math:`\gamma = \arccos((z + z_m)/d^{(2)})` (rad), evaluated
    as ``atan2(horizontal distance, z + z_m)`` so that its gradient stays finite straight
    below an AP.
    """
    check_positions("x", x, batched=False)
    x = jnp.asarray(x, scene.ap_positions.dtype)
    geo = geometry(x, scene)
    ap = scene.ap_positions
    horizontal = safe_norm(ap[:, :2] - x[None, :2])
    gamma = jnp.arctan2(horizontal, x[2] + ap[:, 2])
    return jnp.stack([geo.path_difference, gamma], axis=-1)


def los_phase(x: ArrayLike, scene: Scene) -> Array:
    r"""LoS carrier phase :math:`2\pi d^{(1)}_m/\lambda + \delta_m` (M,), unwrapped, with the
    APs' known static phase offsets :math:`\delta_m` (``scene.ap_phase_offsets``, zero in the
    paper), so the GP learns the perturbation of eq. (20) alone."""
    return 2 * jnp.pi / scene.wavelength * geometry(x, scene).d1 + scene.ap_phase_offsets


def los_noise_var(x: ArrayLike, scene: Scene) -> Array:
    r"""Phase-noise variance of eq. (9) with the LoS amplitude :math:`\lambda/(4\pi d^{(1)})` (M,).

    What a model that does not know :math:`\varepsilon_r` can say about the noise at a new
    position (the reflection changes the true amplitude by a factor :math:`|1+\rho|`).
    """
    gain = 1.0 if is_isotropic(scene.antenna) else path_gains(x, scene)[:, 0]
    alpha = gain * scene.wavelength / (4 * jnp.pi * geometry(x, scene).d1)
    return noise_var_from_amplitude(alpha, scene)


def kernel_factors(
    params: GPParams, wavelength: ArrayLike
) -> tuple[kernels.Kernel, kernels.Kernel]:
    r"""The two factors of the separable kernel of eq. (22), tinygp kernels on scalar inputs:
    :math:`k(\mathbf s, \mathbf s') = k_{\Delta d}(\Delta d, \Delta d')\,k_\gamma(\gamma, \gamma')`
    with :math:`k_{\Delta d} = \sigma_f^2 k_{pe}(\cdot\mid\ell_1^2) k_{se}(\cdot\mid\ell_2^2)`
    and :math:`k_\gamma = k_{se}(\cdot\mid\ell_3^2)`.

    On a grid of features (every :math:`\Delta d` with every :math:`\gamma`) a
    cross-covariance with the training inputs is an outer product of the two factors'
    cross-covariances, so eq. (25a) over the grid is a matrix product
    (:meth:`~dmimo_jax.gp.TabulatedGPModel.from_model`).
    """
    sigma_f2, ell1_sq, ell2_sq, ell3_sq = (jnp.exp(p) for p in params)
    k_pe = kernels.ExpSineSquared(scale=wavelength, gamma=2.0 / ell1_sq)
    k_se_dd = kernels.ExpSquared(scale=jnp.sqrt(ell2_sq))
    k_se_gamma = kernels.ExpSquared(scale=jnp.sqrt(ell3_sq))
    return sigma_f2 * k_pe * k_se_dd, k_se_gamma


def build_kernel(params: GPParams, wavelength: ArrayLike) -> kernels.Kernel:
    r"""The quasi-periodic product kernel of eq. (22) on inputs ``[Delta d, gamma]``.

    :math:`k_{pe}(\Delta d\mid\ell_1^2) = \exp(-\tfrac{2}{\ell_1^2}\sin^2(\pi(\Delta d - \Delta d')/\lambda))`
    is tinygp's ``ExpSineSquared(scale=lambda, gamma=2/ell1^2)``; :math:`k_{se}(\cdot\mid\ell^2)`
    is ``ExpSquared(scale=ell)``; ``Subspace`` picks the feature each factor of
    :func:`kernel_factors` sees.
    """
    k_dd, k_gamma = kernel_factors(params, wavelength)
    return transforms.Subspace(0, k_dd) * transforms.Subspace(1, k_gamma)


@jax.jit  # one program per shape outside jit; inlined inside a jitted caller
def residuals(x: ArrayLike, r: ArrayLike, cpo: ArrayLike, scene: Scene) -> Array:
    r""":math:`\upsilon_{m,i} = \mathrm{wrap}(r_{m,i} - 2\pi d^{(1)}_{m,i}/\lambda - \phi_i)`, eq. (24a), (L, M)."""
    los = jax.vmap(los_phase, in_axes=(0, None))(x, scene)
    return wrap(jnp.asarray(r) - los - jnp.asarray(cpo)[:, None])


@jax.jit  # one program per shape outside jit; inlined inside a jitted caller
def flat_features(x: ArrayLike, scene: Scene) -> Array:
    """Features of L positions (L, 3) flattened UE-major: (L M, 2), row q = i M + m."""
    return jax.vmap(features, in_axes=(0, None))(x, scene).reshape(-1, 2)


def training_process(
    params: GPParams, x: ArrayLike, noise_var: ArrayLike, scene: Scene
) -> tinygp.GaussianProcess:
    """The tinygp process over the L M training observations, noise variances on the diagonal (eq. 24b)."""
    x, noise_var = jnp.asarray(x), jnp.asarray(noise_var)
    kernel = build_kernel(params, scene.wavelength)
    return tinygp.GaussianProcess(kernel, flat_features(x, scene), diag=noise_var.reshape(-1))


def log_marginal_likelihood(
    params: GPParams, cpo: ArrayLike, x: ArrayLike, r: ArrayLike, noise_var: ArrayLike, scene: Scene
) -> Array:
    r"""Log marginal likelihood :math:`\mathcal L_{\mathbf r} = \log p(\mathbf r\mid\phi,\psi)`, eq. (23).

    :math:`\mathbf K_{\mathbf r} = k(\mathbf s_q, \mathbf s_{q'}) + \delta_{qq'}\sigma^2_{m,i}`
    (eq. 24b) with the known per-observation noise on the diagonal. Differentiable in
    ``params`` and ``cpo`` (the gradients of eqs. 23b-c come from autodiff).
    """
    gp = training_process(params, x, noise_var, scene)
    return gp.log_probability(residuals(x, r, cpo, scene).reshape(-1))


def check_params(name: str, params: GPParams) -> None:
    """``ValueError`` unless every log hyperparameter is finite (each natural one > 0)."""
    if not isinstance(params, GPParams):
        raise ValueError(f"{name} must be a GPParams, got {type(params).__name__}")
    if is_concrete(params):
        bad = [f for f, v in zip(GPParams._fields, params, strict=True) if not np.isfinite(v)]
        if bad:
            raise ValueError(
                f"{name} must have finite log hyperparameters (each natural value > 0), "
                f"got non-finite {bad}: {params.natural()}"
            )


#: the largest training covariance (L M x L M, float64) from_data conditions on by default
MAX_COVARIANCE_BYTES = 2 * 2**30

#: the fit's peak memory over its covariance's bytes: autodiff through the Cholesky and the
#: profiled CPOs' solves (measured 17-21x on a CPU at 2,040 and 4,080 pairs; CHANGELOG)
FIT_MEMORY_FACTOR = 20


def host_memory_bytes() -> float:
    """This host's physical memory in bytes (``os.sysconf``; inf where it cannot be read)."""
    try:
        return float(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return float("inf")


def check_covariance_size(
    num_locations: int,
    num_aps: int,
    max_bytes: float | None,
    *,
    factor: float = 1.0,
    name: str = "max_covariance_bytes",
) -> None:
    """Refuse up front work of ``factor`` times an (L M x L M) float64 covariance above
    ``max_bytes`` (None: half this host's memory, :func:`host_memory_bytes`): it would fail
    deep in XLA asking for the memory, or swap the machine."""
    n = num_locations * num_aps
    need = factor * 8.0 * n * n
    limit = host_memory_bytes() / 2 if max_bytes is None else max_bytes
    if need > limit:
        what = "covariance" if factor == 1 else f"work ({factor:g}x its covariance)"
        raise ValueError(
            f"L = {num_locations} snapshots x M = {num_aps} APs give a {n} x {n} {what} of "
            f"{need / 2**30:.1f} GiB > {name} = {limit / 2**30:.1f} GiB"
            + (" (half this host's memory)" if max_bytes is None else "")
            + "; use fewer labeled snapshots, or fit tiles of the region on their own labels "
            "and APs (dmimo_jax.tiles.fit_tiles)"
        )


def check_training_data(
    x: Any, r: Any, noise_var: Any, num_aps: int, *, min_labels: int = 2, deaf: bool = False
) -> None:
    """Validate L labeled snapshots: x (L, 3) above ground with L >= ``min_labels`` (the GP
    needs 2; a calibration checks its own count of residuals against its unknowns), r and
    noise_var (L, M) finite, noise_var real and > 0 (``ValueError`` naming the argument
    otherwise). ``deaf``: noise_var may be +inf where an AP heard nothing (it weighs 0),
    though not for every AP of a label. Traced arrays (a vmapped fit): their shapes only."""
    check_positions("x", x, batched=True)
    shape = np.shape(x)
    if len(shape) != 2 or shape[1] != 3:
        raise ValueError(f"x must have shape (L, 3), got {shape}")
    if shape[0] < min_labels:
        raise ValueError(
            f"need at least L = {min_labels} training locations, got x with shape {shape}"
        )
    for name, v in (("r", r), ("noise_var", noise_var)):
        if np.shape(v) != (shape[0], num_aps):
            raise ValueError(
                f"{name} must have shape {(shape[0], num_aps)} (L, M), got {np.shape(v)}"
            )
    if not is_concrete(x, r, noise_var):
        return
    for name, v in (("r", r), ("noise_var", noise_var)):
        v = np.asarray(v)
        if name == "noise_var" and deaf and v.dtype.kind == "f" and np.any(np.isposinf(v)):
            if np.any(np.all(np.isposinf(v), axis=-1)):
                raise ValueError("noise_var is inf for every AP of a label: drop that label")
            v = np.where(np.isposinf(v), 1.0, v)  # an AP that heard nothing: weight 0
        check_finite(name, v)
    if np.iscomplexobj(noise_var):
        raise ValueError("noise_var must be real variances (rad^2), got complex values")
    if np.any(np.asarray(noise_var) <= 0):
        raise ValueError("noise_var must be positive (rad^2)")
