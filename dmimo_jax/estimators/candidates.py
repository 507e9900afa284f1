r"""Candidate cells (beyond the paper): screen a few cells of the UE region instead of all of it.

A learned coarse stage that names K candidate cells of a regular partition of the UE
region (:class:`CellGrid`, e.g. 1 m cubes) turns the safeguard into K small screens:
the model phasors of every cell are tabulated once (:func:`cell_table`: a
``spacing``-grid of each cell widened by ``margin``, float32 ``[cos, sin]`` rows, like
the paper's lookup table), the coherence
:math:`|\sum_m e^{j(r_m - \theta_m(\mathbf x))}|` of the candidate cells' points is one
gathered matrix product per snapshot (or, for a large batch, one product per table cell
with every snapshot naming it: :func:`starts_by_cell`), and the ``num_starts`` most
coherent points, each moved to the sub-grid peak of the coherence (:func:`subgrid_shift`),
start the multi-start refinement (:func:`~dmimo_jax.estimators.refine_multistart`) under
the same cheap model. :func:`candidate_search` returns the refined best point and its LS
cost.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    as_snapshot_batch,
    check_finite,
    check_int,
    check_num_aps,
    check_scalar,
    check_table_aps,
    is_concrete,
)
from dmimo_jax.estimators.grid import Grid, PhasorTable, phasor_table
from dmimo_jax.estimators.mle import check_num_steps, refine_multistart_unchecked
from dmimo_jax.estimators.phasors import (
    CellPoints,
    cell_points,
    coherence_weights,
    squared_coherence,
)
from dmimo_jax.estimators.rows import bucket_size
from dmimo_jax.likelihood import ls_costs
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.pytree import map_in_chunks, pytree_dataclass, static_field
from dmimo_jax.scene import Scene


@pytree_dataclass
class CellGrid:
    """A partition of a box into cubes of ``cell_size`` (the last cells may stick out).

    Attributes:
        low: (3,) lower corner, m.
        cell_size: edge of a cell, m (static).
        shape: cells per axis (static); flat index is C order.
    """

    low: Array
    cell_size: float = static_field()
    shape: tuple[int, int, int] = static_field()

    @property
    def num_cells(self) -> int:
        """The number of cells."""
        return math.prod(self.shape)

    def index(self, x: ArrayLike) -> Array:
        """Flat cell index (...,) of positions (..., 3); outside points go to the nearest cell.

        Raises:
            ValueError: concrete positions that are not finite (a NaN has no cell).
        """
        check_finite("x", x)
        x = jnp.asarray(x)
        low = jnp.broadcast_to(self.low.astype(x.dtype), x.shape)
        ijk = jnp.floor((x - low) / self.cell_size).astype(jnp.int32)
        top = jnp.broadcast_to(jnp.asarray(self.shape, jnp.int32) - 1, ijk.shape)
        ijk = jnp.clip(ijk, 0, top)
        return jnp.ravel_multi_index(tuple(jnp.moveaxis(ijk, -1, 0)), self.shape, mode="clip")

    def corner(self, index: ArrayLike) -> Array:
        """Lower corners (..., 3) of flat cell indices (...,)."""
        ijk = jnp.stack(jnp.unravel_index(jnp.asarray(index), self.shape), axis=-1)
        return jnp.broadcast_to(self.low, ijk.shape) + ijk.astype(self.low.dtype) * self.cell_size

    def centre(self, index: ArrayLike) -> Array:
        """Centres (..., 3) of flat cell indices."""
        return self.corner(index) + 0.5 * self.cell_size


def cell_grid(scene: Scene | PhaseModel, cell_size: float = 1.0) -> CellGrid:
    """The cells of ``cell_size`` metres covering the scene's UE region."""
    scene = getattr(scene, "scene", scene)
    check_scalar("cell_size", cell_size, positive=True)
    low, high = np.asarray(scene.ue_low, float), np.asarray(scene.ue_high, float)
    shape = tuple(int(n) for n in np.maximum(np.ceil((high - low) / cell_size - 1e-9), 1))
    return CellGrid(jnp.asarray(low), float(cell_size), shape)


