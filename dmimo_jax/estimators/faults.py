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

from dmimo_jax._checks import check_int
from dmimo_jax.estimators.grid import PhasorTable, grid_points
from dmimo_jax.estimators.mle import RefineResult, refine_excluding
from dmimo_jax.estimators.rows import passes_gate
from dmimo_jax.estimators.search import screen
from dmimo_jax.likelihood import wrap_corrected_residuals
from dmimo_jax.phase import wrap
from dmimo_jax.physics import PhaseModel

ROBUST_POOL = 1024  # the most coherent grid points re-ranked by the trimmed coherence


class ExclusionResult(NamedTuple):
    """Output of :func:`exclude_faults` (one snapshot; batched adds a leading axis)."""

    fine: RefineResult
    """The answer with the excluded APs left out (cost over the rest)."""
    excluded: Array
    """(M,) bool, the APs left out."""
    passed: Array
    """() bool, the answer's cost is under the gate for the APs left."""


def median_cpo_residuals(r: Array, mean: Array, variance: Array, excluded: Array) -> Array:
    r""":math:`|\mathrm{wrap}(r_m - \mu_m - \tilde\phi)|/\sigma_m` (M,) of every AP, with
    :math:`\tilde\phi` the median of the wrap-corrected residuals (eq. 16) of the APs not
    ``excluded`` (the least-squares CPO of eq. 15 would spread a faulty AP's residual over
    every AP). One snapshot, traced."""
    e = wrap_corrected_residuals(r, mean)
    phi = jnp.nanmedian(jnp.where(excluded, jnp.nan, e))
    return jnp.abs(wrap(e - phi)) / jnp.sqrt(variance)


def robust_residuals(r: Array, mean: Array, variance: Array, excluded: Array) -> Array:
    """:func:`median_cpo_residuals` of the APs not ``excluded``, 0 for the excluded ones (the
    exclusion's score: the largest is the next suspect). One snapshot, traced."""
    out = median_cpo_residuals(r, mean, jnp.where(excluded, 1.0, variance), excluded)
    return jnp.where(excluded, 0.0, out)


def exclusion_trial(r: Array, mean: Array, variance: Array, excluded: Array) -> Array:
    """The next exclusion's mask (M,): ``excluded`` and the AP of the largest
    :func:`robust_residuals` at the answer, where the model's mean and variance are
    ``mean`` and ``variance`` (M,). One snapshot ``r`` (M,), traced."""
    score = robust_residuals(r, mean, variance, excluded)
    return excluded.at[jnp.argmax(score)].set(True)


def exclusion_taken(passed: Array, trial: Array, limit: int) -> Array:
    """Where an exclusion step's re-fit replaces the answer: the answer fails the gate
    (not ``passed``) and ``trial`` (..., M) leaves out at most ``limit`` APs."""
    return ~passed & (jnp.sum(trial, axis=-1) <= limit)


def take_exclusion(
    current: ExclusionResult, fit: RefineResult, trial: Array, gate: float, limit: int
) -> ExclusionResult:
    """One exclusion step's outcome: the re-fit ``fit`` without the APs of ``trial`` replaces
    the ``current`` answer where that one fails the gate and ``trial`` leaves out at most
    ``limit`` APs; the gate (``gate`` per degree of freedom) checked again. Traced; shapes
    of one snapshot or batched alike."""
    take = exclusion_taken(current.passed, trial, limit)
    pick = lambda a, b: jnp.where(take.reshape(take.shape + (1,) * (a.ndim - take.ndim)), a, b)
    fine = jax.tree.map(pick, fit, current.fine)
    excluded = pick(trial, current.excluded)
    return ExclusionResult(fine, excluded, passes_gate(fine.cost, gate, trial.shape[-1], excluded))


