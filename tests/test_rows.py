"""dmimo_jax.estimators.rows: the rare rows of a batch on a fixed capacity, inside jit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmimo_jax.estimators import capacity_for, chunk_for, on_rows


@pytest.mark.parametrize("chunk", [None, 3])
@pytest.mark.parametrize("capacity", [1, 3, 8, 20])
def test_marked_rows_are_replaced_up_to_the_capacity(capacity, chunk):
    mask = jnp.array([False, True, True, False, True, True, False, True, True, True] * 2)
    current = jnp.zeros(20)
    values = jnp.arange(20.0) + 1

    traced = []

    def fn(v):
        traced.append(v.shape)
        return 10 * v

    @jax.jit
    def run(mask, current, values):
        return on_rows(mask, capacity, fn, current, values, chunk=chunk)

    out, overflow = run(mask, current, values)
    assert traced == [(min(chunk or 1, capacity),)]  # one chunk in the program
    marked = np.flatnonzero(np.asarray(mask))
    taken, left = marked[:capacity], marked[capacity:]
    np.testing.assert_array_equal(np.asarray(out)[taken], 10 * np.asarray(values)[taken])
    np.testing.assert_array_equal(np.asarray(out)[left], 0.0)
    np.testing.assert_array_equal(np.flatnonzero(np.asarray(overflow)), left)
    assert not bool(jnp.any(out[~mask]))


def test_no_marked_row_runs_nothing_and_vmap_gives_the_same():
    calls = []

    def fn(v):
        calls.append(v.shape)  # traced once: one chunk of rows
        return v + 1

    mask = jnp.zeros(6, bool)
    out, overflow = on_rows(mask, 4, fn, jnp.zeros(6), jnp.arange(6.0))
    assert not bool(jnp.any(out)) and not bool(jnp.any(overflow))
    per_row = jax.vmap(lambda m, c, v: on_rows(m[None], 1, fn, c[None], v[None]))
    mask = jnp.array([True, False, True])
    out, _ = per_row(mask, jnp.zeros(3), jnp.arange(3.0))
    np.testing.assert_array_equal(np.asarray(out)[:, 0], [1.0, 0.0, 3.0])


def test_chunk_for_and_capacity_for():
    assert chunk_for(5) == 1 and chunk_for(16) == 1 and chunk_for(256) == 16
    assert capacity_for(1, 1 / 16) == 1 and capacity_for(6, 1 / 16) == 6
    assert capacity_for(4096, 1 / 16) == 256 and capacity_for(100, 0.0, minimum=1) == 1
