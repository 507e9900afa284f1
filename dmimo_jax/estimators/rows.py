"""Rare rows inside one XLA program: the piece that makes a search with fallbacks traceable.

A search whose rare snapshots need more work (the whole-region fallback of an unsure
classifier, the cost gate's re-screen, an EGS certificate that fails) cannot select those
rows on the host and stay one program. Here they run on a fixed **capacity** of rows
(:func:`on_rows`), so the whole online stage (:class:`~dmimo_jax.pipeline.Locator`) and the
MLE (:func:`~dmimo_jax.estimators.exact_mle`) trace into one program that ``jax.jit``,
``jax.vmap``, ``jax.sharding`` and ``jax.export`` take as it is (diffrax's ``diffeqsolve``
is the model: a static bound on the work, the outcome as a value):
``jnp.nonzero(mask, size=capacity)`` gathers them, a ``lax.while_loop`` runs them a chunk at
a time and stops after the last (nothing runs when no row needs it; the work is compiled
once, whatever the capacity), and the rows beyond the capacity are reported in an
``overflow`` mask, never skipped silently.

The cost gate lives here too, where the programs that re-run its failures use it:
:func:`passes_gate` (traced, with APs excluded) and :func:`cost_gate_failed` (on the host),
and :func:`bucket_size`, the padding of a host-selected part of rows to a few shapes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

MIN_CAPACITY = 16
"""The fewest rare rows a program handles (:func:`capacity_for`): it costs what 8 would
(:func:`on_rows` runs the marked rows one at a time below 32), and a batch of up to 16 rows
never needs a second program."""


def capacity_for(batch: int, fraction: float, minimum: int = MIN_CAPACITY) -> int:
    """The largest number of rare rows a batch of ``batch`` rows handles in one program:
    ``ceil(fraction * batch)``, at least ``minimum``, at most ``batch`` and at least 1
    (static: ``batch`` is a shape). A small batch thus never overflows."""
    return int(min(max(math.ceil(fraction * batch), minimum, 1), max(batch, 1)))


def chunk_for(capacity: int) -> int:
    """The rows :func:`on_rows` runs at a time for a ``capacity``: ``capacity // 16``, at
    least 1 (static). One rare row then costs one row's work for the capacities of batches
    up to 256 (the Locator's default capacity is a sixteenth of the batch), and a batch of
    4,096 takes its rare rows 16 at a time, at most 17 steps."""
    return max(1, int(capacity) // 16)


def on_rows(
    mask: Array,
    capacity: int,
    fn: Callable[..., Any],
    current: Any,
    *arrays: Array,
    chunk: int | None = None,
) -> tuple[Any, Array]:
    """``current`` with the rows where ``mask`` holds replaced by ``fn`` of those rows, at
    most ``capacity`` of them; and the (B,) mask of the rows that did not fit.

    ``fn(*(a[rows] for a in arrays))`` (each of ``arrays`` may be a pytree of (B, ...)
    arrays) returns a pytree shaped like ``current`` with ``len(rows)`` rows. Rows are taken
    in order (the first ``capacity`` marked rows), ``chunk`` at a time in a
    ``lax.while_loop`` that stops after the last marked row: nothing runs when no row is
    marked, and ``fn`` is compiled once, whatever the capacity (padding rows of the last
    chunk repeat its first row and are dropped).

    Args:
        mask: (B,) bool, the rows that need ``fn``.
        capacity: static, at least 1.
        fn: a traceable function of row-gathered ``arrays``.
        current: a pytree of (B, ...) arrays, the rows' present values.
        arrays: (B, ...) inputs of ``fn``.
        chunk: rows per step (static; default :func:`chunk_for` of ``capacity``).

    Returns:
        ``(updated, overflow)``: ``overflow`` (B,) bool marks the rows of ``mask`` beyond
        the capacity (they keep their ``current`` values).
    """
    batch = mask.shape[0]
    chunk = min(chunk_for(capacity) if chunk is None else int(chunk), capacity)
    steps = -(-capacity // chunk)
    count = jnp.minimum(jnp.sum(mask, dtype=jnp.int32), capacity)

    def body(state: tuple[Array, Any], idx: Array) -> tuple[Array, Any]:
        i, cur = state
        rows = jax.lax.dynamic_slice(idx, (i * chunk,), (chunk,))
        # padding repeats rows[0], marked while i * chunk < count (vmap may run a finished
        # row's body once more, its result discarded: clamped, so it reads a real row)
        safe = jnp.where(rows < batch, rows, jnp.minimum(rows[0], batch - 1))
        out = fn(*jax.tree.map(lambda a: a[safe], arrays))
        cur = jax.tree.map(lambda c, o: c.at[rows].set(o.astype(c.dtype), mode="drop"), cur, out)
        return i + 1, cur

    def loop(cur: Any) -> Any:  # the marked rows gathered here: nothing when none is marked
        (idx,) = jnp.nonzero(mask, size=steps * chunk, fill_value=batch)
        idx = jnp.where(jnp.arange(steps * chunk) < capacity, idx, batch)
        return jax.lax.while_loop(
            lambda s: s[0] * chunk < count, lambda s: body(s, idx), (jnp.int32(0), cur)
        )[1]

    # the loop under a cond: XLA hoists the loop-invariant part of fn (its work on tables)
    # out of a while loop, which would then run even when no row is marked
    updated = jax.lax.cond(count > 0, loop, lambda cur: cur, current)
    rank = jnp.cumsum(mask.astype(jnp.int32))  # 1-based rank of each marked row
    return updated, mask & (rank > capacity)


def gate_limit(num_aps: int, gate: float) -> float:
    """The cost gate's threshold ``gate * (M - 4)`` (eq. 17: about chi-square with M - 4
    degrees of freedom at the right position)."""
    return float(gate) * max(num_aps - 4, 1)


def passes_gate(cost: Array, gate: float, num_aps: int, excluded: Array) -> Array:
    """Whether ML costs ``cost`` (...) pass the cost gate of the APs left: ``gate * (M - k
    - 4)`` (at least ``gate``) for k of the ``num_aps`` APs ``excluded`` (..., M) (eq. 17
    over the APs left: one fewer degree of freedom per AP out); NaN fails. Traced."""
    left = num_aps - jnp.sum(excluded, axis=-1)
    return cost <= gate * jnp.maximum(left - 4, 1)


# ------------------------------------------------ the cost gate, and rows padded on the host


def bucket_size(n: int) -> int:
    """The padded size of a part of n rows: n rounded up to a multiple of 2^(b - 3), b the
    bit length of n (at most 4 sizes per octave, under 25% padding)."""
    q = 1 << max(int(n).bit_length() - 3, 0)
    return -(-int(n) // q) * q


def cost_gate_failed(cost: ArrayLike, num_aps: int, gate: float) -> np.ndarray:
    """The cost gate: which answers' ML cost (eq. 17, about chi-square with M - 4 degrees of
    freedom at the right position) exceeds ``gate * (M - 4)`` or is not finite (a bool array
    like ``cost``: a NaN answer fails)."""
    return ~(np.asarray(cost) <= gate * max(num_aps - 4, 1))
