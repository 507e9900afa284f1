"""The cost gate's loop (:func:`run_gate`): every rescue of a Locator on its pending rows, as
one ``lax.while_loop`` over the rescues, their jobs of rows and their refinement passes,
with one Levenberg-Marquardt call site (:mod:`~dmimo_jax.pipeline.rescues` says what the
rescues are and how a row's outcome is named)."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jax import Array

from dmimo_jax.estimators.mle import Refined
from dmimo_jax.estimators.rows import chunk_for
from dmimo_jax.pipeline.rescues import (
    Answer,
    Fit,
    GateState,
    Lanes,
    Rescue,
    Status,
    pad_lanes,
    refine_lanes,
)

if TYPE_CHECKING:
    from dmimo_jax.pipeline.locator import Locator


def run_gate(loc: Locator, r: Array, state: GateState, capacity: int) -> GateState:
    """Every rescue of ``loc`` that is enabled, in turn, on its pending rows (module
    docstring), as one ``lax.while_loop`` with one refinement call site. A rescue takes its
    pending rows up to its capacity, a job of ``lanes // width`` rows at a time; a row it
    has no room for is ``OVERFLOW`` and no longer pending (the Locator's call runs it
    again). Nothing runs when no row is pending. Traced."""
    rescues = tuple(x for x in loc.settings.rescues if x.enabled(loc))
    batch = r.shape[0]
    if not rescues or batch == 0:
        return state
    plan = _Plan.of(loc, rescues, batch, capacity)

    def enter(i: Array, st: GateState) -> tuple[GateState, Array, Array]:
        """Rescue i's rows (its capacity of the pending rows it takes); overflow marked."""
        takes = [partial(lambda k, st: rescues[k].takes(loc, st), k) for k in range(len(rescues))]
        rows = st.pending & jax.lax.switch(i, takes, st)
        room = _at(plan.rooms, i)
        (idx,) = jnp.nonzero(rows, size=plan.slots, fill_value=batch)
        idx = jnp.where(jnp.arange(plan.slots) < room, idx, batch)
        over = rows & (jnp.cumsum(rows.astype(jnp.int32)) > room)
        st = st._replace(
            pending=st.pending & ~over,
            status=jnp.where(over, jnp.int32(Status.OVERFLOW), st.status),
        )
        return st, idx.astype(jnp.int32), jnp.minimum(jnp.sum(rows, dtype=jnp.int32), room)

    def seek(st: GateState, i: Array) -> tuple[GateState, Array, Array, Array]:
        """From rescue i on, the first that has rows (i = the number of rescues: none)."""

        def next_one(c):
            st, i, _, _ = c
            st, idx, n = enter(i, st)
            return st, i + 1, idx, n

        empty = (st, i, jnp.full(plan.slots, batch, jnp.int32), jnp.int32(0))
        st, i, idx, n = jax.lax.while_loop(
            lambda c: (c[3] == 0) & (c[1] < len(rescues)), next_one, empty
        )
        return st, jnp.where(n > 0, i - 1, len(rescues)), idx, n

    def job_rows(i: Array, idx: Array, j: Array) -> Array:
        """The (most) rows of rescue i's job j: its own ``plan.rows[i]`` first, then rows
        of the next job (a branch reads its first ``plan.rows[k]``)."""
        padded = jnp.concatenate([idx, jnp.full(plan.most, batch, jnp.int32)])
        return jax.lax.dynamic_slice(padded, (j * _at(plan.rows, i),), (plan.most,))

    def begin(i: Array, j: Array, idx: Array, st: GateState) -> Lanes:
        rows = job_rows(i, idx, j)
        safe = jnp.where(rows < batch, rows, jnp.minimum(rows[0], batch - 1))
        answer = jax.tree.map(lambda a: a[safe], st.answer)

        def branch(k: int):
            def lay_out(rk: Array, answer: Answer) -> Lanes:
                n = plan.rows[k]
                own = jax.tree.map(lambda a: a[:n], answer)
                return pad_lanes(rescues[k].begin(loc, rk[:n], own), plan.lanes)

            return lay_out

        return jax.lax.switch(i, [branch(k) for k in range(len(rescues))], r[safe], answer)

    def finish(i: Array, j: Array, idx: Array, st: GateState, lanes: Lanes) -> GateState:
        def branch(k: int):
            def read(lanes: Lanes) -> Answer:
                return pad_lanes(rescues[k].finish(loc, lanes), plan.most)

            return read

        new = jax.lax.switch(i, [branch(k) for k in range(len(rescues))], lanes)
        rows = job_rows(i, idx, j)
        rows = jnp.where(jnp.arange(plan.most) < _at(plan.rows, i), rows, batch)
        put = lambda c, o: c.at[rows].set(o.astype(c.dtype), mode="drop")
        answer = jax.tree.map(put, st.answer, new)
        done = jnp.zeros(batch, bool).at[rows].set(True, mode="drop")
        ok = loc.passes(answer.fine.cost, answer.excluded)
        status = jnp.where(done & ok, _at(plan.statuses, i), st.status)
        return st._replace(answer=answer, pending=jnp.where(done, ~ok, st.pending),
                           status=status)  # fmt: skip

    def step(c):
        st, i, idx, n, j, p, lanes = c
        lanes = jax.lax.cond(p == 0, lambda: begin(i, j, idx, st), lambda: lanes)
        phase = _at(plan.first, i) + p
        lanes = plan.run(loc, phase, lanes)
        last = p == _at(plan.passes, i) - 1

        def next_job():
            st2 = finish(i, j, idx, st, lanes)
            more = (j + 1) * _at(plan.rows, i) < n
            st3, i3, idx3, n3 = jax.lax.cond(
                more, lambda: (st2, i, idx, n), lambda: seek(st2, i + 1)
            )
            return st3, i3, idx3, n3, jnp.where(more, j + 1, 0), jnp.int32(0)

        st, i, idx, n, j, p = jax.lax.cond(last, next_job, lambda: (st, i, idx, n, j, p + 1))
        return st, i, idx, n, j, p, lanes

    def loop(st: GateState) -> GateState:
        st, i, idx, n = seek(st, jnp.int32(0))
        lanes = jax.eval_shape(lambda: begin(jnp.int32(0), jnp.int32(0), idx, st))
        lanes = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), lanes)
        init = (st, i, idx, n, jnp.int32(0), jnp.int32(0), lanes)
        return jax.lax.while_loop(lambda c: c[1] < len(rescues), step, init)[0]

    # under a cond: XLA hoists the loop-invariant part of the passes (their work on the
    # tables) out of a while loop, which would then run even when no row is pending
    return jax.lax.cond(jnp.any(state.pending), loop, lambda st: st, state)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """The static layout of :func:`run_gate`'s loop for one Locator and batch."""

    rooms: tuple[int, ...]  # each rescue's capacity (rows)
    rows: tuple[int, ...]  # each rescue's rows per job
    statuses: tuple[int, ...]  # each rescue's status
    lanes: int  # lanes of every job
    slots: int  # length of the row index of a rescue
    first: tuple[int, ...]  # each rescue's first phase
    passes: tuple[int, ...]  # its phases (at least one)
    fits: tuple[Fit | None, ...]  # the distinct passes (None: no refinement)
    phase_fit: tuple[int, ...]  # each phase's place in ``fits``

    @classmethod
    def of(cls, loc: Locator, rescues: tuple[Rescue, ...], batch: int, capacity: int) -> _Plan:
        rooms = tuple(max(1, min(x.capacity(loc, batch, capacity), batch)) for x in rescues)
        widths = [x.width(loc) for x in rescues]
        lanes = max(w * chunk_for(c) for w, c in zip(widths, rooms, strict=True))
        rows = tuple(max(1, lanes // w) for w in widths)
        slots = max(-(-c // n) * n for c, n in zip(rooms, rows, strict=True))
        fits: list[Fit | None] = []
        phase_fit, first, passes = [], [], []
        for rescue in rescues:
            own = rescue.fits(loc) or (None,)
            first.append(len(phase_fit))
            passes.append(len(own))
            for fit in own:
                if fit not in fits:
                    fits.append(fit)
                phase_fit.append(fits.index(fit))
        statuses = tuple(int(x.status) for x in rescues)
        return cls(rooms, rows, statuses, lanes, slots, tuple(first), tuple(passes), tuple(fits),
                   tuple(phase_fit))  # fmt: skip

    @property
    def most(self) -> int:
        """The most rows of a job (the largest of ``rows``)."""
        return max(self.rows)

    def run(self, loc: Locator, phase: Array, lanes: Lanes) -> Lanes:
        """Phase ``phase``'s pass on ``lanes``: its prepare, *the* refinement (one call
        site; the step count and the model picked by the phase), its fold."""
        fit_of = _at(self.phase_fit, phase)
        branches = lambda f: [partial(f, fit) for fit in self.fits]
        lanes = jax.lax.switch(fit_of, branches(_prepare), loc, lanes)
        steps = _at(tuple(f.steps if f else 1 for f in self.fits), fit_of)
        models = {f.model for f in self.fits if f} if loc.settings.fine != "screen" else set()
        if len(models) > 1:  # two models: two refinements (fine="model" only)
            screen = jnp.asarray([bool(f and f.model == "screen") for f in self.fits])[fit_of]
            fit = jax.lax.cond(
                screen,
                lambda: refine_lanes(loc, lanes, steps, "screen"),
                lambda: refine_lanes(loc, lanes, steps, "fine"),
            )
        else:
            fit = refine_lanes(loc, lanes, steps, "fine")
        return jax.lax.switch(fit_of, branches(_fold), loc, lanes, fit)


def _at(values: tuple[int, ...], i: Array) -> Array:
    """``values[i]`` for a traced index ``i`` (a static table of the plan)."""
    return jnp.asarray(values, jnp.int32)[i]


def _prepare(fit: Fit | None, loc: Locator, lanes: Lanes) -> Lanes:
    return lanes if fit is None or fit.prepare is None else fit.prepare(loc, lanes)


def _fold(fit: Fit | None, loc: Locator, lanes: Lanes, result: Refined) -> Lanes:
    return lanes if fit is None else fit.fold(loc, lanes, result)
