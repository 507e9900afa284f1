r"""Model-based MLE of Sec. II-D: gradient refinement of the ML cost (its costs and the CPO
compression live one floor below, in :mod:`dmimo_jax.likelihood`).

All functions take a **PhaseModel** (or a Scene, meaning its two-ray model), so the
same code serves the matched model, a mismatched one
(``TwoRayModel(scene.replace(eps_r=beta * scene.eps_r))``) and the GP model.

Shapes: ``r`` is one snapshot (M,) of wrapped phases; ``x`` one position (3,). Batch
with ``jax.vmap`` (or :func:`refine_batch`).

The unchecked cores (:func:`refine_batch_unchecked`, :func:`refine_multistart_unchecked`)
are plain functions that call their jitted bodies with every argument given: a jitted
function called once with a default left out and once with it passed compiles twice.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_away_from_aps,
    check_int,
    check_num_aps,
    check_phases,
    check_positions,
    check_scalar,
    warn_if_float32,
)
from dmimo_jax.estimators.lm import levenberg_marquardt
from dmimo_jax.likelihood import cpo_estimate
from dmimo_jax.phase import wrap
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.scene import Scene


class RefineResult(NamedTuple):
    """Output of :func:`refine` (shapes for one snapshot; batched adds a leading axis)."""

    x: Array
    """(3,) refined position, m."""
    cpo: Array
    """() CPO estimate at x, rad."""
    cost: Array
    """() ML cost at x."""
    num_accepted: Array
    """() int, accepted Levenberg-Marquardt steps."""


def refine(
    x0: ArrayLike,
    r: ArrayLike,
    model: PhaseModel | Scene,
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

    The solver is :func:`~dmimo_jax.estimators.lm.levenberg_marquardt` (a fixed number of
    steps; a rejected step leaves x unchanged and raises the damping).

    Args:
        x0: (3,) initial position (e.g. an EGS or POPT estimate), m.
        r: (M,) wrapped phases.
        model: PhaseModel or Scene.
        num_steps: LM iterations.
        damping: initial LM damping factor.

    Returns:
        :class:`RefineResult`.
    """
    model = _checked(model, x0, r, num_steps, damping, batched=False, caller="refine")
    return _refine(
        jnp.asarray(x0), jnp.asarray(r, jnp.asarray(x0).dtype), model, num_steps, damping
    )


def refine_batch(
    x0: ArrayLike,
    r: ArrayLike,
    model: PhaseModel | Scene,
    *,
    num_steps: int = 25,
    damping: float = 1e-3,
) -> RefineResult:
    """:func:`refine` for (N, 3) starts and (N, M) snapshots, jitted and vmapped."""
    model = _checked(model, x0, r, num_steps, damping, batched=True, caller="refine_batch")
    x0 = jnp.asarray(x0)
    r = jnp.asarray(r, x0.dtype)
    if r.shape[0] != x0.shape[0]:
        raise ValueError(f"r must have {x0.shape[0]} rows to match x0, got {r.shape[0]}")
    return refine_batch_unchecked(x0, r, model, num_steps, damping)


class Refined(NamedTuple):
    """Output of :func:`refine_with_model`: the refinement and the model at its answer."""

    fine: RefineResult
    mean: Array
    """(M,) the model's mean phases at fine.x."""
    variance: Array
    """(M,) its variances there (every AP's, the excluded ones' too)."""


