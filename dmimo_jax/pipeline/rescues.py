"""The cost gate of the online program as a loop of rescues, and its outcome as one status.

The Locator's first answer (coarse stage -> screen -> fine stage) is checked against the
cost gate (eq. 17: about chi-square with M - k - 4 degrees of freedom at the right position,
k APs left out). A row that fails, or whose coarse stage was unsure, is *pending*; each
rescue in turn takes some of the pending rows (at most a capacity of them, in one program:
:func:`~dmimo_jax.estimators.rows.on_rows`) and returns new answers for them; a row whose
new answer passes gets the rescue's :class:`Status` and is no longer pending. After the
last rescue, a row still pending is ``REJECTED``; a row that passes with no redundant AP
(M - k - 4 < 1: four APs fit any phases), or with more APs out than the noise-fit bound
allows, is ``UNVERIFIED``; a row a rescue could not fit in
its capacity is ``OVERFLOW`` (the Locator's call runs it again).

A rescue is a small object (a :class:`Rescue`): whether it runs for a Locator at all, which
pending rows it takes, how many it handles in one program, and how it runs them. A new rescue
is one new class passed in the Locator's ``rescues``; the gate (:func:`run_gate`) is not
edited.

The rescues of the package, in the Locator's order:

1. :class:`ExcludeFaults`: the first answer with faulty APs left out one at a time
   (:func:`~dmimo_jax.estimators.faults.exclude_faults`), status ``EXCLUDED``.
2. :class:`RegionSearch`: the whole region searched again (the phasor table's most coherent
   points, and with fault exclusion on, the best under the trimmed coherence, each refined
   without the APs it names: one body for the plain and the excluding search), status
   ``RECOVERED``.
3. :class:`DenseRecheck`: a dense window around answers that still fail with every AP in,
   when they are few (a shadow boundary one refinement cannot cross), status ``RECOVERED``.
"""

from __future__ import annotations

import dataclasses
import enum
from functools import partial
from typing import TYPE_CHECKING, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
from jax import Array

from dmimo_jax.estimators.faults import pick_excluding, region_candidates
from dmimo_jax.estimators.mle import RefineResult, refine_excluding
from dmimo_jax.estimators.rows import on_rows
from dmimo_jax.estimators.window import dense_recheck

if TYPE_CHECKING:
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


class Answer(NamedTuple):
    """The gate's answers (leading batch axis B): what a rescue reads and replaces."""

    screened: Array  # (B, 3) the screen's best point
    fine: RefineResult  # (B,) the fine answer
    excluded: Array  # (B, M) bool, the APs left out


class GateState(NamedTuple):
    """An :class:`Answer` per row and where the gate stands with it."""

    answer: Answer
    pending: Array  # (B,) bool: fails the gate so far (or its coarse stage was unsure)
    unsure: Array  # (B,) bool: the coarse stage was unsure (its first answer is not one)
    status: Array  # (B,) int32 :class:`Status` (``OVERFLOW`` once a rescue had no room)
    count: Array  # () int: the batch's real rows (a padded batch's padding takes no rescue)


class Rescue:
    """One rescue of the cost gate (module docstring): a frozen dataclass that says whether
    it runs for a Locator at all (static: a rescue that is off is not in the program), which
    pending rows it takes, how many it runs in one program, and how."""

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

    def run(self, loc: Locator, r: Array, answer: Answer) -> Answer:
        """New answers for the gathered rows ``r`` (n, M) whose answers are ``answer``."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class ExcludeFaults(Rescue):
    """The first answer with up to ``max_excluded`` faulty APs left out (when fault
    exclusion is on: ``Locator.excluding``)."""

    status: ClassVar[Status] = Status.EXCLUDED

    def enabled(self, loc: Locator) -> bool:
        return loc.excluding

    def takes(self, loc: Locator, state: GateState) -> Array:
        return ~state.unsure

    def run(self, loc: Locator, r: Array, answer: Answer) -> Answer:
        fine, excluded = loc.exclude(r, answer.fine, answer.excluded)
        return answer._replace(fine=fine, excluded=excluded)


@dataclasses.dataclass(frozen=True)
class RegionSearch(Rescue):
    """The whole region searched again: the phasor table's ``REGION_STARTS`` most coherent
    points and (fault exclusion on) ``EXCLUSION_STARTS - REGION_STARTS`` more by the
    trimmed coherence (:func:`~dmimo_jax.estimators.faults.region_candidates`), each refined
    under the screen's model, then under the fine model without the APs it names, then
    through the fault exclusion; the pick (:func:`~dmimo_jax.estimators.faults.pick_excluding`)
    is the most coherent starts' cheapest where it passes with every AP. It reads nothing of
    the rows' present answers (``answer`` may be None)."""

    status: ClassVar[Status] = Status.RECOVERED

    def takes(self, loc: Locator, state: GateState) -> Array:
        return jnp.ones_like(state.pending)

    def run(self, loc: Locator, r: Array, answer: Answer | None) -> Answer:
        s = loc.settings
        excluding = loc.excluding
        k = min(EXCLUSION_STARTS if excluding else REGION_STARTS, loc.table.grid.size)
        plain = min(REGION_STARTS, k)  # k - plain: the trimmed starts (none unless excluding)
        batch = r.shape[0]
        # the gate only reaches region_candidates' readmission with trimmed starts, which
        # need a cost gate (excluding): without one it is never read
        gate = s.cost_gate if excluding else 0.0
        xs, cost, out = region_candidates(
            r, loc.screen_model, loc.table, k, REGION_STEPS, k - plain, s.max_excluded, gate
        )
        first = jnp.argmin(jnp.where(jnp.isfinite(cost), cost, jnp.inf)[:, :plain], axis=1)
        rk, out = jnp.repeat(r, k, axis=0), out.reshape(batch * k, -1)
        steps = s.fine_steps
        fine = jax.vmap(lambda x, ri, o: refine_excluding(x, ri, loc.fine_model, o, steps))(
            xs.reshape(batch * k, 3).astype(r.dtype), rk, out
        )
        excluded = out
        if excluding:
            fine, excluded = loc.exclude(rk, fine, out)
        passed = loc.passes(fine.cost, excluded).reshape(batch, k)
        count = jnp.sum(excluded, axis=1).reshape(batch, k)
        pick = pick_excluding(fine.cost.reshape(batch, k), first, passed, count)
        flat = jnp.arange(batch) * k + pick
        return Answer(
            xs.reshape(batch * k, 3)[flat], jax.tree.map(lambda a: a[flat], fine), excluded[flat]
        )