@pytree_dataclass
class CellTable(CellPoints):
    """Model phasors of every cell, read from one phasor table of a grid aligned with the
    cells (:func:`cell_table`), so the cell screen and the whole-region screen share one
    table.

    The table's grid has ``per_edge`` spacings s per cell edge and starts half a spacing
    below the cells' corner: its points are ``cells.low - s/2 + i s`` and cell ``c``'s are
    the n x n x n block (n = ``per_edge`` + 2) from its corner minus s/2 to its far corner
    plus s/2, the cell widened by half a spacing on every face (a UE just outside a
    candidate cell is still next to a screened point). Neighbouring cells share the two
    layers of points of their common face.

    Attributes:
        cells: the :class:`CellGrid`.
        table: the :class:`~dmimo_jax.estimators.PhasorTable` of the aligned grid:
            ``[cos theta, sin theta]`` float32 rows.
        per_edge: grid spacings per cell edge (static).
    """

    cells: CellGrid
    table: PhasorTable
    per_edge: int = static_field()

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.table.num_aps

    @property
    def spacing(self) -> float:
        """The points' spacing, m (the cell edge over ``per_edge``)."""
        return self.table.grid.spacing

    @property
    def corner_dtype(self) -> Any:
        """The dtype of the cells' corners (and of :attr:`offsets`)."""
        return self.cells.low.dtype

    def rows(self, cell: Array) -> Array:
        """The phasor rows (..., P, 2M) of the points of cells ``cell`` (...,), in the
        order of :attr:`offsets` (a gather from the shared table; traced)."""
        index = cell_points(cell, self.cells.shape, self.table.grid.shape, self.per_edge)
        return self.table.data[index]


def cell_table(
    model: PhaseModel | Scene,
    cells: CellGrid,
    *,
    spacing: float | None = None,
    devices: Any = None,
    max_bytes: float = 8 * 2**30,
) -> CellTable:
    r"""Tabulate ``model``'s phasors on a grid aligned with ``cells`` (:class:`CellTable`):
    the largest spacing at most ``spacing`` that divides the cell edge, the grid half a
    spacing past the cells on every side. Its :attr:`CellTable.table` is a phasor table of
    the whole UE region as well (the region screens read it).

    Args:
        model: the (cheap) PhaseModel of the screen.
        cells: the partition.
        spacing: the largest point spacing (default :math:`\lambda/4`, as the safeguard's
            window).
        devices: devices to shard the table's rows over
            (:func:`~dmimo_jax.estimators.phasor_table`).
        max_bytes: refuse, before allocating, a table larger than this.

    Raises:
        ValueError: bad ``spacing``, a table above ``max_bytes``.
    """
    model = as_phase_model(model)
    lam = float(model.scene.wavelength)
    spacing = lam / 4 if spacing is None else spacing
    check_scalar("spacing", spacing, positive=True)
    per_edge = int(np.ceil(cells.cell_size / float(spacing) - 1e-9))
    s = cells.cell_size / per_edge
    shape = tuple(int(c) * per_edge + 2 for c in cells.shape)
    grid = Grid(cells.low - s, s, shape)
    check_scalar("max_bytes", max_bytes, positive=True)
    nbytes = grid.size * 2 * model.num_aps * 4
    if nbytes > max_bytes:
        raise ValueError(
            f"the cell table ({grid.size} points of {cells.num_cells} cells x "
            f"{2 * model.num_aps} float32) needs {nbytes / 2**30:.2f} GiB > max_bytes = "
            f"{max_bytes / 2**30:.2f} GiB: a coarser spacing, fewer APs per table "
            "(dmimo_jax.tiles) or a smaller region shrinks it; max_bytes raises the limit"
        )
    # checked above by its points: the table's padding to whole chunks adds under one chunk
    table = phasor_table(model, grid, devices=devices, max_bytes=math.inf)
    return CellTable(cells, table, per_edge)


def check_cell_table(table: CellTable, model: PhaseModel) -> None:
    """``ValueError`` unless ``table`` is a :class:`CellTable` of ``model``'s AP count whose
    phasor table's grid is aligned with its cells (what :func:`cell_table` builds)."""
    if not isinstance(table, CellTable):
        raise ValueError(
            f"table must be a CellTable (estimators.cell_table), got {type(table).__name__}"
        )
    check_table_aps(table, model)
    grid, cells, m = table.table.grid, table.cells, table.per_edge
    aligned = grid.shape == tuple(c * m + 2 for c in cells.shape) and math.isclose(
        grid.spacing * m, cells.cell_size, rel_tol=1e-9
    )
    if aligned and is_concrete(grid.low, cells.low):
        aligned = np.allclose(np.asarray(grid.low) + grid.spacing, np.asarray(cells.low))
    if not aligned:
        raise ValueError(
            f"table's grid ({grid.shape} points of {grid.spacing:.4g} m) is not aligned with "
            f"its {cells.shape} cells of {cells.cell_size} m (build it with "
            "estimators.cell_table)"
        )


