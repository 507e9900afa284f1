"""Rare rows inside one XLA program: the piece that makes a search with fallbacks traceable.

A search whose rare snapshots need more work (the whole-region fallback of an unsure
classifier, the cost gate's re-screen, an EGS certificate that fails) cannot select those
rows on the host and stay one program. Here they run on a fixed **capacity** of rows
(:func:`on_rows`), so the whole online stage (:class:`~dmimo_jax.pipeline.Locator`) and the
MLE (:func:`~dmimo_jax.estimators.exact_mle`) trace into one program that ``jax.jit``,
``jax.vmap``, ``jax.sharding`` and ``jax.export`` take as it is (diffrax's ``diffeqsolve``
is the model: a static bound on the work, the outcome as a value):
``jnp.nonzero(mask, size=capacity)`` gathers them, a ``lax.switch`` over a few capacities
runs only the smallest that holds them (nothing when no row needs it), and the rows beyond
the capacity are reported in an ``overflow`` mask, never skipped silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax import Array


def capacity_for(batch: int, fraction: float, minimum: int = 8) -> int:
    """The largest number of rare rows a batch of ``batch`` rows handles in one program:
    ``ceil(fraction * batch)``, at least ``minimum``, at most ``batch`` and at least 1
    (static: ``batch`` is a shape). A small batch thus never overflows."""
    return int(min(max(math.ceil(fraction * batch), minimum, 1), max(batch, 1)))


def capacities(capacity: int) -> tuple[int, ...]:
    """The capacities :func:`on_rows` switches between, up to ``capacity``: 1, 8, 64, ...
    (powers of 8) and ``capacity`` itself, so a batch with a few rare rows runs a program of
    a few rows, not of ``capacity``; a capacity of at most 8 is the only one (fewer
    programs to compile)."""
    if capacity <= 8:
        return (capacity,)
    sizes = [c for c in (8**i for i in range(12)) if c < capacity]
    return (*sizes, capacity)


def on_rows(
    mask: Array,
    capacity: int,
    fn: Callable[..., Any],
    current: Any,
    *arrays: Array,
) -> tuple[Any, Array]:
    """``current`` with the rows where ``mask`` holds replaced by ``fn`` of those rows, at
    most ``capacity`` of them; and the (B,) mask of the rows that did not fit.

    ``fn(*(a[rows] for a in arrays))`` (each of ``arrays`` may be a pytree of (B, ...)
    arrays) returns a pytree shaped like ``current`` with
    ``len(rows)`` rows. Rows are taken in order (the first ``capacity`` marked rows); the
    program runs ``fn`` on the smallest of :func:`capacities` that holds them (padding rows
    repeat the first marked row and are dropped), and nothing when no row is marked.

    Args:
        mask: (B,) bool, the rows that need ``fn``.
        capacity: static, at least 1.
        fn: a traceable function of row-gathered ``arrays``.
        current: a pytree of (B, ...) arrays, the rows' present values.
        arrays: (B, ...) inputs of ``fn``.

    Returns:
        ``(updated, overflow)``: ``overflow`` (B,) bool marks the rows of ``mask`` beyond
        the capacity (they keep their ``current`` values).
    """
    batch = mask.shape[0]
    sizes = capacities(capacity)
    count = jnp.sum(mask, dtype=jnp.int32)

    def run(size: int) -> Callable[[Any], Any]:
        def branch(cur: Any) -> Any:
            (idx,) = jnp.nonzero(mask, size=size, fill_value=batch)
            safe = jnp.where(idx < batch, idx, idx[0])
            out = fn(*jax.tree.map(lambda a: a[safe], arrays))
            return jax.tree.map(
                lambda c, o: c.at[idx].set(o.astype(c.dtype), mode="drop"), cur, out
            )

        return branch

    branches = [lambda cur: cur] + [run(s) for s in sizes]
    which = jnp.where(
        count == 0, 0, 1 + jnp.searchsorted(jnp.asarray(sizes, jnp.int32), count, side="left")
    )
    updated = jax.lax.switch(jnp.minimum(which, len(sizes)), branches, current)
    rank = jnp.cumsum(mask.astype(jnp.int32))  # 1-based rank of each marked row
    return updated, mask & (rank > capacity)


def gate_limit(num_aps: int, gate: float) -> float:
    """The cost gate's threshold ``gate * (M - 4)`` (eq. 17: about chi-square with M - 4
    degrees of freedom at the right position)."""
    return float(gate) * max(num_aps - 4, 1)
