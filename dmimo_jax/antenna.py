r"""AP antenna field patterns :math:`F(\mathbf u)` (beyond the paper: its first future-work item).

The paper's APs are isotropic: every ray leaves with the same amplitude. A real AP's
antenna weights each ray by its **field** (amplitude) pattern in the direction the ray
departs, :math:`\mathbf u` (a unit vector from the AP: toward the UE for the LoS, toward
the specular point for a bounce). Eq. (4) becomes

.. math:: \alpha^{(j)}_m = F_m(\mathbf u^{(j)}_m)\,|\Gamma^{(j)}_m|\frac{\lambda}{4\pi d^{(j)}_m},

and the paths are summed as phasors as before (eq. 7). Patterns are real (no phase
pattern), so an isotropic AP (:math:`F = 1`) is exactly the paper's model.

* :class:`IsotropicPattern`: :math:`F = 1` (the default of every :class:`~dmimo_jax.Scene`).
* :class:`CosinePattern`: :math:`F = \max(\mathbf u\cdot\mathbf b, 0)^{q/2}`, boresight
  :math:`\mathbf b`, exponent :math:`q` (a patch is :math:`q \approx 1`-2; the power
  pattern is :math:`\cos^q`).
* :class:`DipolePattern`: the half-wave dipole,
  :math:`F = \cos(\tfrac\pi2\,\mathbf u\cdot\mathbf v)/\sqrt{1-(\mathbf u\cdot\mathbf v)^2}`
  with axis :math:`\mathbf v` (0 along the axis, 1 broadside).

Parameters broadcast over the APs: one pattern for all (an exponent (), a boresight (3,)),
or one per AP (an exponent (M,), a boresight (M, 3)). Every pattern is a pytree whose
parameters are leaves, so the phase model is differentiable in them (the calibration fits
the exponent). This module sits at the bottom of the package (beside the materials) because
the :class:`~dmimo_jax.Scene` carries the pattern; the propagation models evaluate it.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_finite, is_concrete
from dmimo_jax.pytree import pytree_dataclass

__all__ = [
    "AntennaPattern",
    "check_pattern",
    "is_isotropic",
]


@pytree_dataclass
class IsotropicPattern:
    """:math:`F(\\mathbf u) = 1` in every direction (the paper's APs; no parameters)."""

    def field(self, u: ArrayLike) -> Array:
        """Field amplitude for unit directions ``u`` (M, P, 3): ones (M, P)."""
        u = _directions(u)
        return jnp.ones(u.shape[:-1], u.dtype)

    def num_aps(self) -> int | None:
        """The M the parameters fix (``None``: they broadcast to any M)."""
        return None


def _unit(name: str, v: ArrayLike, dtype: Any) -> Array:
    v = jnp.asarray(v, dtype)
    if v.ndim not in (1, 2) or v.shape[-1] != 3:
        raise ValueError(f"{name} must have shape (3,) or (M, 3), got {v.shape}")
    check_finite(name, v)
    if is_concrete(v) and np.any(np.linalg.norm(np.asarray(v, float), axis=-1) == 0):
        raise ValueError(f"{name} must be non-zero vectors, got {np.asarray(v).tolist()}")
    return v / jnp.linalg.norm(v, axis=-1, keepdims=True)


def _directions(u: ArrayLike) -> Array:
    """``u`` as an (M, P, 3) array, or a ``ValueError``: a (P, 3) array would otherwise
    broadcast against per-AP parameters into a wrong (P, P) answer."""
    u = jnp.asarray(u)
    if u.ndim != 3 or u.shape[-1] != 3:
        raise ValueError(
            f"u must be unit directions of shape (M, P, 3) (per AP, per point), got {u.shape}"
        )
    return u


def _per_ap(value: Array, u: Array) -> Array:
    """A () or (M,) parameter as (M, 1) to broadcast against (M, P) (explicitly)."""
    return jnp.broadcast_to(value.reshape(-1, 1), (u.shape[0], 1))


def _per_ap_vector(value: Array, u: Array) -> Array:
    """A (3,) or (M, 3) direction as (M, 1, 3)."""
    return jnp.broadcast_to(value.reshape(-1, 1, 3), (u.shape[0], 1, 3))


@pytree_dataclass(init=False)
class CosinePattern:
    r"""Cosine-power field pattern :math:`F = \max(\mathbf u\cdot\mathbf b, 0)^{q/2}`.

    Attributes:
        exponent: () or (M,) power exponent :math:`q \ge 0` (``q = 0`` is a hemisphere).
        boresight: (3,) or (M, 3) unit boresight :math:`\mathbf b` (normalized on input;
            default straight down, a ceiling patch).

    Raises:
        ValueError: a negative or non-finite exponent, a zero or malformed boresight.

    Examples:
        >>> import jax.numpy as jnp
        >>> p = CosinePattern(exponent=2.0)
        >>> [round(float(f), 6) for f in p.field(jnp.array([[[0.0, 0.6, -0.8]]]))[0]]
        [0.8]
    """

    exponent: Array
    boresight: Array

    def __init__(
        self, exponent: ArrayLike = 1.0, boresight: ArrayLike = (0.0, 0.0, -1.0), dtype: Any = None
    ):
        dtype = jnp.result_type(float) if dtype is None else dtype
        q = jnp.asarray(exponent, dtype)
        if q.ndim > 1:
            raise ValueError(f"exponent must be a scalar or have shape (M,), got {q.shape}")
        check_finite("exponent", q)
        if is_concrete(q) and np.any(np.asarray(q) < 0):
            raise ValueError(f"exponent must be >= 0, got {np.asarray(q).tolist()}")
        object.__setattr__(self, "exponent", q)
        object.__setattr__(self, "boresight", _unit("boresight", boresight, dtype))

    def field(self, u: ArrayLike) -> Array:
        """Field amplitude for unit directions ``u`` (M, P, 3), shape (M, P)."""
        u = _directions(u)
        c = jnp.sum(u * _per_ap_vector(self.boresight, u), axis=-1)
        front = c > 0
        # double where: finite gradients in q and u where the field vanishes
        log_c = jnp.log(jnp.where(front, c, 1.0))
        return jnp.where(front, jnp.exp(0.5 * _per_ap(self.exponent, u) * log_c), 0.0)

    def num_aps(self) -> int | None:
        """The M the pattern's per-AP parameters fix (``None``: they broadcast to any M)."""
        sizes = {self.exponent.shape[0]} if self.exponent.ndim == 1 else set()
        if self.boresight.ndim == 2:
            sizes.add(self.boresight.shape[0])
        if len(sizes) > 1:
            raise ValueError(
                f"CosinePattern: exponent {self.exponent.shape} and boresight "
                f"{self.boresight.shape} give different numbers of APs"
            )
        return sizes.pop() if sizes else None


@pytree_dataclass(init=False)
class DipolePattern:
    r"""Half-wave dipole :math:`F = \cos(\tfrac\pi2\,\mathbf u\cdot\mathbf v)/\sqrt{1-(\mathbf u\cdot\mathbf v)^2}`.

    Attributes:
        axis: (3,) or (M, 3) unit dipole axis :math:`\mathbf v` (normalized on input;
            default vertical).

    Examples:
        >>> import jax.numpy as jnp
        >>> p = DipolePattern()
        >>> [round(float(f), 6) for f in p.field(jnp.array([[[1.0, 0.0, 0.0], [0.0, 0.0, -1.0]]]))[0]]
        [1.0, 0.0]
    """

    axis: Array

    def __init__(self, axis: ArrayLike = (0.0, 0.0, 1.0), dtype: Any = None):
        dtype = jnp.result_type(float) if dtype is None else dtype
        object.__setattr__(self, "axis", _unit("axis", axis, dtype))

    def field(self, u: ArrayLike) -> Array:
        """Field amplitude for unit directions ``u`` (M, P, 3), shape (M, P)."""
        u = _directions(u)
        c = jnp.sum(u * _per_ap_vector(self.axis, u), axis=-1)
        s2 = 1.0 - c * c
        ok = s2 > 1e-12  # along the axis the limit is 0
        value = jnp.cos(0.5 * jnp.pi * c) / jnp.sqrt(jnp.where(ok, s2, 1.0))
        return jnp.where(ok, value, 0.0)

    def num_aps(self) -> int | None:
        """The M the pattern's per-AP parameters fix (``None``: they broadcast to any M)."""
        return self.axis.shape[0] if self.axis.ndim == 2 else None


AntennaPattern = IsotropicPattern | CosinePattern | DipolePattern
"""The patterns a :class:`~dmimo_jax.Scene` accepts as ``antenna``."""


def check_pattern(name: str, pattern: Any, num_aps: int) -> None:
    """``ValueError`` unless ``pattern`` is an :data:`AntennaPattern` whose per-AP parameters
    (if any) are for ``num_aps`` APs."""
    if not isinstance(pattern, IsotropicPattern | CosinePattern | DipolePattern):
        raise ValueError(
            f"{name} must be an IsotropicPattern, CosinePattern or DipolePattern, got "
            f"{type(pattern).__name__}"
        )
    m = pattern.num_aps()
    if m is not None and m != num_aps:
        raise ValueError(
            f"{name} has per-AP parameters for {m} APs, but the scene has M = {num_aps}"
        )


def is_isotropic(pattern: Any) -> bool:
    """Whether ``pattern`` is :class:`IsotropicPattern` (the models then skip the gains)."""
    return isinstance(pattern, IsotropicPattern)
