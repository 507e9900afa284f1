r"""The hyperbola-intersection (HI) benchmark (Sec. IV-B): differential phases + integers.

With a reference AP, the wrapped differential phase :math:`\Delta r_m =
\mathrm{wrap}(r_m - r_{\mathrm{ref}})` of a LoS-only channel satisfies

.. math:: d_m(\mathbf x) - d_{\mathrm{ref}}(\mathbf x) = \lambda\,(\Delta r_m / 2\pi + n_m),
   \qquad n_m \in \mathbb Z,

one hyperboloid per AP m != ref (the CPO cancels). A classifier
(:class:`~dmimo_jax.learning.hi.AmbiguityClassifier`) predicts the integers; the
Levenberg-Marquardt solver of :mod:`~dmimo_jax.estimators.lm` then intersects the
hyperboloids. The two-ray
perturbation violates the LoS assumption (a bias of up to the perturbation's phase over
:math:`2\pi` wavelengths), which is why the paper includes HI only for completeness.
Everything here is float64.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax.estimators.lm import levenberg_marquardt
from dmimo_jax.phase import wrap


def _split(v: Array, reference: int) -> tuple[Array, Array]:
    others = [m for m in range(v.shape[-1]) if m != reference]
    return v[..., others], v[..., reference : reference + 1]


def _differential_phase(r: Array, reference: int) -> Array:
    rm, rref = _split(jnp.asarray(r), reference)
    return wrap(rm - rref)


def _distance_differences(x: Array, ap_positions: Array, reference: int) -> Array:
    diff = x[..., None, :] - jnp.broadcast_to(ap_positions, (*x.shape[:-1], *ap_positions.shape))
    d = jnp.linalg.norm(diff, axis=-1)
    dm, dref = _split(d, reference)
    return dm - dref


def ambiguities(
    r: ArrayLike, x: ArrayLike, ap_positions: ArrayLike, wavelength: float, reference: int = 0
) -> Array:
    r"""The integers :math:`n_m` (..., M - 1) that make the hyperboloids pass closest to x."""
    dd = _distance_differences(jnp.asarray(x), jnp.asarray(ap_positions), reference)
    frac = _differential_phase(r, reference) / (2 * jnp.pi)
    return jnp.round(dd / wavelength - frac).astype(jnp.int32)


def max_ambiguity(ap_positions: ArrayLike, wavelength: float, reference: int = 0) -> int:
    r"""A bound on :math:`|n_m|`: :math:`|d_m - d_{\mathrm{ref}}| \le \|\mathbf a_m -
    \mathbf a_{\mathrm{ref}}\|` (triangle inequality), plus one for the rounding."""
    a = jnp.asarray(ap_positions)
    baseline = jnp.linalg.norm(a - a[reference : reference + 1], axis=-1)
    return int(jnp.ceil(jnp.max(baseline) / wavelength)) + 1


def hyperboloid_residuals(
    x: ArrayLike,
    r: ArrayLike,
    n: ArrayLike,
    ap_positions: ArrayLike,
    wavelength: float,
    reference: int = 0,
) -> Array:
    r""":math:`d_m - d_{\mathrm{ref}} - \lambda(\Delta r_m/2\pi + n_m)` (M - 1,), m."""
    dd = _distance_differences(jnp.asarray(x), jnp.asarray(ap_positions), reference)
    frac = _differential_phase(r, reference) / (2 * jnp.pi)
    return dd - wavelength * (frac + jnp.asarray(n))


@partial(jax.jit, static_argnames=("reference", "num_steps"))
def intersect(
    r: ArrayLike,
    n: ArrayLike,
    ap_positions: ArrayLike,
    wavelength: float,
    starts: ArrayLike,
    *,
    reference: int = 0,
    num_steps: int = 30,
    damping: float = 1e-3,
) -> Array:
    """Intersect the hyperboloids of one snapshot: the least-squares point (3,) in metres.

    :func:`~dmimo_jax.estimators.lm.levenberg_marquardt` from each of ``starts`` (S, 3); the solution with the smallest
    squared residual wins (hyperboloids can intersect more than once in 3D).
    Vectorize over snapshots with ``jax.vmap(intersect, (0, 0, None, None, None))``.
    """
    ap = jnp.asarray(ap_positions)

    def res(x):
        return hyperboloid_residuals(x, r, n, ap, wavelength, reference)

    def solve(x0):
        fit = levenberg_marquardt(lambda x, _: res(x), x0, num_steps=num_steps, damping=damping)
        return fit.x, fit.cost

    xs, costs = jax.vmap(solve)(jnp.asarray(starts))
    return xs[jnp.argmin(costs)]


def default_starts(low: ArrayLike, high: ArrayLike) -> Array:
    """Nine starts: the UE region's centre and the centres of its eight octants."""
    low, high = jnp.asarray(low), jnp.asarray(high)
    corners = jnp.array(
        [[i, j, k] for i in (0.25, 0.75) for j in (0.25, 0.75) for k in (0.25, 0.75)]
    )
    u = jnp.concatenate([jnp.full((1, 3), 0.5), corners])
    return low[None, :] + u * (high - low)[None, :]


def estimate(
    r: ArrayLike,
    n: ArrayLike,
    ap_positions: ArrayLike,
    wavelength: float,
    starts: ArrayLike,
    *,
    reference: int = 0,
) -> Array:
    """:func:`intersect` for a batch of snapshots r (B, M) and integers n (B, M - 1)."""
    fn = lambda ri, ni: intersect(ri, ni, ap_positions, wavelength, starts, reference=reference)
    return jax.vmap(fn)(jnp.asarray(r), jnp.asarray(n))
