"""The cost gate of the online program as a loop of rescues, and its outcome as one status.

The Locator's first answer (coarse stage -> screen -> fine stage) is checked against the
cost gate (eq. 17: about chi-square with M - k - 4 degrees of freedom at the right position,
k APs left out). A row that fails, or whose coarse stage was unsure, is *pending*; each
rescue in turn takes some of the pending rows (at most a capacity of them) and returns new
answers for them; a row whose new answer passes gets the rescue's :class:`Status` and is
no longer pending. After the last rescue, a row still pending is ``REJECTED``; a row that
passes with no redundant AP (M - k - 4 < 1: four APs fit any phases), or with more APs out
than the noise-fit bound allows, is ``UNVERIFIED``; a row a rescue could not fit in its
capacity is ``OVERFLOW`` (the Locator's call runs it again).

A rescue is a small object (a :class:`Rescue`): whether it runs for a Locator at all, which
pending rows it takes, how many it handles in one program, and how it runs them, as a few
Levenberg-Marquardt passes (:class:`Fit`) over *lanes* (:class:`Lanes`: ``width`` starts of
each row it works on) between a ``begin`` that lays out the lanes and a ``finish`` that
reads each row's answer from them. A new rescue is one new class passed in the Locator's
``rescues``; the gate (:func:`~dmimo_jax.pipeline.gate.run_gate`) is not edited.

**One loop, one refinement.** The gate (:func:`~dmimo_jax.pipeline.gate.run_gate`) is one
``lax.while_loop`` over the rescues, their jobs of rows and their passes: each iteration
lays out or updates the lanes (a ``lax.switch`` over the passes' small steps) and runs
*the* refinement, one Levenberg-Marquardt call site for every pass of every rescue (its step
count a traced value). So the program holds the model once for all rescues, however many
passes they make (each pass was a copy of the model and its linearization: most of the
program's size and compile time).

The rescues of the package, in the Locator's order:

1. :class:`ExcludeFaults`: the first answer with faulty APs left out one at a time
   (:func:`~dmimo_jax.estimators.faults.exclude_faults`' steps), status ``EXCLUDED``.
2. :class:`RegionSearch`: the whole region searched again (the phasor table's most coherent
   points, and with fault exclusion on, the best under the trimmed coherence, each refined
   without the APs it names, then through the fault exclusion), status ``RECOVERED``.
3. :class:`DenseRecheck`: a dense window around answers that still fail with every AP in,
   when they are few (a shadow boundary one refinement cannot cross), status ``RECOVERED``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from dmimo_jax.estimators.faults import (
    ExclusionResult,
    exclusion_limit,
    exclusion_taken,
    exclusion_trial,
    pick_excluding,
    region_starts,
    still_out_at,
    take_exclusion,
)
from dmimo_jax.estimators.mle import Refined, RefineResult, refine_with_model
from dmimo_jax.estimators.window import window_starts

if TYPE_CHECKING:
    from dmimo_jax.physics import PhaseModel
    from dmimo_jax.pipeline.locator import Locator

REGION_STARTS, REGION_STEPS = 8, 25  # the whole-region search's most coherent starts, LM steps
EXCLUSION_STARTS = 24  # with fault exclusion: the 8, then 16 ranked by the trimmed coherence
EXCLUSION_STEPS = 5  # LM steps of each re-fit without a faulty AP (at least the fine stage's)


class Status(enum.IntEnum):
    """How the Locator's answer for one snapshot came about (``LocatorResult.status``)."""

    LOCATED = 0  # the first answer passes the cost gate
    EXCLUDED = 1  # it passes with faulty APs left out (``excluded`` names them)
    RECOVERED = 2  # the whole region (or a dense window) was searched again, and it passes
    UNVERIFIED = 3  # it passes, but noise could too (no redundant AP, or too many left out)
    REJECTED = 4  # no rescue brought it under the gate (or it is not finite)
    OVERFLOW = 5  # a rescue had no room for this row in the program (the call re-runs it)


