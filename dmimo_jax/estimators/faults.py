r"""Faulty APs (beyond the paper): detect the APs whose phases the others contradict, locate
with the rest.

A phase-coherent deployment is only as good as its weakest AP: one that lost its phase
synchronisation (an offset jump), stopped receiving (random phases), holds a stale value or
is blocked by a body (a few radians off) turns a micrometre answer into a wrong lobe. This
module is the fault detection and exclusion of GNSS receiver autonomous integrity monitoring
(RAIM) made for carrier phases, one snapshot at a time and traceable:

1. **Detect**: the ML cost (eq. 17) of the answer against the cost gate :math:`g\,(M - 4)`
   (about chi-square with M - 4 degrees of freedom at the right position); a fault makes
   it fail by orders of magnitude (a 1 rad residual at :math:`\sigma = 5\cdot10^{-4}` rad
   is :math:`4\cdot10^6`).
2. **Identify**: the AP whose wrapped residual is the largest in units of its own
   :math:`\sigma_m`, measured from a *robust* CPO (the median of the wrapped residuals of
   the APs still in; the least-squares CPO of eq. 15 would spread a faulty AP's residual
   over every AP).
3. **Exclude and re-fit**: that AP at infinite variance (it drops out of the CPO estimate,
   the cost and the Fisher information exactly:
   :func:`~dmimo_jax.estimators.mle.excluded_variance`), a few Levenberg-Marquardt steps
   from the answer, and the gate again with :math:`g\,(M - k - 4)` for k excluded APs.
   Up to ``max_excluded`` APs, one at a time (greedy: each re-fit moves the position back
   toward the healthy APs' answer, so the next-largest residual is the next fault).

An answer that no subset of at most ``max_excluded`` exclusions brings under the gate is
left as it was and reported as failing: a wrong lobe (the caller re-screens the whole
region and tries again) or more faults than allowed.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from dmimo_jax.estimators.grid import PhasorTable, grid_points
from dmimo_jax.estimators.mle import (
    RefineResult,
    excluded_variance,
    refine_batch_unchecked,
    refine_excluding,
)
from dmimo_jax.estimators.rows import passes_gate
from dmimo_jax.estimators.search import screen
from dmimo_jax.likelihood import compressed_residuals, wrap_corrected_residuals
from dmimo_jax.phase import wrap
from dmimo_jax.physics import PhaseModel


class ExclusionResult(NamedTuple):
    """Output of :func:`exclude_faults` (one snapshot; batched adds a leading axis)."""

    fine: RefineResult  # the answer with the excluded APs left out (cost over the rest)
    excluded: Array  # (M,) bool, the APs left out
    passed: Array  # () bool, the answer's cost is under the gate for the APs left


def robust_residuals(r: Array, mean: Array, variance: Array, excluded: Array) -> Array:
    r""":math:`|\mathrm{wrap}(r_m - \mu_m - \tilde\phi)|/\sigma_m` (M,) with :math:`\tilde\phi`
    the median of the wrap-corrected residuals (eq. 16) of the APs not ``excluded``, and 0
    for the excluded ones. One snapshot, traced."""
    e = wrap_corrected_residuals(r, mean)
    phi = jnp.nanmedian(jnp.where(excluded, jnp.nan, e))
    out = jnp.abs(wrap(e - phi)) / jnp.sqrt(jnp.where(excluded, 1.0, variance))
    return jnp.where(excluded, 0.0, out)


def exclude_faults(
    r: Array,
    fine: RefineResult,
    model: PhaseModel,
    gate: float,
    max_excluded: int,
    num_steps: int,
    excluded: Array | None = None,
) -> ExclusionResult:
    """Fault detection and exclusion for one snapshot ``r`` (M,) whose answer ``fine`` may
    fail the cost gate (module docstring). Traced and unchecked; ``gate``,
    ``max_excluded`` and ``num_steps`` (LM steps of each re-fit) static. ``excluded``: APs
    already out (default none). An answer under the gate is returned unchanged (nothing
    excluded), so a batch without faults gives today's answers."""
    m = r.shape[-1]
    excluded = jnp.zeros(m, bool) if excluded is None else excluded

    def cost_of(fit: RefineResult, mask: Array) -> Array:
        var = excluded_variance(model, mask)(fit.x)
        return jnp.sum(compressed_residuals(r, model.mean(fit.x), var) ** 2 / var)

    def step(_: int, carry: ExclusionResult) -> ExclusionResult:
        fine, excluded, passed = carry
        mean, var = model.mean(fine.x), model.variance(fine.x)
        score = robust_residuals(r, mean, var, excluded)
        trial = excluded.at[jnp.argmax(score)].set(True)
        fit = refine_excluding(fine.x, r, model, trial, num_steps)
        fit = fit._replace(cost=cost_of(fit, trial))
        take = ~passed & (jnp.sum(trial) <= m - 4)
        fine = jax.tree.map(lambda a, b: jnp.where(take, a, b), fit, fine)
        excluded = jnp.where(take, trial, excluded)
        return ExclusionResult(fine, excluded, passes_gate(fine.cost, gate, m, excluded))

    # a loop, not unrolled: one re-fit in the program whatever max_excluded (compile time)
    start = ExclusionResult(fine, excluded, passes_gate(fine.cost, gate, m, excluded))
    return jax.lax.fori_loop(0, max_excluded, step, start)


def region_candidates(
    r: Array, model: PhaseModel, table: PhasorTable, k: int, num_steps: int
) -> tuple[Array, Array]:
    """The whole-region screen's ``k`` most coherent grid points of each snapshot ``r``
    (B, M), each refined (``num_steps`` LM steps under ``model``), *before* the pick of
    the cheapest (:func:`~dmimo_jax.estimators.coarse_to_fine` keeps only that one):
    positions (B, k, 3) and ML costs (B, k). With a faulty AP the cheapest under the ML
    cost of every AP is often a wrong lobe while the right one is among the k (the
    coherence bounds each AP's share); :func:`pick_excluding` chooses after the exclusion.
    Traced, unchecked; ``k``, ``num_steps`` static."""
    batch = r.shape[0]
    _, cand = screen(r, table, k)
    x0 = grid_points(table.grid, cand).reshape(batch * k, 3).astype(r.dtype)
    fine = refine_batch_unchecked(x0, jnp.repeat(r, k, axis=0), model, num_steps)
    return fine.x.reshape(batch, k, 3), fine.cost.reshape(batch, k)


def pick_excluding(cost: Array, first: Array, passed: Array, num_excluded: Array) -> Array:
    """(B,) which of k candidates (B, k) to keep: ``first`` (the cheapest under every AP,
    what the search without fault exclusion keeps) when it passes the gate with none
    excluded; else the passing one with the fewest exclusions, then the lowest cost; else
    ``first``."""
    k = cost.shape[1]
    rows = jnp.arange(cost.shape[0])
    clean_first = passed[rows, first] & (num_excluded[rows, first] == 0)
    score = jnp.where(
        passed, num_excluded * 1e12 + jnp.where(jnp.isfinite(cost), cost, 1e11), jnp.inf
    )
    best = jnp.argmin(score, axis=1)
    return jnp.where(clean_first | ~jnp.any(passed, axis=1), first, best).astype(jnp.int32) % k