def exclusion_limit(max_excluded: int, num_aps: int) -> int:
    """The most APs an answer may leave out: ``max_excluded``, and never so many that fewer
    than one redundant AP is left (M - k - 4 >= 1)."""
    return min(int(max_excluded), num_aps - 5)


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
    already out (default none); they count toward ``max_excluded``: an answer never leaves
    out more than ``max_excluded`` APs in all, nor so many that fewer than one redundant AP
    is left (M - k - 4 >= 1: with three coordinates and the CPO, four APs fit any phases,
    so the gate could no longer detect anything). An answer under the gate is returned
    unchanged (nothing excluded), so a batch without faults gives today's answers."""
    m = r.shape[-1]
    excluded = jnp.zeros(m, bool) if excluded is None else excluded
    limit = exclusion_limit(max_excluded, m)

    def step(_: int, carry: ExclusionResult) -> ExclusionResult:
        x = carry.fine.x
        trial = exclusion_trial(r, model.mean(x), model.variance(x), carry.excluded)
        # the re-fit's cost is eq. (17) over the APs left (the excluded at infinite variance)
        fit = refine_excluding(carry.fine.x, r, model, trial, num_steps)
        return take_exclusion(carry, fit, trial, gate, limit)

    # a loop, not unrolled: one re-fit in the program whatever max_excluded (compile time)
    start = ExclusionResult(fine, excluded, passes_gate(fine.cost, gate, m, excluded))
    return jax.lax.fori_loop(0, max(limit, 0), step, start)


def trimmed_coherence(
    rows: Array, r: Array, drop: int, iterations: int = 2, *, with_dropped: bool = False
) -> Array | tuple[Array, Array]:
    r"""Coherence with the ``drop`` least coherent APs left out (beyond the paper), of
    snapshots ``r`` (B, M) against phasor rows ``rows`` (B, N, 2M) (``[cos, sin]`` of
    the model phases :math:`\theta_{nm}`, :func:`~dmimo_jax.estimators.phasors.phasor_rows`):
    (B, N), at most 1.

    With :math:`z_m = e^{j(r_m - \theta_m)}` and :math:`u` the direction of
    :math:`\sum_m z_m` over the APs kept, each AP's share is :math:`\mathrm{Re}(z_m
    \bar u) = \cos(\arg z_m - \arg u)`; the ``drop`` smallest are left out and the
    direction taken again from the rest (``iterations`` times); the score is the mean
    share of the :math:`M - d` kept. At the right position the healthy APs' shares are all
    near 1 whatever the faulty ones do, so up to ``drop`` faulty APs cost it nothing,
    while the plain coherence :math:`|\sum_m z_m|^2/M^2` loses their share and a wrong
    lobe that happens to fit the faulty phases can outrank it. Traced, unchecked;
    ``drop`` (at least 1, below M) and ``iterations`` (at least 1) static. Equal shares
    drop in AP order (the lower index first). ``with_dropped``: also the (B, N, M) mask of
    the APs the last iteration dropped.

    Raises:
        ValueError: ``drop`` or ``iterations`` out of range.
    """
    check_int("drop", drop, minimum=1, maximum=r.shape[-1] - 1)
    check_int("iterations", iterations, minimum=1)
    score, dropped = _trim(rows, r, drop, iterations)
    return (score, dropped) if with_dropped else score


def _trim(rows: Array, r: Array, drop: int, iterations: int = 2) -> tuple[Array, Array]:
    """:func:`trimmed_coherence` (B, N) and the (B, N, M) mask of the APs it dropped."""
    m = r.shape[-1]
    c, s = rows[..., :m], rows[..., m:]
    cr = jnp.cos(r).astype(rows.dtype)[:, None, :]
    sr = jnp.sin(r).astype(rows.dtype)[:, None, :]
    re, im = cr * c + sr * s, sr * c - cr * s  # z_m = e^{j(r_m - theta_m)}, (B, N, M)
    keep = jnp.ones(re.shape, bool)
    for _ in range(iterations):
        sre = jnp.sum(jnp.where(keep, re, 0.0), axis=-1, keepdims=True)
        sim = jnp.sum(jnp.where(keep, im, 0.0), axis=-1, keepdims=True)
        share = (re * sre + im * sim) / jnp.maximum(jnp.hypot(sre, sim), 1e-30)
        low, worst = _lowest(share, drop)  # (B, N, drop): the lowest shares first
        keep = share > low[..., -1:]
    dropped = jnp.any(worst[..., None] == jnp.arange(m)[None, None, None], axis=-2)
    return (jnp.sum(share, axis=-1) + jnp.sum(-low, axis=-1)) / (m - drop), dropped


