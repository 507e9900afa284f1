"""The exact MLE over tiles (the estimator side of :mod:`dmimo_jax.tiles`): every tile's
phasor table stacked on a tile axis, and the search of all tiles."""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import as_snapshot_batch, check_int, check_scalar, warn_if_float32
from dmimo_jax.estimators import PhasorTable, RefineResult, egs, phasor_table, search_grid
from dmimo_jax.estimators.mle import refine_batch_unchecked
from dmimo_jax.estimators.search import coarse_to_fine_unchecked
from dmimo_jax.physics import TwoRayModel
from dmimo_jax.scene import Scene
from dmimo_jax.tiles.tiling import Tiling, scene_of, tile_scene, tile_sharding


def _set_rows(best: Any, rows: np.ndarray, take: Array, new: Any) -> Any:
    """``best`` (a pytree of leading axis B) with its ``rows`` replaced by ``new`` (their
    answers, leading axis ``len(rows)``) where ``take`` holds."""

    def one(a: Array, b: Array) -> Array:
        keep = take.reshape(-1, *(1,) * (b.ndim - 1))
        return a.at[rows].set(jnp.where(keep, b, a[rows]))

    return jax.tree.map(one, best, new)


def _rank_tiles(cost: Array, x: Array) -> tuple[Array, Array, Array, Array]:
    """From every tile's ML costs (T, B) and answers (T, B, 3): the winning tile (B,) (the
    first on a tie; NaN never wins), its answer (B, 3) and cost (B,), and the runner-up."""
    cost = jnp.where(jnp.isnan(cost), jnp.inf, cost)
    order = jnp.argsort(cost, axis=0)  # stable
    tile, second = order[0], order[min(1, order.shape[0] - 1)]
    pick = jnp.take_along_axis(cost, tile[None], 0)[0]
    return tile, jnp.take_along_axis(x, tile[None, :, None], 0)[0], pick, second


class TiledResult(NamedTuple):
    """Output of :func:`tiled_egs` (leading batch axis B)."""

    x: Array
    """(B, 3) the answer, m."""
    cost: Array
    """(B,) its ML cost (eq. 17) over the APs of ``fine``."""
    tile: Array
    """(B,) int: the tile whose search won."""
    tile_cost: Array
    """(B,) the winning tile's ML cost over its K APs."""
    certified: Array
    """(B,) bool: the winning tile's table screen certified its grid arg-min."""
    # (where not, its exhaustive search ran in full)


class TileTables(NamedTuple):
    """Every tile's model and phasor table stacked on a leading tile axis (T): one pytree
    whose tiles are searched by one vmapped program, sharded over devices by that axis
    (:func:`tile_tables`). Memory ∝ area * K."""

    models: Any
    """Each leaf (T, ...): the tiles' PhaseModels (two-ray, or fit_tiles' GP)."""
    tables: PhasorTable
    """Data (T, N, 2K), grid.low (T, 3); one grid shape for all tiles."""
    aps: Array
    """(T, K) int: each tile's APs."""

    def tile(self, t: int) -> tuple[Any, PhasorTable]:
        """Tile ``t``'s model and table."""
        return jax.tree.map(lambda a: a[t], (self.models, self.tables))


def _tile_table(
    scene: Scene, tiling: Tiling, t: int, spacing: float, models: Any = None
) -> tuple[Any, Any]:
    """Tile ``t``'s model (its two-ray model, or tile ``t`` of ``models``) and its phasor
    table on one device (a tile is one device's work)."""
    if models is None:
        sub = TwoRayModel(tile_scene(scene, tiling, t))
    else:
        sub = jax.tree.map(lambda a: a[t], models)
    grid = search_grid(sub, spacing, "ue")
    return sub, phasor_table(sub, grid, devices=jax.local_devices()[:1])


