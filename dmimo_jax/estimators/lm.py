r"""The one Levenberg-Marquardt solver: the MLE refinement and the HI intersection use it.

Minimizes :math:`\|\mathbf e(\mathbf x)\|^2` for a small unknown ``x`` (here a position,
3 unknowns) from a start ``x0`` with the autodiff Jacobian. Each step solves

.. math:: (\mathbf J^\top\mathbf J + \lambda\,\mathrm{diag}(\mathbf J^\top\mathbf J))\,
   \Delta\mathbf x = -\mathbf J^\top\mathbf e,

accepts the step when the cost is finite, lower, and the new point is feasible (then
:math:`\lambda \leftarrow \lambda/3`), and otherwise keeps ``x`` and sets
:math:`\lambda \leftarrow 4\lambda`. A fixed number of steps keeps it jittable and
vmappable; a rejected step changes nothing but the damping, so extra steps are harmless.

Residuals may depend on auxiliary values held constant within a step (the MLE's weights
:math:`\sigma_m^{-2}`, re-evaluated at each iterate): pass ``aux_fn``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array


class LMResult(NamedTuple):
    """Output of :func:`levenberg_marquardt`."""

    x: Array  # the final iterate, shape of x0
    cost: Array  # () squared residual norm at x (aux re-evaluated at x)
    num_accepted: Array  # () int32, accepted steps


def levenberg_marquardt(
    residual_fn: Callable[[Array, Any], Array],
    x0: Array,
    *,
    num_steps: int,
    damping: float | Array = 1e-3,
    aux_fn: Callable[[Array], Any] | None = None,
    feasible: Callable[[Array], Array] | None = None,
    normal_fn: Callable[[Array, Any], tuple[Array, Array]] | None = None,
) -> LMResult:
    """Run ``num_steps`` Levenberg-Marquardt steps on ``residual_fn(x, aux)`` from ``x0``.

    Pure and traceable (no checks): call it inside ``jit``/``vmap``.

    Args:
        residual_fn: ``(x, aux) -> e`` (K,), differentiable in ``x``.
        x0: (n,) start.
        num_steps: number of steps (a Python int).
        damping: initial damping factor :math:`\\lambda`.
        aux_fn: ``x -> aux`` evaluated at the current iterate and held constant (no
            gradient) within a step; default ``None`` passes ``None``.
        feasible: ``x -> bool``; a step to an infeasible point is rejected.
        normal_fn: ``(x, aux) -> (J^T J, J^T e)`` where the structure gives the normal
            equations cheaper than ``jax.jacfwd`` and the product (the default); they must
            equal them.

    Examples:
        >>> import jax.numpy as jnp
        >>> res = lambda x, _: jnp.array([x[0] - 1.0, 10 * (x[1] - x[0] ** 2)])
        >>> out = levenberg_marquardt(res, jnp.array([-1.0, 1.0]), num_steps=50)
        >>> [round(float(v), 6) for v in out.x]
        [1.0, 1.0]
    """
    aux_of = (lambda x: None) if aux_fn is None else (lambda x: jax.lax.stop_gradient(aux_fn(x)))

    def step(_, carry):
        x, lam, accepted = carry
        aux = aux_of(x)
        e = residual_fn(x, aux)
        if normal_fn is None:
            jac = jax.jacfwd(residual_fn)(x, aux)
            a, g = jac.T @ jac, jac.T @ e
        else:
            a, g = normal_fn(x, aux)
        d = jnp.diag(a)
        # a column of J that vanishes (a saturated parametrization) keeps a positive scale
        d = jnp.maximum(d, jnp.finfo(d.dtype).eps * jnp.max(d))
        dx = jnp.linalg.solve(a + lam * jnp.diag(d), -g)
        x_new = x + dx
        cost_old = jnp.sum(e**2)
        cost_new = jnp.sum(residual_fn(x_new, aux_of(x_new)) ** 2)
        ok = jnp.isfinite(cost_new) & (cost_new < cost_old)
        if feasible is not None:
            ok = ok & feasible(x_new)
        return (
            jnp.where(ok, x_new, x),
            jnp.where(ok, lam / 3.0, lam * 4.0),
            accepted + ok.astype(jnp.int32),
        )

    init = (x0, jnp.asarray(damping, x0.dtype), jnp.zeros((), jnp.int32))
    x, _, accepted = jax.lax.fori_loop(0, num_steps, step, init)
    return LMResult(x, jnp.sum(residual_fn(x, aux_of(x)) ** 2), accepted)
