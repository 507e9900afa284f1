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
import numpy as np
from jax import Array


class LMResult(NamedTuple):
    """Output of :func:`levenberg_marquardt`."""

    x: Array
    """The final iterate, shape of x0."""
    cost: Array
    """() squared residual norm at x (aux re-evaluated at x)."""
    num_accepted: Array
    """() int32, accepted steps."""
    extra: Any = None
    """With has_extra: the residual function's extra output at x."""


def solve_damped(m: Array, b: Array) -> Array:
    """``m^{-1} b`` for the damped normal matrix ``m`` (n, n), symmetric positive definite,
    and ``b`` (n,): an unrolled Cholesky factorization and two triangular substitutions for
    n <= 4 (straight-line code: no LU, no pivoting loop in the program; backward stable for
    a positive definite ``m``), :func:`jax.numpy.linalg.solve` above. A matrix that is not
    positive definite (rounding of a degenerate ``J^T J``) gives NaN, which the step's cost
    test rejects."""
    n = m.shape[-1]
    if n > 4:
        return jnp.linalg.solve(m, b)
    low = [[None] * n for _ in range(n)]
    for j in range(n):
        low[j][j] = jnp.sqrt(m[j, j] - sum(low[j][k] ** 2 for k in range(j)))
        for i in range(j + 1, n):
            low[i][j] = (m[i, j] - sum(low[i][k] * low[j][k] for k in range(j))) / low[j][j]
    y = [None] * n
    for i in range(n):
        y[i] = (b[i] - sum(low[i][k] * y[k] for k in range(i))) / low[i][i]
    x = [None] * n
    for i in reversed(range(n)):
        x[i] = (y[i] - sum(low[k][i] * x[k] for k in range(i + 1, n))) / low[i][i]
    return jnp.stack(x)


def levenberg_marquardt(
    residual_fn: Callable[[Array, Any], Any],
    x0: Array,
    *,
    num_steps: int,
    damping: float | Array = 1e-3,
    aux_fn: Callable[[Array], Any] | None = None,
    feasible: Callable[[Array], Array] | None = None,
    normal_fn: Callable[[Array, Any], tuple[Array, Array]] | None = None,
    has_extra: bool = False,
) -> LMResult:
    """Run ``num_steps`` Levenberg-Marquardt steps on ``residual_fn(x, aux)`` from ``x0``.

    Pure and traceable (no checks): call it inside ``jit``/``vmap``. One evaluation per
    step: a step linearizes the residuals at its trial point (the residuals and the Jacobian
    in one pass), and when the step is accepted they become the next step's; a first pass
    of the same loop body linearizes the start. So a program holds one copy of
    ``residual_fn`` (with its linearization) and one of ``aux_fn`` per call site, and the
    result's ``cost`` and ``extra`` are those of the final iterate without a further
    evaluation.

    Args:
        residual_fn: ``(x, aux) -> e`` (K,), differentiable in ``x``; with ``has_extra``,
            ``(x, aux) -> (e, extra)`` (an extra output at ``x``, e.g. a nuisance estimate,
            returned at the final iterate).
        x0: (n,) start.
        num_steps: number of steps: a Python int, or a traced int >= 0 (one program for
            several step counts; the loop is then a ``while_loop``).
        damping: initial damping factor :math:`\\lambda`.
        aux_fn: ``x -> aux`` evaluated at the current iterate and held constant (no
            gradient) within a step; default ``None`` passes ``None``.
        feasible: ``x -> bool``; a step to an infeasible point is rejected.
        normal_fn: ``(x, aux) -> (J^T J, J^T e)`` where the structure gives the normal
            equations cheaper than the linearization and the product (the default); they
            must equal them.
        has_extra: see ``residual_fn``.

    Examples:
        >>> import jax.numpy as jnp
        >>> res = lambda x, _: jnp.array([x[0] - 1.0, 10 * (x[1] - x[0] ** 2)])
        >>> out = levenberg_marquardt(res, jnp.array([-1.0, 1.0]), num_steps=50)
        >>> [round(float(v), 6) for v in out.x]
        [1.0, 1.0]
    """
    aux_of = (lambda x: None) if aux_fn is None else (lambda x: jax.lax.stop_gradient(aux_fn(x)))
    with_extra = residual_fn if has_extra else (lambda x, aux: (residual_fn(x, aux), None))

    def evaluate(x: Array, aux: Any) -> tuple[Array, Any, Array, Array]:
        """Residuals, extra output and the normal equations (J^T J, J^T e) at ``x``."""
        if normal_fn is not None:
            e, extra = with_extra(x, aux)
            return (e, extra, *normal_fn(x, aux))
        (e, extra), linear = jax.linearize(lambda y: with_extra(y, aux), x)
        jac = jax.vmap(linear)(jnp.eye(x.shape[0], dtype=x.dtype))[0].T
        return e, extra, jac.T @ jac, jac.T @ e

    def step(i, carry):
        x, lam, accepted, aux, cost, extra, a, g = carry  # all at x
        first = i == 0  # the start's evaluation, accepted as it is
        n = x.shape[0]
        eye = np.eye(n, dtype=bool)  # static: the diagonal by slices, not a gather
        d = jnp.stack([a[k, k] for k in range(n)])
        # a column of J that vanishes (a saturated parametrization) keeps a positive scale
        d = jnp.maximum(d, jnp.finfo(d.dtype).eps * jnp.max(d))
        m = jnp.where(first, jnp.asarray(eye, a.dtype), jnp.where(eye, a + lam * d[:, None], a))
        x_new = jnp.where(first, x, x + solve_damped(m, -g))
        aux_new = aux_of(x_new)
        e_new, extra_new, a_new, g_new = evaluate(x_new, aux_new)
        cost_new = jnp.sum(e_new**2)
        ok = jnp.isfinite(cost_new) & (cost_new < cost)
        if feasible is not None:
            ok = ok & feasible(x_new)
        take = first | ok
        pick = lambda new, old: jax.tree.map(lambda u, v: jnp.where(take, u, v), new, old)
        return (
            pick(x_new, x),
            jnp.where(first, lam, jnp.where(ok, lam / 3.0, lam * 4.0)),
            accepted + (ok & ~first).astype(jnp.int32),
            pick(aux_new, aux),
            pick(cost_new, cost),
            pick(extra_new, extra),
            pick(a_new, a),
            pick(g_new, g),
        )

    aux0 = aux_of(x0)
    if isinstance(num_steps, int) and num_steps == 0:
        e0, extra0 = with_extra(x0, aux0)
        return LMResult(x0, jnp.sum(e0**2), jnp.zeros((), jnp.int32), extra0)
    # one evaluation in the loop: iteration 0 evaluates the start, each later one the trial
    # point (its linearization becomes the next step's when the step is accepted)
    shapes = jax.eval_shape(evaluate, x0, aux0)
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    lam0 = jnp.asarray(damping, x0.dtype)
    init = (x0, lam0, jnp.zeros((), jnp.int32), aux0, jnp.sum(zeros[0] ** 2), *zeros[1:])
    x, _, accepted, _, cost, extra, _, _ = jax.lax.fori_loop(0, num_steps + 1, step, init)
    return LMResult(x, cost, accepted, extra)