def tile_tables(
    scene: Scene | TwoRayModel,
    tiling: Tiling,
    spacing: float,
    *,
    models: Any = None,
    devices: Any = None,
) -> TileTables:
    """Every tile's model and phasor table on a ``spacing`` grid of its box with its K APs,
    stacked (:class:`TileTables`: built once for many calls of :func:`tiled_egs`; without
    them it builds one tile's at a time). With several ``devices`` (default: one), the
    tiles are split over them (``jax.sharding`` along the tile axis; the tile count padded
    to a multiple of theirs by repeating the last tile, whose copies never win a tie).

    ``models``: the tiles' own PhaseModels stacked on a tile axis, each over its tile's K
    APs with the tile's box as its UE region (:func:`~dmimo_jax.tiles.fit_tiles`' GP
    models, ``.models``); default: each tile's two-ray model (the scene's physics).

    Raises:
        ValueError: tiles whose grids differ in shape (tiles of one size have one shape),
            ``models`` not of T tiles of K APs.
    """
    scene = scene_of(scene)
    check_scalar("spacing", spacing, positive=True)
    sharding = tile_sharding(devices)
    num_devices = 1 if sharding is None else sharding.mesh.size
    if models is not None:
        shape = np.shape(getattr(getattr(models, "scene", None), "ap_positions", None))
        if shape != (tiling.num_tiles, tiling.num_aps, 3):
            raise ValueError(
                f"models must be {tiling.num_tiles} PhaseModels of {tiling.num_aps} APs stacked "
                f"on a tile axis (fit_tiles(...).models), got AP positions of shape {shape}"
            )
    parts = [_tile_table(scene, tiling, t, spacing, models) for t in range(tiling.num_tiles)]
    shapes = {p[1].grid.shape for p in parts}
    if len(shapes) != 1:
        raise ValueError(f"the tiles' grids differ in shape ({sorted(shapes)}): use equal tiles")
    pad = -len(parts) % num_devices
    parts += [parts[-1]] * pad
    aps = np.concatenate([tiling.aps, np.repeat(tiling.aps[-1:], pad, axis=0)])
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *parts)
    out = TileTables(stacked[0], stacked[1], jnp.asarray(aps, jnp.int32))
    return out if sharding is None else jax.device_put(out, sharding)


@partial(jax.jit, static_argnames=("num_starts", "num_steps"))
def _search_tiles(
    r: Array, tables: TileTables, num_starts: int, num_steps: int
) -> tuple[Array, Array, Array, Array]:
    """Every tile's multi-start search of ``r`` (B, M) on its APs, one vmapped program:
    the winning tile (B,), its answer (B, 3) and ML cost (B,) (the first tile on a tie), and
    the runner-up tile (B,)."""

    def one(model: TwoRayModel, table: PhasorTable, aps: Array) -> Any:
        return coarse_to_fine_unchecked(r[:, aps], model, table, num_starts, num_steps)

    fit = jax.vmap(one)(tables.models, tables.tables, tables.aps)  # (T, B, ...)
    return _rank_tiles(fit.cost, fit.x)


