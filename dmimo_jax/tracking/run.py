r"""Many UEs over time (beyond the paper): :func:`run_tracker` scans the filter's step
(:class:`~dmimo_jax.tracking.Tracker`) over the snapshots of a batch of UEs (``jax.vmap``
over UEs inside a ``lax.scan`` over time), in chunks with progress; :func:`medoid_start`
gives a start from single-snapshot estimates.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_finite,
    check_int,
    is_concrete,
    warn_if_float32,
)
from dmimo_jax.tracking.filter import Tracker, TrackOutput, TrackState, check_snapshots, step
from dmimo_jax.tracking.motion import start_in_region
from dmimo_jax.tracking.reacquire import medoid, needs_reacquisition, reacquire


def run_tracker(
    tracker: Tracker,
    state: TrackState,
    r: ArrayLike,
    valid: ArrayLike | None = None,
    *,
    ue_chunk: int = 1024,
) -> tuple[TrackState, TrackOutput]:
    """Track B UEs over T intervals: ``jax.lax.scan`` of :meth:`~dmimo_jax.tracking.filter.Tracker.update` over time,
    vmapped over UEs.

    The re-acquisition lattice is evaluated only at the steps where some UE needs it
    (a ``lax.cond`` on the whole batch), for at most ``tracker.settings.reacquire_batch`` UEs per
    step (the others stay due and follow at the next steps), so a locked batch costs one
    EKF update per UE and interval and memory stays bounded.

    UEs are tracked in chunks of ``ue_chunk``, each scanned over the whole time axis (a
    ``lax.map`` over chunks): one step touches every UE's state dozens of times, and a
    chunk's state stays in the CPU caches where 10,000 UEs' (over 20 MB) would not (the
    re-acquisition capacity then applies per chunk: where it is not reached, results do not
    depend on the chunking).

    Args:
        tracker: the :class:`~dmimo_jax.tracking.filter.Tracker`.
        state: :class:`~dmimo_jax.tracking.filter.TrackState` with a leading UE axis B (``jax.vmap(tracker.init)``).
        r: (T, B, M) wrapped phases, finite.
        valid: (T, B) bool, a snapshot was received (default all); rows marked ``False``
            are ignored (the filter only predicts: an outage).
        ue_chunk: UEs per chunk (see above).

    Returns:
        The final state and a :class:`~dmimo_jax.tracking.filter.TrackOutput` per step.
    """
    warn_if_float32("run_tracker")
    check_snapshots(r, tracker.num_aps, "(T, B, M)", 3)
    r = jnp.asarray(r, tracker.dt.dtype)
    t, b = r.shape[:2]
    if state.mean.ndim != 2 or state.mean.shape[0] != b:
        raise ValueError(
            f"state must hold B = {b} UEs to match r (a leading axis, from "
            f"jax.vmap(tracker.init)), got mean of shape {state.mean.shape}"
        )
    if is_concrete(state.mean):  # jax.vmap(tracker.init) skipped init's check of x0
        pos = np.asarray(state.mean, float)[:, :3]
        moved = start_in_region(tracker.motion, pos, "state")
        if not np.array_equal(moved, pos):
            mean = jnp.asarray(state.mean).at[:, :3].set(jnp.asarray(moved, state.mean.dtype))
            state = state._replace(mean=mean, prior_mean=mean)
    if valid is None:
        valid = jnp.ones((t, b), bool)
    else:
        valid = jnp.asarray(valid)
        if valid.shape != (t, b) or valid.dtype != bool:
            raise ValueError(
                f"valid must be a bool array of shape ({t}, {b}), got {valid.dtype} {valid.shape}"
            )
    check_int("ue_chunk", ue_chunk, minimum=1)
    return _run_chunked(tracker, state, r, valid, min(ue_chunk, b))


@partial(jax.jit, static_argnames=("chunk",))
def _run_chunked(tracker: Tracker, state: TrackState, r: Array, valid: Array, chunk: int):
    b = r.shape[1]
    if chunk >= b:
        return _run(tracker, state, r, valid)
    num = -(-b // chunk)
    pad = num * chunk - b  # padded with copies of the last UE, dropped at the end

    def split(a: Array, axis: int) -> Array:
        a = jnp.concatenate(
            [a, jnp.repeat(jax.lax.slice_in_dim(a, b - 1, b, axis=axis), pad, axis)], axis
        )
        a = jnp.moveaxis(a, axis, 0).reshape((num, chunk) + a.shape[:axis] + a.shape[axis + 1 :])
        return jnp.moveaxis(a, 1, axis + 1)

    def merge(a: Array, axis: int) -> Array:  # (num, ..., chunk at axis, ...) -> (..., B, ...)
        a = jnp.moveaxis(a, axis + 1, 1)
        a = a.reshape((num * chunk,) + a.shape[2:])[:b]
        return jnp.moveaxis(a, 0, axis)

    chunks = (jax.tree.map(lambda a: split(a, 0), state), split(r, 1), split(valid, 1))
    final, out = jax.lax.map(lambda c: _run(tracker, *c), chunks)
    return jax.tree.map(lambda a: merge(a, 0), final), jax.tree.map(lambda a: merge(a, 1), out)


def _run(tracker: Tracker, state: TrackState, r: Array, valid: Array):
    batch_step = jax.vmap(partial(step, axis_name="ues"), in_axes=(None, 0, 0, 0), axis_name="ues")

    def reacquire_one(args: tuple[TrackState, Array]) -> TrackState:
        # one UE at a time (each scores a lattice of thousands of points, enough work to
        # keep the machine busy), so that a UE that is not due, or whose certified screen
        # settles it, skips the rest (a vmapped branch would run for every UE); a padding
        # row (a copy of the last UE, dropped below) skips it too
        s, real = args
        due = real & needs_reacquisition(tracker, s)
        return jax.lax.cond(due, partial(reacquire, tracker), lambda s: s, s)

    num_ues = state.mean.shape[0]
    capacity = min(tracker.settings.reacquire_batch, num_ues)

    def reacquire_some(s: TrackState, due: Array) -> TrackState:
        # up to `capacity` due UEs per step; the others stay due and wait a step
        rows = jnp.nonzero(due, size=capacity, fill_value=num_ues)[0]
        sub = jax.tree.map(lambda a: jnp.take(a, rows, axis=0, mode="clip"), s)
        new = jax.lax.map(reacquire_one, (sub, rows < num_ues))
        return jax.tree.map(lambda a, n: a.at[rows].set(n, mode="drop"), s, new)

    def body(s, inputs):
        r_t, valid_t = inputs
        s = batch_step(tracker, s, r_t, valid_t)
        due = jax.vmap(needs_reacquisition, in_axes=(None, 0))(tracker, s)
        s = jax.lax.cond(jnp.any(due), reacquire_some, lambda s, due: s, s, due)
        position, cov = tracker.position(s)
        out = TrackOutput(position, cov, s.recent_nis[:, -1], s.lost, s.reacquired, s.locked)
        return s, out

    return jax.lax.scan(body, state, (r, valid))


def medoid_start(estimates: ArrayLike) -> Array:
    """A start for :meth:`~dmimo_jax.tracking.filter.Tracker.init` from single-snapshot estimates of the first few
    snapshots (K, 3) (or (B, K, 3)): the medoid, the estimate with the least summed
    distance to the others. A single snapshot lands on a wrong maximum of the comb, often
    metres away, with some probability p; the medoid of K is wrong only when about half
    of them are, so a few snapshots make a start the re-acquisition lattice (half-width
    lambda) can resolve. The UE moves between them (1.5 cm per 10 ms at walking speed):
    the start then carries that much error, well inside the lattice."""
    x = jnp.asarray(estimates)
    if x.ndim not in (2, 3) or x.shape[-1] != 3 or x.shape[-2] < 1:
        raise ValueError(f"estimates must have shape (K, 3) or (B, K, 3), got {x.shape}")
    check_finite("estimates", x)
    return medoid(x, jnp.ones(x.shape[:-1], bool))