def _lowest(x: Array, d: int) -> tuple[Array, Array]:
    """The ``d`` smallest of ``x`` (..., M) along its last axis, smallest first, and their
    indices (equal values in index order: ``lax.top_k`` of ``-x``), as ``d`` passes of
    ``argmin`` (``d`` small and static: a pass is a reduction where a ``top_k`` sorts)."""
    values, indices = [], []
    place = jnp.arange(x.shape[-1]).reshape((1,) * (x.ndim - 1) + (-1,))
    for _ in range(d):
        j = jnp.argmin(x, axis=-1)
        values.append(jnp.take_along_axis(x, j[..., None], axis=-1)[..., 0])
        indices.append(j.astype(jnp.int32))
        x = jnp.where(place == j[..., None], jnp.inf, x)
    return jnp.stack(values, axis=-1), jnp.stack(indices, axis=-1)


def still_out(x: Array, r: Array, model: PhaseModel, suspects: Array, gate: float) -> Array:
    r"""The (M,) mask of the ``suspects`` that stay out (the rest rejoin) at a position ``x``
    fitted without them: a suspect whose residual from the robust CPO (the median of the others':
    :func:`median_cpo_residuals`) is within :math:`\sqrt{g}\,\sigma_m` rejoins (a healthy AP
    the trimmed coherence happened to drop); ``gate`` :math:`g` is the cost gate per degree
    of freedom. One snapshot (M,), traced."""
    return still_out_at(r, model.mean(x), model.variance(x), suspects, gate)


def still_out_at(r: Array, mean: Array, variance: Array, suspects: Array, gate: float) -> Array:
    """:func:`still_out` from the model's ``mean`` and ``variance`` (M,) at the position."""
    z = median_cpo_residuals(r, mean, variance, suspects)
    return suspects & ~(z**2 <= gate)


def region_starts(
    r: Array, table: PhasorTable, k: int, robust: int = 0, drop: int = 0
) -> tuple[Array, Array]:
    """The whole-region screen's ``k`` starts of each snapshot ``r`` (B, M) (B, k, 3) and
    the APs each leaves out (B, k, M) (the Locator's whole-region rescue refines them, each
    without its APs, then re-admits with :func:`still_out`): the first
    ``k - robust`` the most coherent grid points (nothing out), the last ``robust`` the best
    of the :data:`ROBUST_POOL` most coherent under :func:`trimmed_coherence` with ``drop``
    APs out (the APs it dropped). Traced, unchecked; ``k``, ``robust``, ``drop`` static."""
    batch, size, m = r.shape[0], table.grid.size, r.shape[1]
    pool = max(k, min(ROBUST_POOL, size)) if robust else k
    _, cand = screen(r, table, pool)
    suspects = jnp.zeros((batch, k - robust, m), bool)
    if robust:
        score, dropped = _trim(table.data[cand], r, drop)
        top = jax.lax.top_k(score, robust)[1]  # (B, robust) places in the pool
        best = jnp.take_along_axis(cand, top, axis=1)
        dropped = jnp.take_along_axis(dropped, top[:, :, None], axis=1)
        suspects = jnp.concatenate([suspects, dropped], axis=1)
        cand = jnp.concatenate([cand[:, : k - robust], best], axis=1)
    x0 = grid_points(table.grid, cand).reshape(batch, k, 3).astype(r.dtype)
    return x0, suspects


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
