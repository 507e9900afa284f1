"""Angles on the circle: the smallest pieces every other module uses.

All functions are elementwise, dtype-preserving and jit/vmap/grad friendly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

__all__ = ["circular_mean", "safe_arg", "safe_abs"]


def wrap(angle: ArrayLike) -> Array:
    r"""Wrap angles to :math:`[-\pi, \pi)`: :math:`\mathrm{wrap}(\zeta) = \mathrm{mod}(\zeta+\pi, 2\pi)-\pi`.

    This is the wrap function below eq. (8) of the paper with :math:`[a, b) = [-\pi, \pi)`.
    Floating-point ``mod`` can return exactly :math:`2\pi` for inputs a hair below a
    multiple of :math:`2\pi`; that case is folded back so the output never equals
    :math:`+\pi`. The derivative is 1 almost everywhere.

    Args:
        angle: angles in radians, any shape.

    Returns:
        Array of the same shape and dtype, in :math:`[-\pi, \pi)`.

    Raises:
        ValueError: complex ``angle`` (a phasor is not an angle: its imaginary part would
            be dropped; ``jnp.angle`` gives the angle of a phasor).

    Examples:
        >>> import jax.numpy as jnp
        >>> float(wrap(jnp.pi))
        -3.141592...
        >>> float(wrap(3 * jnp.pi / 2))
        -1.570796...
    """
    angle = jnp.asarray(angle)
    if jnp.issubdtype(angle.dtype, jnp.complexfloating):
        raise ValueError(
            f"angle must be real angles in radians, got {angle.dtype} values (the angle of "
            "a phasor is jnp.angle of it)"
        )
    if not jnp.issubdtype(angle.dtype, jnp.floating):
        angle = angle.astype(jnp.result_type(float))
    return _wrap(angle)


# one program per shape and dtype outside jit (instead of an eager dispatch per operation)
@jax.jit
def _wrap(angle: Array) -> Array:
    two_pi = jnp.asarray(2 * jnp.pi, angle.dtype)
    pi = jnp.asarray(jnp.pi, angle.dtype)
    wrapped = jnp.mod(angle + pi, two_pi) - pi
    return jnp.where(wrapped >= pi, wrapped - two_pi, wrapped)


def angle_diff(a: ArrayLike, b: ArrayLike) -> Array:
    r"""Signed circular difference :math:`\mathrm{wrap}(a - b)` in :math:`[-\pi, \pi)`.

    Raises:
        ValueError: ``a`` and ``b`` of shapes that do not broadcast, or complex.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    try:
        np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise ValueError(
            f"a and b must have shapes that broadcast, got {a.shape} and {b.shape}"
        ) from None
    return wrap(a - b)


def circular_mean(angle: ArrayLike, weights: ArrayLike | None = None, axis: int = -1) -> Array:
    r"""Weighted circular mean :math:`\arg \sum_m w_m e^{j a_m}` along ``axis``.

    Args:
        angle: angles in radians.
        weights: optional non-negative weights broadcastable to ``angle``.
        axis: axis to reduce.

    Returns:
        The mean direction in :math:`[-\pi, \pi)`.
    """
    angle = jnp.asarray(angle)
    w = jnp.ones_like(angle) if weights is None else jnp.broadcast_to(weights, angle.shape)
    s = jnp.sum(w * jnp.sin(angle), axis=axis)
    c = jnp.sum(w * jnp.cos(angle), axis=axis)
    return wrap(jnp.arctan2(s, c))


def safe_arg(s: ArrayLike) -> Array:
    r""":math:`\arg s` of complex ``s``, 0 where :math:`s = 0`, with finite derivatives there.

    An AP whose pattern gives no field at a UE has :math:`s = 0`: its phase carries no
    information (its variance is infinite), and the plain ``arctan2(0, 0)`` would make its
    derivative NaN and poison every AP's sums through ``0 * NaN``. The value is ``arctan2``'s
    (0 at the origin); the derivative is written out (a custom JVP), 0 at the origin, so the
    forward computation is exactly ``arctan2``'s.
    """
    s = jnp.asarray(s)
    return _arg(jnp.imag(s), jnp.real(s))


@jax.custom_jvp
def _arg(im: Array, re: Array) -> Array:
    return jnp.arctan2(im, re)


@_arg.defjvp
def _arg_jvp(primals, tangents):
    im, re = primals
    d_im, d_re = tangents
    r2 = re * re + im * im
    ok = r2 > 0
    d = (re * d_im - im * d_re) / jnp.where(ok, r2, 1.0)
    return jnp.arctan2(im, re), jnp.where(ok, d, 0.0)


def safe_abs(s: ArrayLike) -> Array:
    r""":math:`|s|` of complex ``s`` with a finite derivative (0) at :math:`s = 0`."""
    s = jnp.asarray(s)
    re, im = jnp.real(s), jnp.imag(s)
    zero = (re == 0) & (im == 0)
    return jnp.where(zero, 0.0, jnp.sqrt(jnp.where(zero, 1.0, re * re + im * im)))