class LocatorResult(NamedTuple):
    """Output of :class:`Locator` (leading batch axis B; none for one (M,) snapshot).

    ``status`` is the outcome (:class:`~dmimo_jax.pipeline.rescues.Status`); the booleans
    ``rejected``, ``overflow``, ``recovered``, ``fallback`` and ``accepted`` are views of it.
    """

    x: Array
    """(B, 3) the fine estimates, m."""
    coarse: Array
    """(B, 3) the coarse position (for cells: the most likely cell's centre)."""
    screened: Array
    """(B, 3) the screen's refined best point."""
    cost: Array
    """(B,) ML cost (eq. 17) of ``x`` under the fine model, over the APs left."""
    cpo: Array
    """(B,) CPO estimate at ``x``."""
    excluded: Array
    """(B, M) bool: the APs left out as faulty (their phases contradict the rest)."""
    status: Array
    """(B,) int32 Status: located, excluded, recovered, unverified, rejected, overflow."""
    unsure: Array
    """(B,) bool: the coarse stage was unsure, so the whole region was searched."""

    @property
    def rejected(self) -> Array:
        """(B,) bool: no rescue brought the answer under the cost gate (or it is not finite)."""
        return self.status == Status.REJECTED

    @property
    def overflow(self) -> Array:
        """(B,) bool: a rescue had no room for the row in the program (traced calls only)."""
        return self.status == Status.OVERFLOW

    @property
    def recovered(self) -> Array:
        """(B,) bool: a rescue's search (the whole region, a dense window) gave the answer."""
        return self.status == Status.RECOVERED

    @property
    def fallback(self) -> Array:
        """(B,) bool: the whole region was searched (the coarse stage was unsure, or a
        rescue's search gave the answer)."""
        return self.unsure | self.recovered

    @property
    def accepted(self) -> Array:
        """(B,) bool: the answer passes the cost gate with at least one redundant AP
        (located, excluded or recovered)."""
        return self.status <= Status.RECOVERED


class Answer(NamedTuple):
    """The gate's answers (leading batch axis B): what a rescue reads and replaces."""

    screened: Array
    """(B, 3) the screen's best point."""
    fine: RefineResult
    """(B,) the fine answer."""
    excluded: Array
    """(B, M) bool, the APs left out."""


class GateState(NamedTuple):
    """An :class:`Answer` per row and where the gate stands with it."""

    answer: Answer
    pending: Array
    """(B,) bool: fails the gate so far (or its coarse stage was unsure)."""
    unsure: Array
    """(B,) bool: the coarse stage was unsure (its first answer is not one)."""
    status: Array
    """(B,) int32 :class:`Status` (``OVERFLOW`` once a rescue had no room)."""
    count: Array
    """() int: the batch's real rows (a padded batch's padding takes no rescue)."""


class Lanes(NamedTuple):
    """A rescue's work on n rows, ``width`` lanes each (leading axis L >= n * width; lane
    ``l < n * width`` belongs to row ``l // width``, the rest repeat lane 0 and are
    dropped). What :meth:`Rescue.begin` lays out, each :class:`Fit` refines and
    :meth:`Rescue.finish` reads."""

    r: Array
    """(L, M) the lane's snapshot."""
    x: Array
    """(L, 3) the next fit's starts."""
    out: Array
    """(L, M) bool: the APs the next fit leaves out."""
    fine: RefineResult
    """(L,) the lanes' answers so far."""
    excluded: Array
    """(L, M) bool: the APs their answers leave out."""
    passed: Array
    """(L,) bool: whether those pass the cost gate."""
    screened: Array
    """(L, 3) the screen's point of each lane."""
    best: Array
    """(L,) int32: a per-row choice of lane (the rescue's own use)."""
    mean: Array
    """(L, M) the fine model's mean at fine.x (where a fit set it)."""
    variance: Array
    """(L, M) its variance there."""


@dataclasses.dataclass(frozen=True)
class Fit:
    """One Levenberg-Marquardt pass of a rescue: ``steps`` steps under the Locator's
    ``"screen"`` or ``"fine"`` model from each lane's ``x`` without its ``out`` APs
    (:func:`~dmimo_jax.estimators.mle.refine_with_model`); ``prepare(loc, lanes)`` sets ``x`` and
    ``out`` before it (default: as they are), ``fold(loc, lanes, fit)`` takes its (L,)
    :class:`~dmimo_jax.estimators.mle.Refined` in (the answers and the model there). Two rescues that make the same
    pass share one ``Fit`` (equal objects: one step of the program's switch)."""

    steps: int
    model: str
    fold: Callable[[Locator, Lanes, Refined], Lanes]
    prepare: Callable[[Locator, Lanes], Lanes] | None = None