def refine_with_model(
    x0: Array,
    r: Array,
    model: PhaseModel,
    num_steps: int | Array,
    damping: float,
    excluded: Array | None = None,
) -> Refined:
    r"""The refinement of :func:`refine` for one snapshot, traced and unchecked (``num_steps``
    a Python int or a traced int >= 0: one program for several step counts), with the model's
    mean and variance at its answer: Levenberg-Marquardt on the weighted residuals
    :math:`e_m = \mathrm{wrap}(r_m - \mu_m(\mathbf x) - \hat\phi(\mathbf x))/\sigma_m`
    (eq. 17) by :func:`~dmimo_jax.estimators.lm.levenberg_marquardt`, the CPO (eq. 15) and
    the model's values its extra output, the variances :math:`\sigma_m^2` its ``aux`` (held
    within a step); the APs of the (M,) bool mask ``excluded`` weigh nothing
    (:func:`excluded_variance`). A step evaluates the model once (its linearization at the
    trial point), so a call site holds one copy of the model and its tangent."""

    def weighted_residual(x: Array, var: Array) -> tuple[Array, tuple[Array, Array, Array]]:
        mean = model.mean(x)
        weight = var if excluded is None else jnp.where(excluded, jnp.inf, var)
        phi = cpo_estimate(r, mean, weight)
        return wrap(r - mean - phi) / jnp.sqrt(weight), (phi, mean, var)

    fit = levenberg_marquardt(
        weighted_residual,
        x0,
        num_steps=num_steps,
        damping=damping,
        aux_fn=model.variance,  # weights held constant within a step
        feasible=lambda x: x[2] > 0,
        has_extra=True,  # the CPO and the model's values at the final iterate
    )
    phi, mean, var = fit.extra
    fine = RefineResult(x=fit.x, cpo=wrap(phi), cost=fit.cost, num_accepted=fit.num_accepted)
    return Refined(fine, mean, var)


@partial(jax.jit, static_argnums=(3,))
def _refine(
    x0: Array, r: Array, model: PhaseModel, num_steps: int, damping: float, excluded=None
) -> RefineResult:
    return refine_with_model(x0, r, model, num_steps, damping, excluded).fine


def excluded_variance(model: PhaseModel, excluded: Array) -> Callable[[Array], Array]:
    """``x -> model.variance(x)`` with the APs of the (M,) bool mask ``excluded`` at infinite
    variance (how :func:`refine_with_model` weighs them): they drop out of the CPO estimate (eq. 15, weight 0), of the ML cost (eq. 17)
    and of the Fisher information (eq. 14) exactly, as an AP that hears nothing does."""
    return lambda x: jnp.where(excluded, jnp.inf, model.variance(x))


def refine_excluding(
    x0: Array, r: Array, model: PhaseModel, excluded: Array, num_steps: int
) -> RefineResult:
    """:func:`refine` of one snapshot (unchecked, traceable) with the APs of the (M,) bool
    mask ``excluded`` left out (:func:`excluded_variance`); ``num_steps`` static."""
    return _refine(x0, r, model, num_steps, 1e-3, excluded)


def refine_batch_unchecked(
    x0: Array, r: Array, model: PhaseModel, num_steps: int, damping: float = 1e-3
) -> RefineResult:
    """:func:`refine_batch`'s jitted core, without input checks: ``x0`` (N, 3) and ``r``
    (N, M) of one dtype, ``num_steps`` static (for callers that checked their inputs).
    Calls its jitted body with all five arguments (module docstring: one compile)."""
    return _refine_batch(x0, r, model, num_steps, damping)


@partial(jax.jit, static_argnums=(3,))
def _refine_batch(
    x0: Array, r: Array, model: PhaseModel, num_steps: int, damping: float
) -> RefineResult:
    return jax.vmap(_refine, in_axes=(0, 0, None, None, None))(x0, r, model, num_steps, damping)


class MultiStartResult(NamedTuple):
    """Output of :func:`refine_multistart` (leading batch axis B)."""

    x: Array
    """(B, 3) refined estimate of lowest ML cost."""
    cost: Array
    """(B,) its ML cost (eq. 17)."""
    index: Array
    """(B,) which start it came from."""


