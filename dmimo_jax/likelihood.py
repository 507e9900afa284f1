r"""The likelihood of Sec. II-D: wrap-corrected residuals, the CPO compressed away, the ML and LS
costs (eqs. 15-18).

One floor below the estimators: the estimators minimize these costs, calibration maximizes
the likelihood they define over a model's unknowns, the tracker gates its updates with
them and the metrics score a phase model with them, all from here.

Shapes: ``r`` is one snapshot (M,) of wrapped phases (or a batch (..., M) where a function
says so); ``x`` one position (3,). The costs take a **PhaseModel** (or a Scene, meaning its
two-ray model).

The unchecked functions of residuals are jitted: called outside ``jax.jit`` (a script, an
eager ``jax.vmap``) each is one program per shape instead of a dispatch per operation;
inside a jitted caller they are inlined.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_phases
from dmimo_jax.phase import wrap
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.scene import Scene

__all__ = [
    "compressed_residuals",
    "cpo_estimate",
    "ls_cost",
    "ls_costs",
    "ml_cost",
    "wrap_corrected_residuals",
]


@jax.jit
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


@jax.jit
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


@jax.jit
def compressed_residuals(r: ArrayLike, mean: ArrayLike, variance: ArrayLike | None = None) -> Array:
    r"""Residuals with the CPO compressed away: :math:`\mathrm{wrap}(r_m - \theta_m - \hat\phi)`.

    The terms squared in eqs. (17)-(18); :math:`\hat\phi` from :func:`cpo_estimate` with
    the same ``variance`` (``None``: the LS case). Shapes as in :func:`cpo_estimate`.
    """
    r, mean = jnp.asarray(r), jnp.asarray(mean)
    phi = cpo_estimate(r, mean, variance)
    return wrap(r - mean - phi[..., None])


@jax.jit
def ls_costs(r: ArrayLike, theta: ArrayLike) -> Array:
    r"""LS costs of eq. (18), :math:`\sum_m \mathrm{wrap}(r_m - \theta_m - \hat\phi)^2`, of
    snapshots ``r`` (..., M) against model phases ``theta`` (..., M), broadcast: (...,).

    The one batched LS cost of the package (unchecked, traceable): the grid, window and
    cell screens re-rank with it and :func:`ls_cost` evaluates it at one position.
    """
    return jnp.sum(compressed_residuals(r, theta) ** 2, axis=-1)


def ml_cost(x: ArrayLike, r: ArrayLike, model: PhaseModel | Scene) -> Array:
    r"""ML cost :math:`C(\mathbf x) = \sum_m \sigma_m^{-2}\,\mathrm{wrap}(r_m - \mu_m(\mathbf x, \hat\phi))^2`, eq. (17).

    :math:`\sigma_m^2` is the model's variance at ``x``.
    """
    model = as_phase_model(model)
    check_phases("r", r, model.num_aps, batched=False)
    mean, var = model.mean(jnp.asarray(x)), model.variance(jnp.asarray(x))
    return jnp.sum(compressed_residuals(r, mean, var) ** 2 / var)


def ls_cost(x: ArrayLike, r: ArrayLike, model: PhaseModel | Scene) -> Array:
    r"""LS cost :math:`\tilde C(\mathbf x) = \sum_m \mathrm{wrap}(r_m - \mu_m(\mathbf x, \hat\phi))^2`, eq. (18)."""
    model = as_phase_model(model)
    check_phases("r", r, model.num_aps, batched=False)
    return ls_costs(r, model.mean(jnp.asarray(x)))