class Rescue:
    """One rescue of the cost gate (module docstring): a frozen dataclass that says whether
    it runs for a Locator at all (static: a rescue that is off is not in the program), which
    pending rows it takes, how many it runs in one program, and how: ``begin`` lays out
    ``width`` lanes per row, its :meth:`fits` refine them, ``finish`` reads each row's
    answer. A rescue without a refinement may define ``run`` alone."""

    status: ClassVar[Status]

    def enabled(self, loc: Locator) -> bool:
        """Whether the gate runs it for ``loc`` (static; default: always)."""
        return True

    def takes(self, loc: Locator, state: GateState) -> Array:
        """(B,) bool: the rows it would run (the gate keeps only the pending ones)."""
        raise NotImplementedError

    def capacity(self, loc: Locator, batch: int, capacity: int) -> int:
        """The rows it runs in one program (static; default: the Locator's ``capacity``)."""
        return capacity

    def width(self, loc: Locator) -> int:
        """Lanes per row (static; default 1)."""
        return 1

    def fits(self, loc: Locator) -> tuple[Fit, ...]:
        """Its refinement passes, in order (static; default none)."""
        return ()

    def begin(self, loc: Locator, r: Array, answer: Answer) -> Lanes:
        """The lanes (n * width) of the n gathered rows ``r`` (n, M) whose answers are
        ``answer`` (default: :meth:`run`'s answers, one lane per row)."""
        if type(self).run is Rescue.run:
            raise NotImplementedError(f"{type(self).__name__} defines neither begin nor run")
        return answer_lanes(self.run(loc, r, answer), r)

    def finish(self, loc: Locator, lanes: Lanes) -> Answer:
        """The n rows' answers from their lanes (default: lane ``l`` is row ``l``)."""
        return Answer(lanes.screened, lanes.fine, lanes.excluded)

    def run(self, loc: Locator, r: Array, answer: Answer) -> Answer:
        """New answers for the gathered rows ``r`` (n, M) whose answers are ``answer``: the
        rescue on its own (``begin``, each fit, ``finish``; the gate runs them in its loop)."""
        lanes = self.begin(loc, r, answer)
        for fit in self.fits(loc):
            lanes = (fit.prepare or _as_is)(loc, lanes)
            lanes = fit.fold(loc, lanes, refine_lanes(loc, lanes, fit.steps, fit.model))
        return self.finish(loc, lanes)


def _as_is(loc: Locator, lanes: Lanes) -> Lanes:
    return lanes


def answer_lanes(answer: Answer, r: Array, width: int = 1) -> Lanes:
    """Lanes of the rows' ``answer`` (n,), ``width`` per row: each starts at its row's answer
    with its APs out, ``passed`` False and ``best`` 0."""
    spread = lambda a: jnp.repeat(a, width, axis=0)
    fine, excluded = jax.tree.map(spread, answer.fine), spread(answer.excluded)
    zero, rr = jnp.zeros(excluded.shape[0], jnp.int32), spread(r)
    return Lanes(rr, fine.x, excluded, fine, excluded, zero > 0, spread(answer.screened), zero,
                 jnp.zeros_like(rr), jnp.ones_like(rr))  # fmt: skip


def model_of(loc: Locator, which: str) -> PhaseModel:
    """The Locator's ``"screen"`` or ``"fine"`` model (one model where ``fine="screen"``)."""
    return (
        loc.screen_model if which == "screen" or loc.settings.fine == "screen" else loc.fine_model
    )


def refine_lanes(loc: Locator, lanes: Lanes, steps: int | Array, which: str) -> Refined:
    """``steps`` LM steps (a Python int or traced) of every lane from ``lanes.x`` without
    its ``lanes.out`` APs under the Locator's ``which`` model (:func:`model_of`), and the
    model at the answers."""
    model = model_of(loc, which)
    return jax.vmap(lambda x, ri, o: refine_with_model(x, ri, model, steps, 1e-3, o))(
        lanes.x.astype(lanes.r.dtype), lanes.r, lanes.out
    )


