r"""Model-based MLE of Sec. II-D: CPO compression, ML/LS costs, and gradient refinement.

All functions take a **PhaseModel** (or a Scene, meaning its two-ray model), so the
same code serves the matched model, a mismatched one
(``TwoRayModel(scene.replace(eps_r=beta * scene.eps_r))``) and the GP model.

Shapes: ``r`` is one snapshot (M,) of wrapped phases; ``x`` one position (3,). Batch
with ``jax.vmap`` (or :func:`refine_batch`).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_phases, check_positions
from dmimo_jax.phase import wrap
from dmimo_jax.physics import as_phase_model

__all__ = [
    "wrap_corrected_residuals",
    "cpo_estimate",
    "compressed_residuals",
    "ml_cost",
    "ls_cost",
    "RefineResult",
    "refine",
    "refine_batch",
]


def wrap_corrected_residuals(r: ArrayLike, mean: ArrayLike) -> Array:
    r"""Residuals :math:`\varepsilon_m` with the wrap correction of eq. (16).

    :math:`\tilde\varepsilon_m = \mathrm{wrap}(r_m - \theta_m)`; with
    :math:`\mathcal I_\pm = \{m : \pm\tilde\varepsilon_m > \pi/2\}`, the minority side is moved
    by :math:`\pm 2\pi` so that residuals straddling :math:`\pm\pi` form one cluster.

    Args:
        r: wrapped phases (..., M).
        mean: model phases without CPO (..., M), any branch.

    Returns:
        (..., M) corrected residuals (in :math:`[-2\pi, 2\pi)`).
    """
    e = wrap(jnp.asarray(r) - jnp.asarray(mean))
    half_pi = jnp.pi / 2
    pos, neg = e > half_pi, e < -half_pi
    n_pos = jnp.sum(pos, axis=-1, keepdims=True)
    n_neg = jnp.sum(neg, axis=-1, keepdims=True)
    two_pi = 2 * jnp.pi
    return e + two_pi * (neg & (n_pos > n_neg)) - two_pi * (pos & (n_pos < n_neg))


def cpo_estimate(r: ArrayLike, mean: ArrayLike, variance: ArrayLike | None = None) -> Array:
    r"""CPO estimate :math:`\hat\phi = \sum_m \varepsilon_m\sigma_m^{-2} / \sum_m\sigma_m^{-2}`, eq. (15).

    Args:
        r: wrapped phases (..., M).
        mean: model phases without CPO (..., M).
        variance: per-AP phase variances (..., M); ``None`` gives equal weights (the LS case).

    Returns:
        (...,) CPO estimate in radians (not wrapped).
    """
    e = wrap_corrected_residuals(r, mean)
    if variance is None:
        return jnp.mean(e, axis=-1)
    w = 1.0 / jnp.asarray(variance)
    return jnp.sum(w * e, axis=-1) / jnp.sum(w, axis=-1)


def compressed_residuals(r: ArrayLike, mean: ArrayLike, variance: ArrayLike | None = None) -> Array:
    r"""Residuals with the CPO compressed away: :math:`\mathrm{wrap}(r_m - \theta_m - \hat\phi)`.

    The terms squared in eqs. (17)-(18); :math:`\hat\phi` from :func:`cpo_estimate` with
    the same ``variance`` (``None``: the LS case). Shapes as in :func:`cpo_estimate`.
    """
    r, mean = jnp.asarray(r), jnp.asarray(mean)
    phi = cpo_estimate(r, mean, variance)
    return wrap(r - mean - phi[..., None])


def ml_cost(x: ArrayLike, r: ArrayLike, model: Any) -> Array:
    r"""ML cost :math:`C(\mathbf x) = \sum_m \sigma_m^{-2}\,\mathrm{wrap}(r_m - \mu_m(\mathbf x, \hat\phi))^2`, eq. (17).

    :math:`\sigma_m^2` is the model's variance at ``x``.
    """
    model = as_phase_model(model)
    mean, var = model.mean(jnp.asarray(x)), model.variance(jnp.asarray(x))
    return jnp.sum(compressed_residuals(r, mean, var) ** 2 / var)


def ls_cost(x: ArrayLike, r: ArrayLike, model: Any) -> Array:
    r"""LS cost :math:`\tilde C(\mathbf x) = \sum_m \mathrm{wrap}(r_m - \mu_m(\mathbf x, \hat\phi))^2`, eq. (18)."""
    model = as_phase_model(model)
    return jnp.sum(compressed_residuals(r, model.mean(jnp.asarray(x))) ** 2)


class RefineResult(NamedTuple):
    """Output of :func:`refine` (shapes for one snapshot; batched adds a leading axis)."""

    x: Array  # (3,) refined position, m
    cpo: Array  # () CPO estimate at x, rad
    cost: Array  # () ML cost at x
    num_accepted: Array  # () int, accepted Levenberg-Marquardt steps


def refine(
    x0: ArrayLike,
    r: ArrayLike,
    model: Any,
    *,
    num_steps: int = 25,
    damping: float = 1e-3,
) -> RefineResult:
    r"""Minimise the ML cost (eq. 17) from ``x0`` by Levenberg-Marquardt.

    Why LM rather than first-order descent (optax): the cost is a weighted sum of squares
    of M smooth residuals :math:`e_m(\mathbf x) = \mathrm{wrap}(r_m - \mu_m(\mathbf x) -
    \hat\phi(\mathbf x))/\sigma_m` in 3 unknowns, badly scaled (phase slopes ~17 rad/m,
    :math:`\sigma\sim5\cdot10^{-4}` rad, so the curvature is ~1e9 per m^2 and a gradient
    step size would need tuning per power level). Gauss-Newton with the autodiff Jacobian
    (3 forward passes) converges quadratically inside the basin and is scale-invariant;
    the LM damping :math:`\lambda\,\mathrm{diag}(\mathbf J^\top\mathbf J)` keeps steps from
    leaving the basin. The CPO is compressed at every evaluation (eq. 15), so its
    dependence on x is part of the Jacobian. Weights :math:`\sigma_m^{-2}` are
    re-evaluated at each iterate and held constant within a step (as the paper treats
    :math:`\sigma^2` as given by channel estimation).

    A fixed number of steps keeps it jittable and vmappable; a rejected step leaves x
    unchanged and raises the damping, so extra steps are harmless.

    Args:
        x0: (3,) initial position (e.g. an EGS or POPT estimate), m.
        r: (M,) wrapped phases.
        model: PhaseModel or Scene.
        num_steps: LM iterations.
        damping: initial LM damping factor.

    Returns:
        :class:`RefineResult`.
    """
    model = as_phase_model(model)
    check_positions("x0", x0, batched=False)
    check_phases("r", r, model.num_aps, batched=False)
    return _refine(
        jnp.asarray(x0), jnp.asarray(r, jnp.asarray(x0).dtype), model, num_steps, damping
    )


def refine_batch(
    x0: ArrayLike, r: ArrayLike, model: Any, *, num_steps: int = 25, damping: float = 1e-3
) -> RefineResult:
    """:func:`refine` for (N, 3) starts and (N, M) snapshots, jitted and vmapped."""
    model = as_phase_model(model)
    check_positions("x0", x0, batched=True)
    check_phases("r", r, model.num_aps, batched=True)
    x0 = jnp.asarray(x0)
    r = jnp.asarray(r, x0.dtype)
    if r.shape[0] != x0.shape[0]:
        raise ValueError(f"r must have {x0.shape[0]} rows to match x0, got {r.shape[0]}")
    return _refine_batch(x0, r, model, num_steps, damping)


@partial(jax.jit, static_argnums=(3,))
def _refine(x0: Array, r: Array, model: Any, num_steps: int, damping: float) -> RefineResult:
    def weighted_residual(x: Array, var: Array) -> Array:
        return compressed_residuals(r, model.mean(x), var) / jnp.sqrt(var)

    def variance(x: Array) -> Array:  # weights held constant within a step
        return jax.lax.stop_gradient(model.variance(x))

    def step(_, carry):
        x, lam, accepted = carry
        var = variance(x)
        e = weighted_residual(x, var)
        jac = jax.jacfwd(weighted_residual)(x, var)
        a = jac.T @ jac
        g = jac.T @ e
        dx = jnp.linalg.solve(a + lam * jnp.diag(jnp.diag(a)), -g)
        x_new = x + dx
        cost_old = jnp.sum(e**2)
        cost_new = jnp.sum(weighted_residual(x_new, variance(x_new)) ** 2)
        ok = jnp.isfinite(cost_new) & (cost_new < cost_old) & (x_new[2] > 0)
        return (
            jnp.where(ok, x_new, x),
            jnp.where(ok, lam / 3.0, lam * 4.0),
            accepted + ok.astype(jnp.int32),
        )

    init = (x0, jnp.asarray(damping, x0.dtype), jnp.zeros((), jnp.int32))
    x, _, accepted = jax.lax.fori_loop(0, num_steps, step, init)
    mean, var = model.mean(x), model.variance(x)
    cost = jnp.sum(compressed_residuals(r, mean, var) ** 2 / var)
    return RefineResult(x=x, cpo=wrap(cpo_estimate(r, mean, var)), cost=cost, num_accepted=accepted)


@partial(jax.jit, static_argnums=(3,))
def _refine_batch(x0: Array, r: Array, model: Any, num_steps: int, damping: float) -> RefineResult:
    return jax.vmap(_refine, in_axes=(0, 0, None, None, None))(x0, r, model, num_steps, damping)
