r"""Two-ray (LoS + specular ground reflection) carrier-phase model, eqs. (1)-(9).

Every public function takes **one** UE position ``x`` of shape (3,) and returns one
value per AP, shape (M,); batch with ``jax.vmap``. All are differentiable in ``x``
and in the :class:`~dmimo_jax.scene.Scene` leaves (e.g. ``eps_r``).

Numerics. The effective phase (eq. 7b) is computed as the LoS phase plus a bounded
perturbation,

.. math::

    \sum_j h_m^{(j)} = h_m^{(1)}(1+\rho_m), \qquad
    \rho_m = \Gamma_m \frac{d^{(1)}_m}{d^{(2)}_m} e^{-j 2\pi (d^{(2)}_m-d^{(1)}_m)/\lambda},
    \qquad \theta_m = \frac{2\pi d^{(1)}_m}{\lambda} - \arg(1+\rho_m),

which is algebraically eq. (7b) (:math:`|\rho_m|<1` because :math:`|\Gamma|\le 1` and
:math:`d^{(2)} > d^{(1)}`, so :math:`\arg(1+\rho)\in(-\pi/2,\pi/2)` is smooth), with the
path difference :math:`d^{(2)}-d^{(1)} = 4 z z_m / (d^{(1)}+d^{(2)})` free of
cancellation, and :math:`\cos\gamma = (z+z_m)/d^{(2)}` used directly (no ``acos``), so
gradients are finite straight below an AP.

Beyond the paper, the scene's deployment enters here: each path's amplitude is multiplied
by the AP antenna's field pattern in the ray's departure direction
(:mod:`dmimo_jax.antenna`; the phasor sum becomes :math:`F^{(1)}_m + F^{(2)}_m\rho_m`
relative to the isotropic LoS phasor) and the AP's static phase offset :math:`\delta_m`
(``scene.ap_phase_offsets``) is added to every path's phase. With the defaults (isotropic,
zero offsets) every function is exactly the paper's.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_away_from_aps, check_positions
from dmimo_jax.antenna import is_isotropic
from dmimo_jax.phase import safe_abs, safe_arg, wrap
from dmimo_jax.physics.fresnel import reflection_coefficient
from dmimo_jax.pytree import pytree_dataclass
from dmimo_jax.scene import Scene


class Geometry(NamedTuple):
    """Per-AP geometry of one UE position, each (M,)."""

    d1: Array
    """LoS length ||p_m - x||, m."""
    d2: Array
    """Reflected length ||p~_m - x||, p~_m = [x_m, y_m, -z_m], m."""
    path_difference: Array
    """d2 - d1 (cancellation-free), m."""
    cos_gamma: Array
    """cos of the incidence angle, (z + z_m) / d2."""


class PathParameters(NamedTuple):
    """Amplitudes and phases of the two paths (eq. 4) and Gamma (eq. 3), each (M,)."""

    alpha1: Array
    theta1: Array
    alpha2: Array
    theta2: Array
    gamma: Array
    """Complex reflection coefficient."""


def safe_norm(v: Array, axis: int = -1) -> Array:
    """Euclidean norm along ``axis`` with a finite (zero) gradient at v = 0 (double-where trick)."""
    sq = jnp.sum(v * v, axis=axis)
    nonzero = sq > 0
    return jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, sq, 1.0)), 0.0)


@jax.jit  # one program per scene and shape outside jit; inlined inside a jitted caller
def geometry(x: ArrayLike, scene: Scene) -> Geometry:
    """LoS/NLoS path lengths and the incidence angle cosine for UE ``x`` (3,)."""
    x = jnp.asarray(x, scene.ap_positions.dtype)
    ap = scene.ap_positions
    delta = ap - x[None, :]
    mirror = ap * jnp.asarray([1.0, 1.0, -1.0], ap.dtype)[None, :]
    d1 = safe_norm(delta)
    d2 = safe_norm(mirror - x[None, :])
    # d2^2 - d1^2 = (z + z_m)^2 - (z - z_m)^2 = 4 z z_m
    path_difference = 4.0 * x[2] * ap[:, 2] / (d1 + d2)
    cos_gamma = (x[2] + ap[:, 2]) / d2
    return Geometry(d1, d2, path_difference, cos_gamma)


def _gamma(geo: Geometry, scene: Scene) -> Array:
    return reflection_coefficient(
        geo.cos_gamma, scene.eps_r, scene.polarization, scene.perfect_conductor
    )


def departure_directions(x: ArrayLike, scene: Scene) -> Array:
    r"""Unit directions in which the two rays leave each AP, (M, 2, 3).

    Column 0: the LoS, :math:`(\mathbf x - \mathbf p_m)/d^{(1)}_m`; column 1: toward the
    specular point on the ground, the unfolded direction :math:`(\mathbf x - \tilde{\mathbf
    p}_m)/d^{(2)}_m` mirrored back across z = 0.
    """
    x = jnp.asarray(x, scene.ap_positions.dtype)
    geo = geometry(x, scene)
    delta = x[None, :] - scene.ap_positions
    flip = jnp.asarray([1.0, 1.0, -1.0], delta.dtype)[None, :]
    to_image = (x[None, :] - scene.ap_positions * flip) * flip  # mirrored back across z = 0
    los = delta / geo.d1[:, None]
    bounce = to_image / geo.d2[:, None]
    return jnp.stack([los, bounce], axis=1)


def path_gains(x: ArrayLike, scene: Scene) -> Array:
    r"""Antenna field pattern of each AP in the departure direction of each ray, (M, 2).

    :math:`[F_m(\mathbf u^{(1)}_m), F_m(\mathbf u^{(2)}_m)]`; ones for isotropic APs.
    """
    return scene.antenna.field(departure_directions(x, scene))


def path_parameters(x: ArrayLike, scene: Scene) -> PathParameters:
    r"""Amplitudes and phases of the LoS and reflected paths, eq. (4).

    :math:`\alpha^{(1)} = F^{(1)}\lambda/(4\pi d^{(1)})`, :math:`\theta^{(1)} = 2\pi
    d^{(1)}/\lambda + \delta`, :math:`\alpha^{(2)} = F^{(2)}|\Gamma|\lambda/(4\pi d^{(2)})`,
    :math:`\theta^{(2)} = 2\pi d^{(2)}/\lambda - \angle\Gamma + \delta` with the antenna
    gains :math:`F` (:func:`path_gains`; 1 for the paper's isotropic APs) and the AP's phase
    offset :math:`\delta` (0 in the paper). Phases are unwrapped.
    """
    check_positions("x", x, batched=False)
    check_away_from_aps("x", x, scene.ap_positions)
    geo = geometry(x, scene)
    lam = scene.wavelength
    gamma = _gamma(geo, scene)
    k = 2 * jnp.pi / lam
    gains = path_gains(x, scene)
    offset = scene.ap_phase_offsets
    return PathParameters(
        alpha1=gains[:, 0] * lam / (4 * jnp.pi * geo.d1),
        theta1=k * geo.d1 + offset,
        alpha2=gains[:, 1] * jnp.abs(gamma) * lam / (4 * jnp.pi * geo.d2),
        theta2=k * geo.d2 - jnp.angle(gamma) + offset,
        gamma=gamma,
    )


def relative_reflection(x: ArrayLike, scene: Scene) -> tuple[Geometry, Array]:
    r""":math:`\rho_m = h^{(2)}_m / h^{(1)}_m` of isotropic APs, the reflected phasor relative to
    the LoS one.

    Returns:
        ``(geometry, rho)`` with ``rho`` complex (M,), :math:`|\rho_m| < 1`.
    """
    geo = geometry(x, scene)
    gamma = _gamma(geo, scene)
    k = 2 * jnp.pi / scene.wavelength
    rho = gamma * (geo.d1 / geo.d2) * jnp.exp(-1j * (k * geo.path_difference))
    return geo, rho


# compiled as one program per scene and shape when called outside jit (a script, an eager
# vmap) instead of an eager dispatch per operation; inlined inside a jitted caller
@jax.jit
def _phasor_sum(x: ArrayLike, scene: Scene) -> tuple[Geometry, Array]:
    r"""``(geometry, s)``: the channel relative to the isotropic LoS phasor (offset excluded),
    :math:`s_m = F^{(1)}_m + F^{(2)}_m\rho_m` (:math:`1 + \rho_m` for isotropic APs)."""
    geo, rho = relative_reflection(x, scene)
    if is_isotropic(scene.antenna):
        return geo, 1.0 + rho
    gains = path_gains(x, scene)
    return geo, gains[:, 0] + gains[:, 1] * rho


def effective_phasor(x: ArrayLike, scene: Scene) -> Array:
    r"""Noise-free channel :math:`h_m = \sum_j \alpha^{(j)}_m e^{-j\theta^{(j)}_m} = \alpha_m e^{-j\theta_m}`.

    Eq. (2) summed over the two paths (with the antenna gains and the AP's phase offset);
    equals eq. (6) without :math:`\sqrt{P}`, CPO and noise. Complex, shape (M,).
    """
    check_positions("x", x, batched=False)
    check_away_from_aps("x", x, scene.ap_positions)
    geo, s = _phasor_sum(x, scene)
    lam = scene.wavelength
    phase = 2 * jnp.pi / lam * geo.d1 + scene.ap_phase_offsets
    h1 = (lam / (4 * jnp.pi * geo.d1)) * jnp.exp(-1j * phase)
    return h1 * s


def effective_amplitude(x: ArrayLike, scene: Scene) -> Array:
    r"""Effective amplitude :math:`\alpha_m(\mathbf{x})`, eq. (7a), shape (M,).

    Computed as :math:`\alpha^{(1)}|1+\rho|`, identical to
    :math:`\sqrt{\tilde\alpha_1^2+\tilde\alpha_2^2+2\tilde\alpha_1\tilde\alpha_2\cos(\tilde\theta_1-\tilde\theta_2)}`.
    """
    check_positions("x", x, batched=False)
    check_away_from_aps("x", x, scene.ap_positions)
    geo, s = _phasor_sum(x, scene)
    return scene.wavelength / (4 * jnp.pi * geo.d1) * safe_abs(s)


def phase_perturbation(x: ArrayLike, scene: Scene) -> Array:
    r"""Reflection-induced phase perturbation :math:`\theta_m - \theta^{(1)}_m = -\arg(1+\rho_m)`.

    Bounded in :math:`(-\pi/2, \pi/2)` for isotropic APs; this is the function the GP of
    Sec. III learns (eq. 20). With an antenna pattern it is :math:`-\arg(F^{(1)}_m +
    F^{(2)}_m\rho_m)`. The AP's phase offset is not part of it. Shape (M,), radians.
    """
    check_positions("x", x, batched=False)
    check_away_from_aps("x", x, scene.ap_positions)
    _, s = _phasor_sum(x, scene)
    return _minus_arg(s)


def _minus_arg(s: Array) -> Array:
    """-arg(s) of the relative phasor sum: smooth in (-pi/2, pi/2) when s = 1 + rho, |rho| < 1."""
    return -safe_arg(s)


def unwrapped_phase(x: ArrayLike, scene: Scene) -> Array:
    r"""Effective phase without wrapping: :math:`2\pi d^{(1)}_m/\lambda` + perturbation
    (+ the AP's phase offset :math:`\delta_m`, zero in the paper).

    Continuous in ``x``; ``wrap(unwrapped_phase(x))`` equals eq. (7b). Use it for
    Jacobians (eq. 14) and as the PhaseModel mean. Shape (M,), radians (~170 rad in
    the paper's scene: keep float64).
    """
    check_positions("x", x, batched=False)
    check_away_from_aps("x", x, scene.ap_positions)
    geo, s = _phasor_sum(x, scene)
    return 2 * jnp.pi / scene.wavelength * geo.d1 + _minus_arg(s) + scene.ap_phase_offsets


def effective_phase(x: ArrayLike, scene: Scene) -> Array:
    r"""Effective carrier phase :math:`\theta_m(\mathbf{x})` of eq. (7b), wrapped to :math:`[-\pi,\pi)`.

    Args:
        x: UE position (3,) in metres, z > 0.
        scene: the deployment.

    Returns:
        (M,) phases in radians.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from dmimo_jax import paper_scene
        >>> scene = paper_scene()
        >>> effective_phase(jnp.array([6.5, 5.0, 2.0]), scene).shape
        (17,)
    """
    return wrap(unwrapped_phase(x, scene))


def phase_noise_var(x: ArrayLike, scene: Scene) -> Array:
    r"""Phase-noise variance :math:`\sigma_m^2 = \sigma_w^2 / (2 P \alpha_m^2)`, eq. (9), rad^2, (M,)."""
    return noise_var_from_amplitude(effective_amplitude(x, scene), scene)


def noise_var_from_amplitude(alpha: ArrayLike, scene: Scene) -> Array:
    r"""Eq. (9) for a given path amplitude: :math:`\sigma_w^2 / (2 P \alpha^2)`, rad^2."""
    return scene.noise_power / (2.0 * scene.tx_power * jnp.asarray(alpha) ** 2)


@pytree_dataclass
class TwoRayModel:
    r"""The analytic two-ray model as a **PhaseModel**.

    A PhaseModel maps one UE position ``x`` (3,) to the per-AP mean carrier phase
    without CPO, ``mean(x)`` (M,) (unwrapped, radians), and the phase-noise variance
    ``variance(x)`` (M,) (rad^2). Estimators, bounds and measurement simulation are
    written against this interface, so the GP model of Sec. III plugs in unchanged.
    A mismatched model is ``TwoRayModel(scene.replace(eps_r=beta * scene.eps_r))``.
    """

    scene: Scene

    piecewise = False  # CalibratableModel: smooth phases

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.scene.num_aps

    # ------------------------------------------------ CalibratableModel (calibration's view)

    @property
    def surface_names(self) -> tuple[str, ...]:
        """One surface: the ground."""
        return ("ground",)

    def with_scene(self, scene: Scene) -> TwoRayModel:
        """The two-ray model of ``scene``."""
        return TwoRayModel(scene)

    def with_permittivities(self, eps_r: Array, indices: tuple[int, ...]) -> TwoRayModel:
        """The ground's permittivity ``eps_r[0]`` (index 0)."""
        return TwoRayModel(self.scene.replace(eps_r=eps_r[0]))

    def mounted(self) -> list[list]:
        """No AP is mounted on a surface (the ground is below them)."""
        return [[] for _ in range(self.num_aps)]

    def calibration_surfaces(self, surfaces=None) -> tuple[list[int], list[str]]:
        """The ground, unless it is a perfect conductor."""
        if self.scene.perfect_conductor:
            raise ValueError(
                "fit: 'surfaces' of a two-ray model is the ground, and this one is a perfect "
                "conductor (no eps_r to calibrate)"
            )
        if surfaces is not None and list(surfaces) != ["ground"]:
            raise ValueError(f"surfaces: a two-ray model has only 'ground', got {surfaces}")
        return [0], ["ground"]

    def mean(self, x: ArrayLike) -> Array:
        """Eq. (7b), unwrapped."""
        self._check_x(x)
        return self._mean(x)

    def variance(self, x: ArrayLike) -> Array:
        """Eq. (9)."""
        self._check_x(x)
        return self._variance(x)

    def _check_x(self, x: ArrayLike) -> None:
        check_positions("x", x, batched=False)
        check_away_from_aps("x", x, self.scene.ap_positions)

    # after the check, one compiled program per model and shape when called outside jit (a
    # script, an eager vmap) instead of an eager dispatch per operation
    @jax.jit
    def _mean(self, x: ArrayLike) -> Array:
        return unwrapped_phase(x, self.scene)

    @jax.jit
    def _variance(self, x: ArrayLike) -> Array:
        return phase_noise_var(x, self.scene)

    def __repr__(self) -> str:
        return f"TwoRayModel({self.scene!r})"