def row_view(a: Array, width: int) -> Array:
    """The (n, width, ...) view of lanes ``a`` (L, ...), n = L // width (the rest dropped)."""
    n = a.shape[0] // width
    return a[: n * width].reshape((n, width) + a.shape[1:])


def lane_spread(a: Array, width: int, size: int) -> Array:
    """Per-row values ``a`` (n, ...) repeated over each row's ``width`` lanes, padded to
    ``size`` lanes by lane 0."""
    return pad_lanes(jnp.repeat(a, width, axis=0), size)


def pad_lanes(tree: Any, size: int) -> Any:
    """Every leaf of ``tree`` (l, ...) padded to ``size`` lanes by repeats of lane 0."""

    def pad(a: Array) -> Array:
        extra = size - a.shape[0]
        return a if extra == 0 else jnp.concatenate([a, jnp.repeat(a[:1], extra, axis=0)])

    return jax.tree.map(pad, tree)


# ------------------------------------------------------------------ fault exclusion


def _exclusion_prepare(loc: Locator, lanes: Lanes) -> Lanes:
    trial = jax.vmap(exclusion_trial)(lanes.r, lanes.mean, lanes.variance, lanes.excluded)
    return lanes._replace(x=lanes.fine.x, out=trial)


def _exclusion_fold(loc: Locator, lanes: Lanes, fit: Refined) -> Lanes:
    limit = _limit(loc)
    current = ExclusionResult(lanes.fine, lanes.excluded, lanes.passed)
    out = take_exclusion(current, fit.fine, lanes.out, loc.settings.cost_gate, limit)
    take = exclusion_taken(lanes.passed, lanes.out, limit)
    mean, variance = select_lanes(take, (fit.mean, fit.variance), (lanes.mean, lanes.variance))
    return lanes._replace(fine=out.fine, excluded=out.excluded, passed=out.passed, mean=mean,
                          variance=variance)  # fmt: skip


def _evaluated(loc: Locator, lanes: Lanes, fit: Refined) -> Lanes:
    """The model at the lanes' answers (a pass of no step: their answers unchanged)."""
    return lanes._replace(mean=fit.mean, variance=fit.variance)


def select_lanes(mask: Array, new: Any, old: Any) -> Any:
    """``new`` where the (L,) ``mask`` holds, else ``old`` (pytrees of (L, ...) arrays)."""
    pick = lambda a, b: jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
    return jax.tree.map(pick, new, old)


def _limit(loc: Locator) -> int:
    return exclusion_limit(loc.settings.max_excluded, loc.num_aps)


def exclusion_fits(loc: Locator) -> tuple[Fit, ...]:
    """The fault exclusion's passes (:func:`~dmimo_jax.estimators.faults.exclude_faults`'
    steps: the AP of the largest robust residual out, a re-fit of ``max(fine_steps,
    EXCLUSION_STEPS)`` steps, taken where the answer failed; up to the Locator's
    ``max_excluded`` in all); none when fault exclusion is off."""
    if not loc.excluding:
        return ()
    steps = max(loc.settings.fine_steps, EXCLUSION_STEPS)
    one = Fit(steps, "fine", _exclusion_fold, _exclusion_prepare)
    return (one,) * max(_limit(loc), 0)


EVALUATE = Fit(0, "fine", _evaluated)
"""A pass of no step: the fine model's mean and variance at the lanes' answers (what the
exclusion's first pass reads)."""


@dataclasses.dataclass(frozen=True)
class ExcludeFaults(Rescue):
    """The first answer with up to ``max_excluded`` faulty APs left out (when fault
    exclusion is on: ``Locator.excluding``)."""

    status: ClassVar[Status] = Status.EXCLUDED

    def enabled(self, loc: Locator) -> bool:
        return loc.excluding

    def takes(self, loc: Locator, state: GateState) -> Array:
        return ~state.unsure

    def fits(self, loc: Locator) -> tuple[Fit, ...]:
        return (EVALUATE, *exclusion_fits(loc))

    def begin(self, loc: Locator, r: Array, answer: Answer) -> Lanes:
        lanes = answer_lanes(answer, r)
        return lanes._replace(passed=loc.passes(answer.fine.cost, answer.excluded))