def refine_multistart(
    starts: ArrayLike,
    r: ArrayLike,
    model: PhaseModel | Scene,
    *,
    num_steps: int = 25,
    damping: float = 1e-3,
) -> MultiStartResult:
    r"""Refine K starts per snapshot (:func:`refine`) and keep the one of lowest ML cost.

    The common ending of the hierarchical search
    (:func:`~dmimo_jax.estimators.coarse_to_fine`) and of the online safeguard
    (:func:`~dmimo_jax.estimators.window_search`): refinement alone converges to the
    nearest local minimum of a cost that repeats every ~lambda/2, so several starts from
    a screen are refined and the best wins. Non-finite costs never win.

    Args:
        starts: (B, K, 3) start positions, m.
        r: (B, M) wrapped phases.
        model: PhaseModel or Scene.
        num_steps: as in :func:`refine`.
        damping: see ``num_steps``.

    Returns:
        :class:`MultiStartResult`.
    """
    model = as_phase_model(model)
    starts = jnp.asarray(starts)
    if starts.ndim != 3 or starts.shape[-1] != 3:
        raise ValueError(f"starts must have shape (B, K, 3), got {starts.shape}")
    _check_problem(model, "starts", starts.reshape(-1, 3), batched=True)
    check_phases("r", r, model.num_aps, batched=True)
    r = jnp.asarray(r, starts.dtype)
    if r.shape[0] != starts.shape[0]:
        raise ValueError(f"r must have {starts.shape[0]} rows to match starts, got {r.shape[0]}")
    check_lm_settings(num_steps, damping)
    return refine_multistart_unchecked(starts, r, model, num_steps, damping)


def refine_multistart_unchecked(
    starts: Array, r: Array, model: PhaseModel, num_steps: int, damping: float = 1e-3
) -> MultiStartResult:
    """:func:`refine_multistart`'s jitted core, without input checks: the searches that
    screened ``starts`` (B, K, 3) themselves call it (their inputs are checked once, at
    their own boundary). Calls its jitted body with all five arguments (module docstring)."""
    return _refine_multistart(starts, r, model, num_steps, damping)


@partial(jax.jit, static_argnums=(3,))
def _refine_multistart(
    starts: Array, r: Array, model: PhaseModel, num_steps: int, damping: float
) -> MultiStartResult:
    batch, k, _ = starts.shape
    rr = jnp.repeat(r, k, axis=0)
    fine = refine_batch_unchecked(starts.reshape(batch * k, 3), rr, model, num_steps, damping)
    cost = fine.cost.reshape(batch, k)
    j = jnp.argmin(jnp.where(jnp.isfinite(cost), cost, jnp.inf), axis=1)
    x = jnp.take_along_axis(fine.x.reshape(batch, k, 3), j[:, None, None], axis=1)[:, 0]
    return MultiStartResult(x, jnp.take_along_axis(cost, j[:, None], axis=1)[:, 0], j)


WIDE_LANES = 32
""":func:`best_start_then_refine` refines all starts at once (one pass of the batch's
``B * K`` lanes, then the fine pass on as many) when they are at most this many lanes, else
one start at a time (``K + 1`` passes of ``B`` lanes): a small batch's cost is the passes'
count, a large one's the lanes'."""


