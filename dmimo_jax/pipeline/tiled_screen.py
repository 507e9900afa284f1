"""One candidate screen for the rows of every tile: the first pass of a
:class:`~dmimo_jax.pipeline.tiled.TiledLocator` over a batch spread across its tiles.

A tile's Locator screens its candidate cells cell by cell (one matrix product of a cell's
points with every row that names it) only when it has many rows; a batch spread over T
tiles gives each tile a few, and their screens run row by row, each row gathering its cells'
points alone. Here the tiles' cell tables are one table (:class:`TiledCellTable`: global
cell ``t * C + c`` is tile t's cell c), so the rows of every tile share one screen
(:func:`~dmimo_jax.pipeline.online.cell_starts`), cell by cell as soon as the batch holds as
many rows per tile hit as one tile's batch needs for it (:data:`BY_CELL_BATCH`). The stages
before and after the screen stay each tile's own (its classifier; its first answer and cost
gate: :meth:`~dmimo_jax.pipeline.Locator.from_starts`), one call per tile on the host.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from dmimo_jax.estimators import CellGrid, CellTable
from dmimo_jax.estimators.phasors import CellPoints, cell_points
from dmimo_jax.pipeline.batches import (
    bucket_for,
    jit_cache_size,
    padded_parts,
    program_jit,
    snug_parts,
)
from dmimo_jax.pipeline.locator import Locator, LocatorResult
from dmimo_jax.pipeline.online import BY_CELL_BATCH, ScreenSettings, cell_starts
from dmimo_jax.pytree import pytree_dataclass, static_field


@pytree_dataclass
class TiledCells:
    """The cells of T tiles whose cell grids differ only in their corner: global cell
    ``t * C + c`` is cell c of tile t (C cells a tile)."""

    grid: CellGrid
    """One tile's cell grid: the shape and cell size of every tile's (its corner unused)."""
    lows: Array
    """(T, 3) each tile's cells' lower corner, m."""

    @property
    def per_tile(self) -> int:
        """C, the cells of a tile."""
        return self.grid.num_cells

    @property
    def num_cells(self) -> int:
        """T * C."""
        return self.lows.shape[0] * self.per_tile

    def corner(self, index: Array) -> Array:
        """The lower corners (..., 3) of global cells ``index`` (...,), as their tile's
        :meth:`~dmimo_jax.estimators.CellGrid.corner`."""
        index = jnp.asarray(index)
        grid = dataclasses.replace(self.grid, low=self.lows[index // self.per_tile])
        return grid.corner(index % self.per_tile)


@pytree_dataclass
class TiledCellTable(CellPoints):
    """Every tile's :class:`~dmimo_jax.estimators.CellTable` as one (:meth:`of`): what the
    candidate screen reads (:attr:`rows` of global cells, their :attr:`cells`' corners,
    the points' :attr:`offsets`), so one screen serves the rows of every tile, each row's
    phases in its tile's AP order against its tile's cells. It holds the tiles' own table
    arrays (no copy): a gather of rows picks its tile's array (``lax.switch``)."""

    cells: TiledCells
    data: tuple[Array, ...]
    """Each tile's (N, 2K) float32 table rows (its :class:`CellTable`'s ``table.data``)."""
    grid_shape: tuple[int, int, int] = static_field()
    """The shape of each tile's table grid."""
    per_edge: int = static_field()
    spacing: float = static_field()

    @classmethod
    def of(cls, tables: Sequence[CellTable]) -> TiledCellTable:
        """The tiles' cell ``tables`` (one per tile, in tile order) as one.

        Raises:
            ValueError: tables that differ in cell grid shape, cell size, points, APs or
                dtype (tiles of one size and K give equal ones).
        """
        first = tables[0]
        kinds = {
            (t.cells.shape, t.cells.cell_size, t.per_edge, t.table.grid.shape,
             t.table.grid.spacing, t.table.data.shape, str(t.table.data.dtype))
            for t in tables
        }  # fmt: skip
        if len(kinds) > 1:
            raise ValueError(
                f"tables must share their cell grid shape, cell size, points and APs "
                f"(one per tile of one size and K), got {len(kinds)} kinds"
            )
        lows = jnp.stack([t.cells.low for t in tables])
        data = tuple(t.table.data for t in tables)  # the tiles' arrays themselves
        return cls(TiledCells(first.cells, lows), data, first.table.grid.shape, first.per_edge,
                   first.table.grid.spacing)  # fmt: skip

    @property
    def num_tiles(self) -> int:
        """T."""
        return len(self.data)

    @property
    def num_aps(self) -> int:
        """K, the APs of each tile."""
        return self.data[0].shape[1] // 2

    @property
    def corner_dtype(self) -> Any:
        """The dtype of the cells' corners (and of :attr:`offsets`)."""
        return self.cells.lows.dtype

    def rows(self, cell: Array) -> Array:
        """The phasor rows (..., P, 2K) of global cells ``cell`` (...,), all of one tile
        (what the screens ask: one row's cells, or one cell; the first cell's tile is
        read); traced."""
        cell = jnp.asarray(cell, jnp.int32)
        index = cell_points(cell % self.cells.per_tile, self.cells.grid.shape,
                            self.grid_shape, self.per_edge)  # fmt: skip
        tile = jnp.clip(cell.reshape(-1)[0] // self.cells.per_tile, 0, self.num_tiles - 1)
        return jax.lax.switch(tile, [lambda i, d=d: d[i] for d in self.data], index)


def tile_results(
    quick: Sequence[Locator], table: TiledCellTable, r: np.ndarray, tiles: np.ndarray
) -> Iterator[tuple[int, np.ndarray, LocatorResult]]:
    """Each tile's results on its rows, the rows of all tiles screened as one: ``r`` (n, K)
    every row in its tile's APs, ``tiles`` (n,) its tile (``quick[t]`` its Locator, of
    ``table``'s tile t). Yields ``(t, rows, result)`` per tile hit, ``rows`` indices into
    ``r``: what ``quick[t](r[rows])`` gives (its coarse stage, screen, first answer and
    cost gate), to float rounding of the screen's products."""
    coarse = {}
    for t in np.unique(tiles):
        rows = np.flatnonzero(tiles == t)
        coarse[t] = (rows, _joined(rows.size, padded_parts(r[rows]),
                                   lambda p, t=t: _coarse(quick[t], jnp.asarray(p))))  # fmt: skip
    n = r.shape[0]
    rc = np.empty((n,) + r.shape[1:])
    cells = np.empty((n, quick[0].settings.num_cells), np.int32)
    probs = np.empty(cells.shape, np.float32)
    position = np.empty((n, 3))
    for t, (rows, (rt, ct, pt, xt)) in coarse.items():
        cells[rows] = ct + t * table.cells.per_tile
        rc[rows], probs[rows], position[rows] = rt, pt, xt
    by_cell = n >= BY_CELL_BATCH * len(coarse)  # as many rows per tile as one tile's batch
    starts, unsure = _joined(n, padded_parts(np.arange(n)), lambda i: _starts(
        table, rc[i], cells[i], probs[i], quick[0].settings.screen, by_cell))  # fmt: skip
    for t, (rows, _) in coarse.items():
        loc = quick[t]
        outs = []
        for start, count, size in _parts(rows.size):
            i = rows[start : start + count]
            args = (next(padded_parts(a[i], (size,)))[1] for a in (rc, position, starts, unsure))
            out = _from_starts(loc, *args, loc.capacity_for(size), np.int32(i.size))
            outs.append(jax.tree.map(lambda a, k=i.size: np.asarray(a)[:k], out))
        yield int(t), rows, jax.tree.map(lambda *a: np.concatenate(a), *outs)


def _parts(n: int) -> Iterator[tuple[int, int, int]]:
    """``(start, rows, size)`` of ``n`` rows in :func:`~dmimo_jax.pipeline.batches.snug_parts`
    (a tile's rows are few: padding them to the next batch size would cost up to 4x), each
    run at its bucket's size."""
    start = 0
    for part in snug_parts(n):
        yield start, part, bucket_for(part)
        start += part


def _joined(n: int, parts: Any, fn: Any) -> Any:
    """``fn`` of each padded part, its real rows kept, joined on the host (n rows)."""
    outs = []
    for k, part in parts:
        outs.append(jax.tree.map(lambda a, k=k: np.asarray(a)[:k], fn(part)))
    return jax.tree.map(lambda *a: np.concatenate(a), *outs)


@jax.jit
def _coarse(loc: Locator, r: Array) -> tuple[Array, Array, Array, Array]:
    """The corrected rows, the coarse stage's cells and probabilities, and its position."""
    r = loc.corrected(r)
    coarse = loc.stage.coarse(loc, r)
    return r, coarse[0].astype(jnp.int32), coarse[1], loc.stage.position(coarse)


@partial(jax.jit, static_argnums=(4, 5))
def _starts(
    table: TiledCellTable,
    r: Array,
    cells: Array,
    probs: Array,
    settings: ScreenSettings,
    by_cell: bool,
) -> tuple[Array, Array]:
    """The screen's starts and unsure rows of every tile's rows (global ``cells``)."""
    starts, _, unsure, _ = cell_starts(jnp.asarray(r), jnp.asarray(cells), jnp.asarray(probs),
                                       table, settings, by_cell)  # fmt: skip
    return starts, unsure


_from_starts = program_jit(Locator.from_starts, static_argnums=5)


def compiled_programs() -> int:
    """The programs the first pass's jits hold in this process (each tile's coarse stage,
    the one screen, each tile's :meth:`~dmimo_jax.pipeline.Locator.from_starts`; per batch
    size, shared by every tile; -1 where this JAX does not report them): with
    :meth:`Locator.compiled_programs`, what a benchmark counts."""
    return jit_cache_size(_coarse, _starts, _from_starts)
