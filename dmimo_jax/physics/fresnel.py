r"""Fresnel reflection coefficient of a planar interface, eq. (3) (ITU-R P.2040 eqs. 31).

The incidence angle :math:`\gamma` is measured from the surface normal; ``"TE"`` is the
field perpendicular to the plane of incidence, ``"TM"`` parallel to it. Used for the
ground by the two-ray model and for every surface by the image-source room model.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_permittivity


def reflection_coefficient(
    cos_gamma: ArrayLike,
    eps_r: ArrayLike,
    polarization: str = "TE",
    perfect_conductor: bool = False,
) -> Array:
    r"""Fresnel reflection coefficient of the ground, eq. (3).

    .. math::

        \Gamma_{TE} = \frac{\cos\gamma - \zeta}{\cos\gamma + \zeta},\qquad
        \Gamma_{TM} = \frac{\varepsilon_r\cos\gamma - \zeta}{\varepsilon_r\cos\gamma + \zeta},
        \qquad \zeta = \sqrt{\varepsilon_r - \sin^2\gamma},

    with :math:`\varepsilon_r - \sin^2\gamma = (\varepsilon_r - 1) + \cos^2\gamma` (ITU-R P.2040 eqs. 31; the principal
    square root has non-negative real part). A perfect conductor gives -1.

    Args:
        cos_gamma: cosine of the incidence angle (measured from the surface normal).
        eps_r: complex relative permittivity.
        polarization: ``"TE"`` or ``"TM"`` (static).
        perfect_conductor: return -1 regardless of ``eps_r`` (static).

    Returns:
        Complex array broadcast from the inputs.

    Examples:
        >>> import jax.numpy as jnp
        >>> complex(reflection_coefficient(1.0, 4.0 + 0j))  # (1 - 2) / (1 + 2)
        (-0.333...+0j)
    """
    cos_gamma = jnp.asarray(cos_gamma)
    if not perfect_conductor:
        check_permittivity("eps_r", eps_r)
    cdt = jnp.result_type(cos_gamma.dtype, jnp.complex64)
    eps = jnp.asarray(eps_r, cdt)
    if perfect_conductor:
        return jnp.full(jnp.broadcast_shapes(cos_gamma.shape, eps.shape), -1.0 + 0j, cdt)
    c = cos_gamma.astype(cdt)
    zeta = zeta_term(c, eps)
    if polarization == "TE":
        # (c - zeta)/(c + zeta) = (c - zeta)^2 / (c^2 - zeta^2) = (c - zeta)^2 / (1 - eps_r):
        # one reciprocal per material instead of a complex division per ray. At eps_r = 1
        # (no interface) that form is 0/0: there Gamma = (c - zeta)/(c + zeta) = 0 with the
        # derivative -1/(4 c^2) in eps_r, which the first-order term (1 - eps_r)/(4 c^2)
        # carries (it vanishes at eps_r = 1; c = 0 too is grazing, Gamma = 0, gradient 0).
        one_minus = 1.0 - eps
        has_interface = one_minus != 0
        inv = jnp.where(has_interface, 1.0 / jnp.where(has_interface, one_minus, 1.0), 0.0)
        c2 = cos_gamma * cos_gamma  # real: a real reciprocal per ray, not a complex division
        quarter = jnp.where(c2 != 0, 0.25 / jnp.where(c2 != 0, c2, 1.0), 0.0)
        return jnp.where(has_interface, (c - zeta) ** 2 * inv, one_minus * quarter)
    if polarization != "TM":
        raise ValueError(f"polarization must be 'TE' or 'TM', got {polarization!r}")
    num, den = eps * c - zeta, eps * c + zeta
    # den = 0 only for eps_r = 1 at exact grazing incidence (no interface): Gamma = 0 there,
    # with the double-where so the gradient stays finite.
    safe = den != 0
    return jnp.where(safe, num / jnp.where(safe, den, 1.0), 0.0)


def zeta_term(cos_gamma: ArrayLike, eps_r: ArrayLike) -> Array:
    r""":math:`\zeta = \sqrt{\varepsilon_r - \sin^2\gamma}` of eq. (3), written as
    :math:`\sqrt{(\varepsilon_r - 1) + \cos^2\gamma}` to avoid cancellation near grazing.

    Used by :func:`reflection_coefficient` and by the Appendix Jacobian (its derivative).
    """
    arg = (eps_r - 1.0) + cos_gamma * cos_gamma
    # arg = 0 only for eps_r = 1 at grazing: zeta = 0 there, with a finite gradient
    nonzero = arg != 0
    return jnp.where(nonzero, jnp.sqrt(jnp.where(nonzero, arg, 1.0)), 0.0)


def surface_reflections(
    cos_gamma: Array, eps_r: Array, perfect_conductor: np.ndarray, polarization: str
) -> Array:
    """Eq. (3) for K surfaces at once: cosines (..., K), permittivities broadcasting to
    (..., K) and static perfect-conductor flags (K,) (NumPy bools: those surfaces give -1).

    A perfect conductor's permittivity is replaced by a valid placeholder before the
    dielectric formula, so its gradient stays finite.
    """
    pec = np.asarray(perfect_conductor, bool)
    if pec.all():
        return jnp.full(cos_gamma.shape, -1.0 + 0j, jnp.result_type(cos_gamma, jnp.complex64))
    eps_ok = jnp.where(jnp.asarray(pec), 2.0 + 0j, eps_r)
    g = reflection_coefficient(cos_gamma, eps_ok, polarization)
    return jnp.where(jnp.asarray(pec), -1.0 + 0j, g) if pec.any() else g