def tiled_egs(
    r: ArrayLike,
    model: Scene | TwoRayModel,
    tiling: Tiling,
    spacing: float | None = None,
    *,
    tables: TileTables | None = None,
    fine: str = "all",
    num_steps: int = 25,
    num_starts: int = 8,
    wide_starts: int = 64,
    gate: float = 100.0,
    num_candidates: int = 64,
    progress: bool = False,
) -> TiledResult:
    """The exact MLE over tiles (module docstring) for snapshots ``r`` (M,) or (B, M) of all
    M APs.

    Each tile in turn: the coherence screen of its phasor table (``tables``, or one built
    on a ``spacing`` grid of its box and dropped: memory one tile's, whatever the
    building) for the snapshots' phases of its K APs, its ``num_starts`` most coherent
    points refined ``num_steps`` LM steps under the ML cost (eq. 17) on those APs
    (:func:`~dmimo_jax.estimators.coarse_to_fine`: with few APs the grid's LS arg-min can
    sit on a wrong lobe that the true lobe's refinement beats). The tile of the lowest ML
    cost wins. An answer whose cost fails the gate (``gate * (K - 4)``: about chi-square
    with K - 4 degrees of freedom at the right position) is searched again in its best two
    tiles from ``wide_starts`` starts (with few APs the true lobe's coherence is less
    prominent), and one that still fails in every other tile (a UE at a tile's edge whose
    own tile's search missed its lobe ranks that tile anywhere). The winner's exhaustive
    search (:func:`~dmimo_jax.estimators.egs`: the certified arg-min of eq. 18 over its
    grid, with the wider screen and the table-free scan where the certificate fails) is
    refined too and kept unless a start's cost is lower by more than 1 (another optimum;
    closer, they are one optimum found twice). With fewer
    than M APs per tile, the answer gets ``num_steps`` more steps on the APs of ``fine``:
    ``"all"`` (every AP, the scene's two-ray model: O(M) per step, where far APs still add
    information) or ``"tile"`` (the tile's own model: the choice for tables of the tiles'
    fitted models, :func:`~dmimo_jax.tiles.fit_tiles`, which know no AP beyond their K).

    With one tile and every AP (``tile_aps(..., rule="all")`` on a tile as large as the
    region) it is :func:`~dmimo_jax.estimators.egs` then
    :func:`~dmimo_jax.estimators.refine_batch` with ``num_steps``, or a refined start of
    lower ML cost.

    Raises:
        ValueError: bad snapshots, neither ``spacing`` nor ``tables``, ``fine`` not
            ``"all"`` or ``"tile"``, bad settings.
    """
    scene = scene_of(model)
    full = TwoRayModel(scene)
    warn_if_float32("tiled_egs")
    rb = as_snapshot_batch("r", r, scene.num_aps, scene.ap_positions.dtype)
    if fine not in ("all", "tile"):
        raise ValueError(f"fine must be 'all' or 'tile', got {fine!r}")
    if tables is None:
        if spacing is None:
            raise ValueError("spacing (m) or tables (tile_tables) must be given")
        check_scalar("spacing", spacing, positive=True)
    elif not isinstance(tables, TileTables) or tables.aps.shape[1] != tiling.num_aps:
        raise ValueError("tables must be tile_tables' TileTables of this tiling")
    elif fine == "all" and not isinstance(tables.models, TwoRayModel):
        raise ValueError(
            "fine='all' refines with the two-ray model of every AP; tables of the tiles' own "
            "models (fit_tiles) take fine='tile'"
        )
    check_int("num_steps", num_steps, minimum=1)
    check_int("num_candidates", num_candidates, minimum=1)
    check_int("num_starts", num_starts, minimum=1)
    check_int("wide_starts", wide_starts, minimum=1)
    check_scalar("gate", gate, positive=True)
    if not isinstance(tiling, Tiling) or tiling.aps.max() >= scene.num_aps:
        raise ValueError("tiling must be tile_aps' Tiling of this scene")

    def tile_model(t: int) -> tuple[TwoRayModel, Any]:
        if tables is not None:
            return tables.tile(t)
        return _tile_table(scene, tiling, t, spacing)

    if tables is not None:
        starts = min(num_starts, tables.tables.grid.size)
        tile, x, cost, second = _search_tiles(rb, tables, starts, num_steps)
    else:  # one tile's table at a time
        costs, xs = [], []
        steps = range(tiling.num_tiles)
        if progress:
            from tqdm.auto import tqdm

            steps = tqdm(steps, desc="tiles", unit="tile")
        for t in steps:
            sub, table = tile_model(t)
            rt = rb[:, tiling.aps[t]]
            starts = min(num_starts, table.grid.size)
            fit = coarse_to_fine_unchecked(rt, sub, table, starts, num_steps)
            del table
            costs.append(fit.cost)
            xs.append(fit.x)
        tile, x, cost, second = _rank_tiles(jnp.stack(costs), jnp.stack(xs))
    best = RefineResult(x, jnp.zeros_like(cost), cost, jnp.zeros_like(tile))
    # answers that fail the gate: the best two tiles searched again from wide_starts starts,
    # then, for those still failing, every other tile
    limit = gate * max(tiling.num_aps - 4, 1)
    failing = np.flatnonzero(~np.asarray(cost <= limit))
    won, runner = np.asarray(tile)[failing], np.asarray(second)[failing]
    tried = np.zeros((rb.shape[0], tiling.num_tiles), bool)
    tried[failing, won] = tried[failing, runner] = True
    for stage in range(2):
        if stage == 1:
            failing = np.flatnonzero(~np.asarray(best.cost <= limit))
        for t in range(tiling.num_tiles):
            rows = failing[tried[failing, t] == (stage == 0)]
            if rows.size == 0:
                continue
            sub, table = tile_model(t)
            rt = rb[rows][:, tiling.aps[t]]
            starts = min(wide_starts, table.grid.size)
            fit = coarse_to_fine_unchecked(rt, sub, table, starts, num_steps)
            better = fit.cost < best.cost[rows]
            tile = tile.at[rows].set(jnp.where(better, t, tile[rows]))
            zeros = jnp.zeros(rows.size, int)
            best = _set_rows(best, rows, better, RefineResult(fit.x, zeros, fit.cost, zeros))
    certified = jnp.zeros(rb.shape[0], bool)
    for t in np.unique(np.asarray(tile)):  # the winner's exhaustive search, certified
        rows = np.flatnonzero(np.asarray(tile) == t)
        sub, table = tile_model(int(t))
        rt = rb[rows][:, tiling.aps[t]]
        exact = egs(rt, sub, table, num_candidates=num_candidates)
        fit = refine_batch_unchecked(exact.x, rt, sub, num_steps, 1e-3)
        take = ~(best.cost[rows] < fit.cost - 1.0)  # another optimum only if clearly lower
        best = _set_rows(best, rows, take, fit)
        certified = certified.at[rows].set(exact.screened)
    answer = best
    if fine == "all" and tiling.num_aps < scene.num_aps:
        answer = refine_batch_unchecked(best.x, rb, full, num_steps, 1e-3)
    single = np.ndim(r) == 1
    out = TiledResult(answer.x, answer.cost, tile, best.cost, certified)
    return jax.tree.map(lambda a: a[0], out) if single else out