@dataclasses.dataclass(frozen=True)
class DenseRecheck(Rescue):
    """A dense window (half-width lambda/4 at lambda/16) around the answers that still fail
    with every AP in, when at most ``recheck_fraction`` of the batch (at least one row)
    does (:func:`~dmimo_jax.estimators.window.dense_recheck`); more means the model itself
    misses, and a local search cannot help. Off without a cost gate or with
    ``recheck_fraction`` 0."""

    status: ClassVar[Status] = Status.RECOVERED

    def enabled(self, loc: Locator) -> bool:
        return loc.settings.cost_gate is not None and loc.settings.recheck_fraction > 0

    def takes(self, loc: Locator, state: GateState) -> Array:
        rows = state.pending & ~jnp.any(state.answer.excluded, axis=1)
        few = jnp.maximum(1, jnp.floor(loc.settings.recheck_fraction * state.count))
        return rows & (jnp.sum(rows) <= few)  # few of the real rows

    def capacity(self, loc: Locator, batch: int, capacity: int) -> int:
        return max(1, int(loc.settings.recheck_fraction * batch))

    def run(self, loc: Locator, r: Array, answer: Answer) -> Answer:
        fine = dense_recheck(
            r, loc.fine_model, answer.fine, loc.recheck_offsets, loc.region_low, loc.region_high
        )
        return answer._replace(fine=fine)


DEFAULT_RESCUES: tuple[Rescue, ...] = (ExcludeFaults(), RegionSearch(), DenseRecheck())
"""The Locator's rescues, in order (module docstring)."""


def initial_state(loc: Locator, answer: Answer, unsure: Array, count: Array) -> GateState:
    """The gate's state before any rescue: the rows of ``answer`` that fail the gate, or
    whose coarse stage was ``unsure``, are pending, among the first ``count`` (traced) of a
    padded batch."""
    real = jnp.arange(unsure.shape[0]) < count
    pending = (unsure | ~loc.passes(answer.fine.cost, answer.excluded)) & real
    return GateState(answer, pending, unsure, jnp.zeros(unsure.shape, jnp.int32), count)


def run_gate(loc: Locator, r: Array, state: GateState, capacity: int) -> GateState:
    """Every rescue of ``loc`` that is enabled, in turn, on its pending rows (module
    docstring). A row a rescue has no room for is ``OVERFLOW`` and no longer pending (the
    Locator's call runs it again). Traced."""
    for rescue in loc.settings.rescues:
        if not rescue.enabled(loc):
            continue
        rows = state.pending & rescue.takes(loc, state)
        room = rescue.capacity(loc, r.shape[0], capacity)
        answer, over = on_rows(rows, room, partial(rescue.run, loc), state.answer, r, state.answer)
        ok = loc.passes(answer.fine.cost, answer.excluded)
        done = rows & ~over
        status = jnp.where(done & ok, jnp.int32(rescue.status), state.status)
        state = state._replace(
            answer=answer,
            pending=jnp.where(done, ~ok, state.pending) & ~over,
            status=jnp.where(over, jnp.int32(Status.OVERFLOW), status),
        )
    return state


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
