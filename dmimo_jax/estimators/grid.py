r"""Exhaustive grid search (EGS) of the LS cost, eq. (18): grids, phase tables, chunked search.

Grid points are cell centres ``low + (i + 1/2) * spacing`` of a box, so a 10 x 10 x 4 m
room at :math:`\lambda/8` has 213 x 213 x 85 = 3.86 M points (the paper's
:math:`V/\delta^3`) and no point lies on the ground. Points are generated from their
flat index inside each chunk, so the table-free path never stores the grid.

Two paths share one chunk kernel:

* table-free: model phases are computed per chunk (memory flat in the grid size);
* phase table (the paper's lookup table): ``phase_table`` precomputes the wrapped model
  phases once per grid (G x M); searches then only read it, for every snapshot.

Both scan over chunks of ``chunk_size`` points carrying the running minimum, so peak
memory is about ``batch * chunk_size * M`` floats whatever the grid size.
"""

from __future__ import annotations

import dataclasses
import math
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_finite, check_phases
from dmimo_jax.estimators.mle import compressed_residuals
from dmimo_jax.phase import wrap
from dmimo_jax.physics import as_phase_model

__all__ = ["Grid", "make_grid", "grid_points", "phase_table", "EgsResult", "egs"]


@partial(jax.tree_util.register_dataclass, data_fields=["low"], meta_fields=["spacing", "shape"])
@dataclasses.dataclass(frozen=True)
class Grid:
    """A uniform grid of cell centres: ``low + (index + 1/2) * spacing`` (a pytree).

    Attributes:
        low: (3,) lower corner of the box, m.
        spacing: cell size, m (static).
        shape: points per axis (static).
    """

    low: Array
    spacing: float
    shape: tuple[int, int, int]

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def make_grid(low: ArrayLike, high: ArrayLike, spacing: float) -> Grid:
    """The cell-centre grid of the box ``[low, high]`` with cells of ``spacing`` metres.

    Raises:
        ValueError: non-positive or non-finite spacing, or a box smaller than one cell.
    """
    if not (isinstance(spacing, (int, float)) and math.isfinite(spacing) and spacing > 0):
        raise ValueError(f"spacing must be a positive finite number of metres, got {spacing!r}")
    low_np, high_np = np.asarray(low, float), np.asarray(high, float)
    if low_np.shape != (3,) or high_np.shape != (3,):
        raise ValueError(f"low and high must have shape (3,), got {low_np.shape}, {high_np.shape}")
    check_finite("low", low_np)
    check_finite("high", high_np)
    counts = np.floor((high_np - low_np) / spacing + 1e-9).astype(int)
    if np.any(counts < 1):
        raise ValueError(f"box {low_np}..{high_np} is smaller than one cell of {spacing} m")
    return Grid(jnp.asarray(low_np), float(spacing), tuple(int(c) for c in counts))


def grid_points(grid: Grid, index: ArrayLike) -> Array:
    """Positions (..., 3) of flat grid indices (C order)."""
    ijk = jnp.stack(jnp.unravel_index(jnp.asarray(index), grid.shape), axis=-1)
    low = grid.low.reshape((1,) * (ijk.ndim - 1) + (3,))
    return low + (ijk.astype(grid.low.dtype) + 0.5) * grid.spacing


def phase_table(model: Any, grid: Grid, *, chunk_size: int = 65_536, dtype: Any = None) -> Array:
    """Wrapped model phases at every grid point, (G, M), computed in chunks.

    Args:
        model: PhaseModel or Scene.
        grid: the search grid.
        chunk_size: points per vmapped chunk.
        dtype: storage dtype (default: the grid's float dtype).
    """
    model = as_phase_model(model)
    dtype = grid.low.dtype if dtype is None else dtype
    return _phase_table(model, grid, min(chunk_size, grid.size), jnp.dtype(dtype))


@partial(jax.jit, static_argnames=("chunk_size", "dtype"))
def _phase_table(model: Any, grid: Grid, chunk_size: int, dtype: Any) -> Array:
    def one(i: Array) -> Array:  # lax.map with batch_size vmaps this over a chunk
        return wrap(model.mean(grid_points(grid, i))).astype(dtype)

    idx = jnp.arange(grid.size, dtype=jnp.int32)
    return jax.lax.map(one, idx, batch_size=chunk_size)


class EgsResult(NamedTuple):
    x: Array  # (B, 3) arg-min positions, m
    cost: Array  # (B,) minimal LS cost
    index: Array  # (B,) flat grid index of the arg-min


def _ls_costs(r: Array, theta: Array) -> Array:
    """LS cost (eq. 18) of snapshots r (B, M) against model phases theta (K, M): (B, K)."""
    return jnp.sum(compressed_residuals(r[:, None, :], theta[None, :, :]) ** 2, axis=-1)


def egs(
    r: ArrayLike,
    model: Any,
    grid: Grid,
    *,
    table: Array | None = None,
    chunk_size: int = 4096,
) -> EgsResult:
    r"""Exhaustive grid search of the LS cost, eq. (18), for one or many snapshots.

    Args:
        r: (M,) or (B, M) wrapped phases.
        model: PhaseModel or Scene (ignored for the phases when ``table`` is given).
        grid: search grid from :func:`make_grid`.
        table: optional (G, M) output of :func:`phase_table` for this grid.
        chunk_size: grid points per step; memory ~ B * chunk_size * M floats.

    Returns:
        :class:`EgsResult` with a leading batch axis (B = 1 for a single snapshot).
    """
    model = as_phase_model(model)
    check_phases("r", r, model.num_aps)
    r = jnp.asarray(r, grid.low.dtype)
    if r.ndim == 1:
        r = r[None, :]
    if grid.size >= 2**31:
        raise ValueError(f"grid has {grid.size} points; at most 2**31 - 1 are supported")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if table is not None and table.shape != (grid.size, model.num_aps):
        raise ValueError(f"table must have shape ({grid.size}, {model.num_aps}), got {table.shape}")
    return _egs(r, model, grid, table, min(chunk_size, grid.size))


@partial(jax.jit, static_argnames=("chunk_size",))
def _egs(r: Array, model: Any, grid: Grid, table: Array | None, chunk_size: int) -> EgsResult:
    n = grid.size
    num_chunks = -(-n // chunk_size)
    batch = r.shape[0]

    def body(carry, c):
        best_cost, best_idx = carry
        idx = c * chunk_size + jnp.arange(chunk_size, dtype=jnp.int32)
        valid = idx < n
        safe = jnp.minimum(idx, n - 1)
        if table is None:
            theta = jax.vmap(model.mean)(grid_points(grid, safe))
        else:
            theta = jnp.take(table, safe, axis=0).astype(r.dtype)
        costs = jnp.where(valid[None, :], _ls_costs(r, theta), jnp.inf)
        j = jnp.argmin(costs, axis=1)
        cost = jnp.take_along_axis(costs, j[:, None], axis=1)[:, 0]
        better = cost < best_cost
        return (jnp.where(better, cost, best_cost), jnp.where(better, idx[j], best_idx)), None

    init = (jnp.full((batch,), jnp.inf, r.dtype), jnp.zeros((batch,), jnp.int32))
    (cost, index), _ = jax.lax.scan(body, init, jnp.arange(num_chunks, dtype=jnp.int32))
    return EgsResult(grid_points(grid, index), cost, index)