# ------------------------------------------------------------------ the whole region


@dataclasses.dataclass(frozen=True)
class RegionSearch(Rescue):
    """The whole region searched again: the phasor table's ``REGION_STARTS`` most coherent
    points and (fault exclusion on) ``EXCLUSION_STARTS - REGION_STARTS`` more by the
    trimmed coherence (:func:`~dmimo_jax.estimators.faults.region_starts`), each refined
    under the screen's model (``REGION_STEPS``), then under the fine model without the APs
    it names (:func:`~dmimo_jax.estimators.faults.still_out`), then through the fault
    exclusion; the pick (:func:`~dmimo_jax.estimators.faults.pick_excluding`) is the most
    coherent starts' cheapest where it passes with every AP. It reads nothing of the rows'
    present answers."""

    status: ClassVar[Status] = Status.RECOVERED

    def takes(self, loc: Locator, state: GateState) -> Array:
        return jnp.ones_like(state.pending)

    def width(self, loc: Locator) -> int:
        starts = EXCLUSION_STARTS if loc.excluding else REGION_STARTS
        return min(starts, loc.table.grid.size)

    def _plain(self, loc: Locator) -> int:  # the most coherent starts (the rest trimmed)
        return min(REGION_STARTS, self.width(loc))

    def fits(self, loc: Locator) -> tuple[Fit, ...]:
        steps = loc.settings.fine_steps
        return (
            Fit(REGION_STEPS, "screen", self._screened),
            Fit(steps, "fine", self._fitted),
            *exclusion_fits(loc),
        )

    def begin(self, loc: Locator, r: Array, answer: Answer) -> Lanes:
        k = self.width(loc)
        x0, suspects = region_starts(
            r, loc.table, k, k - self._plain(loc), loc.settings.max_excluded or 0
        )
        lanes = answer_lanes(answer, r, k)
        x0, suspects = x0.reshape(-1, 3), suspects.reshape(-1, r.shape[1])
        return lanes._replace(x=x0, out=suspects, screened=x0)

    def _screened(self, loc: Locator, lanes: Lanes, fit: Refined) -> Lanes:
        k, x = self.width(loc), fit.fine.x
        gate = loc.settings.cost_gate if loc.excluding else 0.0  # read with trimmed starts only
        still = partial(still_out_at, gate=gate)
        out = jax.vmap(still)(lanes.r, fit.mean, fit.variance, lanes.out)
        cost = row_view(jnp.where(jnp.isfinite(fit.fine.cost), fit.fine.cost, jnp.inf), k)
        first = jnp.argmin(cost[:, : self._plain(loc)], axis=1).astype(jnp.int32)
        best = lane_spread(first, k, lanes.best.shape[0])
        return lanes._replace(x=x, out=out, screened=x, best=best)

    def _fitted(self, loc: Locator, lanes: Lanes, fit: Refined) -> Lanes:
        passed = loc.passes(fit.fine.cost, lanes.out)
        return lanes._replace(fine=fit.fine, excluded=lanes.out, passed=passed, mean=fit.mean,
                              variance=fit.variance)  # fmt: skip

    def finish(self, loc: Locator, lanes: Lanes) -> Answer:
        k = self.width(loc)
        view = lambda a: row_view(a, k)
        passed = view(loc.passes(lanes.fine.cost, lanes.excluded))
        count = view(jnp.sum(lanes.excluded, axis=1))
        pick = pick_excluding(view(lanes.fine.cost), view(lanes.best)[:, 0], passed, count)
        take = lambda a: jnp.take_along_axis(
            view(a), pick.reshape((-1, 1) + (1,) * (a.ndim - 1)), axis=1
        )[:, 0]
        return Answer(take(lanes.screened), jax.tree.map(take, lanes.fine), take(lanes.excluded))


# ------------------------------------------------------------------ the dense recheck