def best_start_then_refine(
    starts: Array,
    r: Array,
    model: PhaseModel,
    screen_steps: int,
    fine_steps: int,
    fine_model: PhaseModel | None = None,
    damping: float = 1e-3,
) -> tuple[Array, RefineResult]:
    """:func:`refine_multistart_unchecked` of ``starts`` (B, K, 3) and snapshots ``r``
    (B, M) for ``screen_steps``, then :func:`refine_batch_unchecked` of each row's best
    for ``fine_steps``, as one ``lax.fori_loop`` over passes with **one**
    Levenberg-Marquardt call site (its step count traced): a program that holds the model's
    linearization once instead of twice. Traced and unchecked; the same answers as the two
    calls (the best start is the first of lowest finite cost; the fine pass starts from it
    with the damping reset). A ``fine_model`` other than ``model`` (None: the same) refines
    the fine pass under it (then two call sites, one per model). Returns
    ``(screened, fine)``: the best screened point (B, 3) and the fine result (B,).

    Lanes: at most :data:`WIDE_LANES` starts (``B * K``) are refined together in one pass
    and the fine pass runs on as many lanes (the row's best repeated; lane 0 of each row
    read); more run one start per pass (``K`` passes of ``B`` lanes, keeping each row's
    best) and the fine pass on ``B``: the same Levenberg-Marquardt work as the two calls."""
    batch, k, _ = starts.shape
    starts = starts.astype(r.dtype)
    wide = batch * k <= WIDE_LANES
    passes = 2 if wide else k + 1
    lanes = batch * k if wide else batch
    rr = jnp.repeat(r, k, axis=0) if wide else r
    dtype = r.dtype
    blank = RefineResult(jnp.zeros((lanes, 3), dtype), jnp.zeros(lanes, dtype),
                         jnp.full(lanes, jnp.inf, dtype), jnp.zeros(lanes, jnp.int32))  # fmt: skip

    def run(x0: Array, steps: Array, screening: Array) -> RefineResult:
        def under(m: PhaseModel) -> RefineResult:
            one = lambda x, ri: refine_with_model(x, ri, m, steps, damping).fine
            return jax.vmap(one)(x0, rr)

        if fine_model is None or fine_model is model:
            return under(model)
        return jax.lax.cond(screening, lambda: under(model), lambda: under(fine_model))

    def finite(cost: Array) -> Array:
        return jnp.where(jnp.isfinite(cost), cost, jnp.inf)

    def body(p: Array, carry: tuple) -> tuple:
        best_x, best_cost, fine = carry
        screening = p < passes - 1
        if wide:
            x0 = jnp.where(screening, starts.reshape(lanes, 3), jnp.repeat(best_x, k, axis=0))
        else:
            pick = jnp.minimum(p, k - 1)
            x0 = jnp.where(screening, jax.lax.dynamic_index_in_dim(starts, pick, 1, False), best_x)
        res = run(x0, jnp.where(screening, screen_steps, fine_steps), screening)
        if wide:
            cost = finite(res.cost).reshape(batch, k)
            j = jnp.argmin(cost, axis=1)
            x = jnp.take_along_axis(res.x.reshape(batch, k, 3), j[:, None, None], axis=1)[:, 0]
            new_x, new_cost = x, jnp.take_along_axis(cost, j[:, None], axis=1)[:, 0]
        else:  # the first start, then a later one only where strictly better
            better = (p == 0) | (finite(res.cost) < best_cost)
            new_x = jnp.where(better[:, None], res.x, best_x)
            new_cost = jnp.where(better, finite(res.cost), best_cost)
        best_x = jnp.where(screening, new_x, best_x)
        best_cost = jnp.where(screening, new_cost, best_cost)
        fine = jax.tree.map(lambda a, b: jnp.where(screening, b, a), res, fine)
        return best_x, best_cost, fine

    init = (jnp.zeros((batch, 3), dtype), jnp.full(batch, jnp.inf, dtype), blank)
    best_x, _, fine = jax.lax.fori_loop(0, passes, body, init)
    if wide:
        fine = jax.tree.map(lambda a: a[::k], fine)
    return best_x, fine


def check_num_steps(num_steps: int) -> None:
    """``ValueError`` unless ``num_steps`` (Levenberg-Marquardt iterations) is an int >= 0."""
    check_int("num_steps", num_steps)


def check_lm_settings(num_steps: int, damping: float) -> None:
    """``ValueError`` unless ``num_steps`` is an int >= 0 and ``damping`` a finite number > 0
    (a NaN damping used to return the start unchanged, as if converged)."""
    check_num_steps(num_steps)
    check_scalar("damping", damping, positive=True)


def _checked(model, x0, r, num_steps, damping, *, batched: bool, caller: str) -> PhaseModel:
    """``model`` as a PhaseModel, with the starts, the phases and the LM settings of
    :func:`refine` / :func:`refine_batch` checked (``ValueError``) and float32 warned of."""
    model = as_phase_model(model)
    _check_problem(model, "x0", x0, batched=batched)
    check_phases("r", r, model.num_aps, batched=batched)
    warn_if_float32(caller)
    check_lm_settings(num_steps, damping)
    return model


def _check_problem(model: PhaseModel, name: str, x0: ArrayLike, batched: bool) -> None:
    check_num_aps(model.num_aps)
    check_positions(name, x0, batched=batched)
    check_away_from_aps(name, x0, model.scene.ap_positions)