class CandidateResult(NamedTuple):
    """Output of :func:`candidate_search` (leading batch axis B)."""

    x: Array
    """(B, 3) best refined point, m."""
    cost: Array
    """(B,) its LS cost (eq. 18) under the screen's model."""
    start: Array
    """(B, 3) the screened point it was refined from."""


class CellGroups(NamedTuple):
    """The cell-major screen's work list (:func:`cell_groups`): items of up to G snapshots
    that named the same table cell, and where each (snapshot, candidate) pair sits.

    Attributes:
        cell: (I,) the table cell of each item (padding items: cell 0, no snapshots).
        members: (I, G) the snapshots of each item; B (one past the last) marks an empty lane.
        item: (B, K) the item of each snapshot's candidate.
        lane: (B, K) its lane within that item.
    """

    cell: Array
    members: Array
    item: Array
    lane: Array


def cell_groups(cells: ArrayLike, num_cells: int) -> CellGroups | None:
    """Group a batch's candidate cells for the cell-major screen, or None to gather instead.

    The candidate screen can run snapshot by snapshot (gather the K candidate cells' rows,
    one matrix-vector product each: B x K cell reads, :func:`starts_by_snapshot`) or cell by
    cell (:func:`starts_by_cell`: one matrix product of a cell's rows with up to G
    snapshots that named it, so each read serves many snapshots). Grouping is chosen when
    the items' lanes (padded) are at most twice the pairs, with G = 16, or 8 when 16 pads
    too much; sparse batches gather (measurements: docs/learning_measurements.md). Host-side: ``cells``
    (B, K) must be concrete; the item count is padded by :func:`bucket_size` so few shapes
    ever compile.
    """
    cells = np.asarray(cells)
    if cells.ndim != 2 or cells.size == 0:
        return None
    count = np.bincount(cells.ravel(), minlength=num_cells)
    for size in (16, 8):
        blocks = -(-count // size)
        if blocks.sum() * size <= 2 * cells.size:
            break
    else:
        return None
    batch, named = cells.shape
    flat = cells.ravel()
    order = np.argsort(flat, kind="stable")  # pairs grouped by cell
    in_order = flat[order]
    rank = np.arange(flat.size) - (np.cumsum(count) - count)[in_order]  # within its cell
    item_sorted = (np.cumsum(blocks) - blocks)[in_order] + rank // size
    lane_sorted = rank % size
    used = int(blocks.sum())
    cell = np.zeros(bucket_size(used), np.int32)  # padding items: cell 0, empty lanes
    cell[:used] = np.repeat(np.arange(num_cells), blocks)
    members = np.full((cell.size, size), batch, np.int32)
    members[item_sorted, lane_sorted] = order // named
    item, lane = np.empty(flat.size, np.int32), np.empty(flat.size, np.int32)
    item[order], lane[order] = item_sorted, lane_sorted
    return CellGroups(
        *(
            jnp.asarray(v)
            for v in (cell, members, item.reshape(cells.shape), lane.reshape(cells.shape))
        )
    )


def candidate_search(
    r: ArrayLike,
    model: PhaseModel,
    table: CellTable,
    cells: ArrayLike,
    *,
    num_starts: int = 4,
    num_steps: int = 8,
    chunk: int = 8,
) -> CandidateResult:
    """Screen the candidate ``cells`` (B, K) of each snapshot and refine the best points.

    Args:
        r: (B, M) wrapped phases.
        model: the cheap PhaseModel ``table`` was built from.
        table: :func:`cell_table` of ``model``.
        cells: (B, K) flat cell indices per snapshot (e.g. a classifier's top K).
        num_starts: most coherent points per snapshot that start a refinement.
        num_steps: Levenberg-Marquardt steps per start.
        chunk: snapshots per gathered matrix product when screening snapshot by snapshot
            (bounds memory at chunk x K x P x 2M floats); large batches screen cell by
            cell (:func:`cell_groups`), same starts.

    Returns:
        :class:`CandidateResult`.
    """
    model = as_phase_model(model)
    check_num_aps(model.num_aps)
    r = as_snapshot_batch("r", r, model.num_aps)
    check_cell_table(table, model)
    cells = jnp.asarray(cells)
    if cells.ndim != 2 or cells.shape[0] != r.shape[0]:
        raise ValueError(f"cells must have shape ({r.shape[0]}, K), got {cells.shape}")
    if cells.size and not (0 <= int(cells.min()) and int(cells.max()) < table.cells.num_cells):
        raise ValueError(f"cells must index the {table.cells.num_cells} cells of the table")
    check_int("num_starts", num_starts, minimum=1)
    check_int("chunk", chunk, minimum=1)
    check_num_steps(num_steps)
    if num_starts > cells.shape[1] * table.points_per_cell:
        raise ValueError(f"num_starts={num_starts} exceeds the screened points")
    if r.shape[0] == 0:
        z = jnp.zeros((0, 3), r.dtype)
        return CandidateResult(z, jnp.zeros((0,), r.dtype), z)
    groups = cell_groups(cells, table.cells.num_cells)
    return candidate_search_unchecked(
        r, model, table, cells.astype(jnp.int32), num_starts, num_steps, chunk, groups
    )


@partial(jax.jit, static_argnums=(4, 5, 6))
def candidate_search_unchecked(
    r: Array,
    model: PhaseModel,
    table: CellTable,
    cells: Array,
    k: int,
    num_steps: int,
    chunk: int,
    groups: CellGroups | None,
) -> CandidateResult:
    """:func:`candidate_search`'s jitted core, without input checks: ``r`` (B, M), ``cells``
    (B, K) int32 indices of the table's cells, ``k`` starts of ``num_steps`` LM steps,
    ``chunk`` snapshots per gathered product (the three static); with ``groups``
    (:func:`cell_groups` of ``cells``) the screen runs cell by cell. Both orders pick the
    same starts."""
    if groups is None:
        x0 = starts_by_snapshot(r, table, cells, k, chunk)
    else:
        x0 = starts_by_cell(r, table, cells, k, groups)
    x0 = x0.at[..., 2].set(jnp.maximum(x0[..., 2], 1e-3))
    fine = refine_multistart_unchecked(x0, r, model, num_steps)
    start = jnp.take_along_axis(x0, fine.index[:, None, None], axis=1)[:, 0]
    cost = ls_costs(r, jax.vmap(model.mean)(fine.x))
    return CandidateResult(fine.x, cost, start)


def starts_by_snapshot(r: Array, table: CellTable, cells: Array, k: int, chunk: int) -> Array:
    """The ``k`` most coherent points (B, k, 3) of each snapshot's candidate ``cells``
    (B, K), snapshot by snapshot: gathered rows times one snapshot, ``chunk`` at a time."""

    per_cell = table.points_per_cell

    def starts(args):  # (k, 3) most coherent screened points of one snapshot
        ri, ci = args
        rows = table.rows(ci).reshape(-1, 2 * table.num_aps)  # (K P, 2M) [cos, sin]
        score = squared_coherence(rows, coherence_weights(ri[None, :]))[0]  # (K P,)
        _, idx = jax.lax.top_k(score, k)
        slot, point = idx // per_cell, idx % per_cell
        shift = subgrid_shift(table, score.reshape(-1, per_cell)[slot], point[:, None])[:, 0]
        return table.cells.corner(ci[slot]) + table.offsets[point] + shift  # (k, 3)

    return map_in_chunks(starts, (r, cells), chunk)


def starts_by_cell(r: Array, table: CellTable, cells: Array, k: int, groups: CellGroups) -> Array:
    """:func:`starts_by_snapshot`'s points, cell by cell: each item of ``groups``
    (:func:`cell_groups`) is one product of a table cell's rows with its snapshots; each
    cell's ``k`` best points per snapshot, then the ``k`` best of a snapshot's K cells
    (the same top ``k``)."""
    batch = r.shape[0]
    per_cell = min(k, table.points_per_cell)
    w = coherence_weights(r)  # (2M, 2B): real parts, then imaginary parts
    zero = jnp.zeros((w.shape[0], 1), w.dtype)  # the empty lane's snapshot
    real, imag = jnp.concatenate([w[:, :batch], zero], 1), jnp.concatenate([w[:, batch:], zero], 1)

    def best(args):  # (G, per_cell) best points of one cell for the item's snapshots
        c, who = args
        score = squared_coherence(table.rows(c), jnp.concatenate([real[:, who], imag[:, who]], 1))
        top, point = jax.lax.top_k(score, per_cell)
        return top, point, subgrid_shift(table, score, point)

    score, point, shift = jax.lax.map(best, (groups.cell, groups.members))
    score = score[groups.item, groups.lane].reshape(batch, -1)  # (B, K per_cell)
    point = point[groups.item, groups.lane].reshape(batch, -1)
    shift = shift[groups.item, groups.lane].reshape(batch, -1, 3)
    _, top = jax.lax.top_k(score, k)  # the k best of the snapshot's K cells' best
    cell = jnp.take_along_axis(cells, top // per_cell, axis=1)
    start = table.cells.corner(cell) + table.offsets[jnp.take_along_axis(point, top, axis=1)]
    return start + jnp.take_along_axis(shift, top[..., None], axis=1)


def subgrid_shift(table: CellTable, score: Array, point: Array) -> Array:
    r"""Shifts (..., k, 3) in metres from the table points ``point`` (..., k) of a cell to
    the peak of a parabola through the coherence amplitude :math:`\sqrt{\text{score}}` at
    each point and its two neighbours along each axis (``score`` (..., P): the squared
    coherences of the cell's points). Zero along an axis where the point lies on the
    cell grid's face or the amplitude is not concave there; at most half a spacing.

    The refinement then starts nearer the peak than the grid point (up to
    :math:`\sqrt 3/2` spacings from it), so fewer steps reach the same minimum.
    """
    n = table.points_per_side
    amp = jnp.sqrt(jnp.maximum(score, 0.0))
    at = lambda i: jnp.take_along_axis(amp, i, axis=-1)
    centre = at(point)
    spacing = table.spacing
    index = jnp.unravel_index(point, (n, n, n))
    shifts = []
    for axis, stride in enumerate((n * n, n, 1)):
        inside = (index[axis] > 0) & (index[axis] < n - 1)
        below = at(jnp.where(inside, point - stride, point))
        above = at(jnp.where(inside, point + stride, point))
        curvature = below - 2 * centre + above
        ok = inside & (curvature < 0)
        shift = jnp.where(ok, 0.5 * (below - above) / jnp.where(ok, curvature, -1.0), 0.0)
        shifts.append(jnp.clip(shift, -0.5, 0.5))
    return jnp.asarray(spacing, score.dtype) * jnp.stack(shifts, axis=-1)


# ----------------------------------------------------------------------------- traced tiers


def tiered_groups(cells: Array, count: Array, num_cells: int, size: int) -> CellGroups:
    """:func:`cell_groups` as traced code with a static bound: row ``b`` names its first
    ``count[b]`` cells of ``cells`` (B, K) (0 to K; the rest are not screened), grouped into
    items of ``size`` lanes. The item count is its bound ``ceil(B K / size) + min(num_cells,
    B K)`` (static); items past the used ones have no members (cell 0, every lane B) and
    pairs that are not screened have item I (one past the last: gathers clip, so mask
    them)."""
    batch, named = cells.shape
    pairs = batch * named
    bound = -(-pairs // size) + min(num_cells, pairs)
    valid = jnp.arange(named)[None, :] < count[:, None]
    flat = jnp.where(valid, cells, num_cells).ravel()
    order = jnp.argsort(flat, stable=True)
    in_order = flat[order]
    per_cell = jnp.bincount(flat, length=num_cells + 1)[:num_cells]
    blocks = -(-per_cell // size)
    first_item = jnp.cumsum(blocks) - blocks
    first_pair = jnp.cumsum(per_cell) - per_cell
    known = in_order < num_cells
    c = jnp.minimum(in_order, num_cells - 1)
    rank = jnp.arange(pairs) - first_pair[c]
    item_sorted = jnp.where(known, first_item[c] + rank // size, bound)
    lane_sorted = jnp.where(known, rank % size, 0)
    ends = jnp.cumsum(blocks)
    cell = jnp.searchsorted(ends, jnp.arange(bound), side="right").astype(jnp.int32)
    cell = jnp.where(cell < num_cells, cell, 0)
    members = jnp.full((bound, size), batch, jnp.int32)
    members = members.at[item_sorted, lane_sorted].set(
        (order // named).astype(jnp.int32), mode="drop"
    )
    item = jnp.zeros(pairs, jnp.int32).at[order].set(item_sorted.astype(jnp.int32))
    lane = jnp.zeros(pairs, jnp.int32).at[order].set(lane_sorted.astype(jnp.int32))
    return CellGroups(cell, members, item.reshape(cells.shape), lane.reshape(cells.shape))


def tiered_starts(
    r: Array,
    table: CellTable,
    cells: Array,
    count: Array,
    k: int,
    by_cell: bool,
    tiers: tuple[int, ...] = (),
) -> Array:
    """The ``k`` most coherent points (B, k, 3) of each row's first ``count[b]`` candidate
    ``cells`` (traced; :func:`starts_by_snapshot` / :func:`starts_by_cell` with a number of
    cells per row). ``by_cell`` (static) screens cell by cell (:func:`tiered_groups`; an
    item without members is skipped), else row by row (one row at a time: each gathers
    only the cells it names: the smallest of ``tiers`` (static) that holds its count)."""
    per_cell = table.points_per_cell
    named = cells.shape[1]
    if not by_cell:
        tiers = sorted({max(int(n), k_min(k, per_cell)) for n in tiers} | {named})

        def one(args):
            ri, ci, ni = args

            def screen(n):
                def run(_):
                    rows = table.rows(ci[:n]).reshape(-1, 2 * table.num_aps)
                    score = squared_coherence(rows, coherence_weights(ri[None, :]))[0]
                    _, idx = jax.lax.top_k(score, k)
                    slot, point = idx // per_cell, idx % per_cell
                    shift = subgrid_shift(table, score.reshape(-1, per_cell)[slot], point[:, None])
                    return table.cells.corner(ci[slot]) + table.offsets[point] + shift[:, 0]

                return run

            which = jnp.searchsorted(jnp.asarray(tiers), ni, side="left")
            return jax.lax.switch(
                jnp.minimum(which, len(tiers) - 1), [screen(n) for n in tiers], None
            )

        return jax.lax.map(one, (r, cells, count))
    groups = tiered_groups(cells, count, table.cells.num_cells, 16)
    batch = r.shape[0]
    per = min(k, per_cell)
    w = coherence_weights(r)
    zero = jnp.zeros((w.shape[0], 1), w.dtype)
    real, imag = jnp.concatenate([w[:, :batch], zero], 1), jnp.concatenate([w[:, batch:], zero], 1)

    def best(args):
        c, who = args

        def run(_):
            s = squared_coherence(table.rows(c), jnp.concatenate([real[:, who], imag[:, who]], 1))
            top, point = jax.lax.top_k(s, per)
            return top, point, subgrid_shift(table, s, point)

        shapes = jax.eval_shape(run, None)
        empty = (
            lambda _: (  # an item without members: no score, nothing to refine
                jnp.full(shapes[0].shape, -jnp.inf, shapes[0].dtype),
                *(jnp.zeros(a.shape, a.dtype) for a in shapes[1:]),
            )
        )
        return jax.lax.cond(jnp.all(who == batch), empty, run, None)

    score, point, shift = jax.lax.map(best, (groups.cell, groups.members))
    valid = jnp.arange(named)[None, :] < count[:, None]
    item = jnp.minimum(groups.item, groups.cell.shape[0] - 1)
    score = jnp.where(valid[..., None], score[item, groups.lane], -jnp.inf).reshape(batch, -1)
    point = point[item, groups.lane].reshape(batch, -1)
    shift = shift[item, groups.lane].reshape(batch, -1, 3)
    _, top = jax.lax.top_k(score, k)
    cell = jnp.take_along_axis(cells, top // per, axis=1)
    start = table.cells.corner(cell) + table.offsets[jnp.take_along_axis(point, top, axis=1)]
    return start + jnp.take_along_axis(shift, top[..., None], axis=1).astype(start.dtype)


def k_min(k: int, per_cell: int) -> int:
    """The fewest cells whose points hold ``k`` starts."""
    return -(-k // per_cell)


def tiered_candidate_starts(
    r: Array,
    table: CellTable,
    cells: Array,
    count: Array,
    k: int,
    by_cell: bool,
    tiers: tuple[int, ...] = (),
) -> Array:
    """The starts (B, k, 3) of :func:`candidate_search` with ``count[b]`` (B,) of the
    (B, K) ``cells`` screened per row (``k``, ``by_cell`` static: see :func:`tiered_starts`),
    kept above the floor (z >= 1 mm). Traced, unchecked; rows with ``count`` 0 get
    meaningless starts (the caller replaces their answers)."""
    x0 = tiered_starts(r, table, cells, count, k, by_cell, tiers)
    return x0.at[..., 2].set(jnp.maximum(x0[..., 2], 1e-3))