@dataclasses.dataclass(frozen=True)
class DenseRecheck(Rescue):
    """A dense window (half-width lambda/4 at lambda/16) around the answers that still fail
    with every AP in, when at most ``recheck_fraction`` of the batch (at least one row)
    does (:func:`~dmimo_jax.estimators.window.dense_recheck`'s search: the window's 32 best
    points refined 15 steps, the best 25 more, kept where its cost is lower); more means
    the model itself misses, and a local search cannot help. Off without a cost gate or
    with ``recheck_fraction`` 0."""

    status: ClassVar[Status] = Status.RECOVERED

    def enabled(self, loc: Locator) -> bool:
        return loc.settings.cost_gate is not None and loc.settings.recheck_fraction > 0

    def takes(self, loc: Locator, state: GateState) -> Array:
        rows = state.pending & ~jnp.any(state.answer.excluded, axis=1)
        few = jnp.maximum(1, jnp.floor(loc.settings.recheck_fraction * state.count))
        return rows & (jnp.sum(rows) <= few)  # few of the real rows

    def capacity(self, loc: Locator, batch: int, capacity: int) -> int:
        return max(1, int(loc.settings.recheck_fraction * batch))

    def width(self, loc: Locator) -> int:
        return min(32, loc.recheck_offsets.shape[0])

    def fits(self, loc: Locator) -> tuple[Fit, ...]:
        return (Fit(15, "fine", self._best), Fit(25, "fine", self._kept))

    def begin(self, loc: Locator, r: Array, answer: Answer) -> Lanes:
        k = self.width(loc)
        starts = window_starts(
            r, model_of(loc, "fine"), answer.fine.x, loc.recheck_offsets, loc.region_low,
            loc.region_high, k,
        )  # fmt: skip
        lanes = answer_lanes(answer, r, k)
        return lanes._replace(x=starts.reshape(-1, 3), out=jnp.zeros_like(lanes.out))

    def _best(self, loc: Locator, lanes: Lanes, fit: Refined) -> Lanes:
        k, fine = self.width(loc), fit.fine
        cost = row_view(jnp.where(jnp.isfinite(fine.cost), fine.cost, jnp.inf), k)
        j = jnp.argmin(cost, axis=1)
        x = jnp.take_along_axis(row_view(fine.x, k), j[:, None, None], axis=1)[:, 0]
        return lanes._replace(x=lane_spread(x, k, lanes.x.shape[0]))

    def _kept(self, loc: Locator, lanes: Lanes, fit: Refined) -> Lanes:
        better = fit.fine.cost < lanes.fine.cost  # every lane of a row holds the same fit
        return lanes._replace(fine=select_lanes(better, fit.fine, lanes.fine))

    def finish(self, loc: Locator, lanes: Lanes) -> Answer:
        first = lambda a: row_view(a, self.width(loc))[:, 0]
        return Answer(first(lanes.screened), jax.tree.map(first, lanes.fine), first(lanes.excluded))


DEFAULT_RESCUES: tuple[Rescue, ...] = (ExcludeFaults(), RegionSearch(), DenseRecheck())
"""The Locator's rescues, in order (module docstring)."""


def initial_state(loc: Locator, answer: Answer, unsure: Array, count: Array) -> GateState:
    """The gate's state before any rescue: the rows of ``answer`` that fail the gate, or
    whose coarse stage was ``unsure``, are pending, among the first ``count`` (traced) of a
    padded batch."""
    real = jnp.arange(unsure.shape[0]) < count
    pending = (unsure | ~loc.passes(answer.fine.cost, answer.excluded)) & real
    return GateState(answer, pending, unsure, jnp.zeros(unsure.shape, jnp.int32), count)


def final_status(loc: Locator, state: GateState) -> Array:
    """(B,) int32 :class:`Status` after the rescues: ``REJECTED`` where the answer still
    fails (or is not finite), ``UNVERIFIED`` where it passes with fewer than one redundant
    AP or with more APs left out than the noise-fit bound allows at the Locator's
    ``fit_risk`` (:func:`~dmimo_jax.bounds.noise_fit_probability`: noise could have
    passed), ``OVERFLOW`` and the rest as the gate left them."""
    k = jnp.sum(state.answer.excluded, axis=1)
    weak = loc.num_aps - k - 4 < 1
    allowed = loc.settings.most_excluded  # static
    if allowed is not None:
        weak = weak | (k > allowed)
    status = jnp.where(state.pending, jnp.int32(Status.REJECTED), state.status)
    accepted = status <= Status.RECOVERED
    return jnp.where(accepted & weak, jnp.int32(Status.UNVERIFIED), status)
