r"""Locality (beyond the paper): tiles of the UE region, each with the APs that carry its
information, so that a building costs its area, not its area squared.

Distributed MIMO spreads many APs over large spaces, but a UE's position is carried by the
APs near it: the PEB of the K APs nearest a 10 x 10 m tile of a 40 m hall is within a few
percent of the PEB of all 272. Everything computed over all M APs times the whole region
(a phasor table, the exhaustive search, the cost of a candidate) grows as the area squared;
over a tile's K APs it grows as the area.

* :func:`tile_boxes`: the UE region split into equal tiles.
* :func:`tile_aps` -> :class:`Tiling`: each tile's APs by a stated rule: ``"bound"`` (the
  fewest nearest APs whose PEB stays within ``factor`` of the all-AP PEB everywhere in the
  tile, computed in O(M) per position, :func:`~dmimo_jax.bounds.fim_from_jacobian`),
  ``"nearest"`` (a given K) or ``"all"`` (K = M: locality off). One K for every tile, so
  tiles share one shape (one compiled program); the K chosen and each tile's worst bound
  ratio are reported.
* :func:`tile_scene`: a tile's deployment (its APs, its box as the UE region).
* :func:`tiled_egs`: the exact MLE over tiles: each tile's exhaustive grid search (eq. 18,
  its own phasor table of its K APs, built and dropped in turn, so memory is one tile's)
  refined under the ML cost (eq. 17) on its APs; the tile of lowest ML cost wins (the same K
  everywhere: the same chi-square), and its answer is refined on the APs ``fine`` asks
  for. With one tile and K = M it is :func:`~dmimo_jax.estimators.egs` followed by
  :func:`~dmimo_jax.estimators.refine_batch`, answer for answer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import as_snapshot_batch, check_int, check_scalar, warn_if_float32
from dmimo_jax.bounds import linearize
from dmimo_jax.estimators import RefineResult, egs, phasor_table, search_grid
from dmimo_jax.estimators.mle import refine_batch_unchecked
from dmimo_jax.estimators.search import coarse_to_fine_unchecked
from dmimo_jax.physics import TwoRayModel
from dmimo_jax.scene import Scene

__all__ = [
    "Tiling",
    "TileTables",
    "TiledResult",
    "tile_boxes",
    "tile_aps",
    "tile_scene",
    "tile_tables",
    "tiled_egs",
]

RULES = ("bound", "nearest", "all")


class Tiling(NamedTuple):
    """Tiles of a scene's UE region and each tile's APs (:func:`tile_aps`)."""

    low: np.ndarray  # (T, 3) each tile's lower corner, m
    high: np.ndarray  # (T, 3) its upper corner, m
    aps: np.ndarray  # (T, K) int: each tile's APs, nearest its centre first
    ratio: np.ndarray  # (T,) the tile's worst PEB of its K APs over the all-AP PEB
    rule: str  # how the APs were chosen ("bound", "nearest" or "all")

    @property
    def num_tiles(self) -> int:
        return int(self.low.shape[0])

    @property
    def num_aps(self) -> int:
        """K, the APs of each tile."""
        return int(self.aps.shape[1])


def _scene_of(model: Any) -> Scene:
    if isinstance(model, Scene):
        return model
    if isinstance(model, TwoRayModel):
        return model.scene
    raise ValueError(
        f"model must be a Scene or a TwoRayModel (a tile is the scene of its APs), got "
        f"{type(model).__name__}"
    )


def tile_boxes(scene: Scene, size: float) -> tuple[np.ndarray, np.ndarray]:
    """The UE region split in x and y into ``ceil(extent / size)`` equal tiles per axis (each
    at most ``size`` wide; the whole height): ``(low, high)``, each (T, 3), row by row.

    Raises:
        ValueError: ``size`` not a positive length.
    """
    check_scalar("size", size, positive=True)
    low, high = np.asarray(scene.ue_low, float), np.asarray(scene.ue_high, float)
    n = np.maximum(np.ceil((high[:2] - low[:2]) / size - 1e-9), 1).astype(int)
    step = (high[:2] - low[:2]) / n
    iy, ix = np.meshgrid(np.arange(n[1]), np.arange(n[0]), indexing="ij")
    ix, iy = ix.reshape(-1), iy.reshape(-1)
    lo = np.stack([low[0] + ix * step[0], low[1] + iy * step[1], np.full(ix.size, low[2])], 1)
    hi = np.stack(
        [low[0] + (ix + 1) * step[0], low[1] + (iy + 1) * step[1], np.full(ix.size, high[2])], 1
    )
    return lo, hi


@jax.jit
def _nested_pebs(xs: Array, order: Array, model: TwoRayModel) -> Array:
    """(P, M) the PEB at each position of ``xs`` (P, 3) of the first K of the APs ``order``
    (M,) for K = 1 .. M (inf below 4): eq. (14) by cumulative sums of each AP's terms of
    :func:`~dmimo_jax.bounds.fim_from_jacobian`, O(M) per position."""

    def one(x: Array) -> Array:
        _, h, variance = linearize(x, model)
        w = (1.0 / variance)[order]
        h = h[order]
        a = jnp.cumsum(w[:, None, None] * h[:, :, None] * h[:, None, :], axis=0)  # (M, 3, 3)
        g = jnp.cumsum(w[:, None] * h, axis=0)
        s = jnp.cumsum(w)
        fim = a - g[:, :, None] * g[:, None, :] / s[:, None, None]
        # trace of the inverse via eigenvalues: a nested FIM below 4 APs is singular
        lam = jnp.linalg.eigvalsh(fim)
        floor = 1e3 * jnp.finfo(fim.dtype).eps * jnp.max(lam, axis=-1)
        bound = jnp.sqrt(jnp.sum(1.0 / jnp.maximum(lam, floor[:, None]), axis=-1))
        ok = (jnp.arange(1, order.shape[0] + 1) >= 4) & (lam[:, 0] > floor)
        return jnp.where(ok, bound, jnp.inf)

    return jax.vmap(one)(xs)


def tile_aps(
    model: Scene | TwoRayModel,
    size: float,
    *,
    rule: str = "bound",
    factor: float = 1.1,
    num_aps: int | None = None,
    points: int = 3,
) -> Tiling:
    """Tiles of ``size`` (:func:`tile_boxes`) and each tile's APs by ``rule``:

    * ``"bound"``: the APs ordered by distance from the tile's centre, the fewest K whose
      PEB (eq. 14, :func:`~dmimo_jax.bounds.fim_from_jacobian` summed AP by AP: O(M) per
      position) is within ``factor`` of the all-AP PEB at every one of ``points``-cubed
      positions spanning the tile (its corners included); K the largest any tile needs.
    * ``"nearest"``: the ``num_aps`` nearest APs.
    * ``"all"``: every AP (locality off).

    Returns:
        :class:`Tiling` with each tile's worst ratio of its K-AP PEB to the all-AP PEB.

    Raises:
        ValueError: an unknown ``rule``, ``factor`` below 1, a ``num_aps`` out of [4, M]
            (or given for another rule), ``points`` below 2.
    """
    scene = _scene_of(model)
    model = TwoRayModel(scene)
    m = scene.num_aps
    if rule not in RULES:
        raise ValueError(f"rule must be one of {RULES}, got {rule!r}")
    check_scalar("factor", factor)
    if not factor >= 1:
        raise ValueError(f"factor must be at least 1 (the all-AP PEB is the best), got {factor}")
    if (num_aps is None) != (rule != "nearest"):
        raise ValueError(f"num_aps is the K of rule='nearest' (and only of it), got {num_aps!r}")
    if num_aps is not None:
        check_int("num_aps", num_aps, minimum=4, maximum=m)
    check_int("points", points, minimum=2)
    low, high = tile_boxes(scene, size)
    ap = np.asarray(scene.ap_positions, float)
    t = np.linspace(0.0, 1.0, points)
    grid = np.stack(np.meshgrid(t, t, t, indexing="ij"), -1).reshape(-1, 3)
    orders, pebs = [], []
    for lo, hi in zip(low, high, strict=True):
        centre = (lo + hi) / 2
        order = np.argsort(np.linalg.norm(ap[:, :2] - centre[:2], axis=1), kind="stable")
        xs = jnp.asarray(lo + grid * (hi - lo), scene.ap_positions.dtype)
        orders.append(order)
        pebs.append(np.asarray(_nested_pebs(xs, jnp.asarray(order), model)))  # (P, M)
    if rule == "all":
        k = m
    elif rule == "nearest":
        k = int(num_aps)
    else:
        need = [int(np.argmax(np.all(p <= factor * p[:, -1:], axis=0))) + 1 for p in pebs]
        k = max(need)
    aps = np.stack([o[:k] for o in orders])
    ratio = np.array([float(np.max(p[:, k - 1] / p[:, -1])) for p in pebs])
    return Tiling(low, high, aps, ratio, rule)


def tile_scene(scene: Scene, tiling: Tiling, t: int) -> Scene:
    """Tile ``t``'s deployment: the scene of its APs (:meth:`~dmimo_jax.scene.Scene.subset`)
    with its box as the UE region."""
    check_int("t", t, maximum=tiling.num_tiles - 1)
    return scene.subset(tiling.aps[t]).replace(ue_low=tiling.low[t], ue_high=tiling.high[t])


def _where_rows(rows: Array, a: Any, b: Any) -> Any:
    """``a`` where ``rows`` (B,) holds, else ``b`` (pytrees of leading axis B)."""
    return jax.tree.map(lambda u, v: jnp.where(rows.reshape(-1, *(1,) * (u.ndim - 1)), u, v), a, b)


class TiledResult(NamedTuple):
    """Output of :func:`tiled_egs` (leading batch axis B)."""

    x: Array  # (B, 3) the answer, m
    cost: Array  # (B,) its ML cost (eq. 17) over the APs of ``fine``
    tile: Array  # (B,) int: the tile whose search won
    tile_cost: Array  # (B,) the winning tile's ML cost over its K APs
    certified: Array  # (B,) bool: the winning tile's table screen certified its grid arg-min
    # (where not, its exhaustive search ran in full)


class TileTables(NamedTuple):
    """Each tile's model and phasor table (:func:`tile_tables`): memory ∝ area * K."""

    models: tuple  # (T,) TwoRayModel of each tile's scene
    tables: tuple  # (T,) PhasorTable of each on its ``spacing`` grid


def tile_tables(scene: Scene | TwoRayModel, tiling: Tiling, spacing: float) -> TileTables:
    """Every tile's model and phasor table on a ``spacing`` grid of its box with its K APs
    (built once for many calls of :func:`tiled_egs`; without them it builds one tile's at
    a time)."""
    scene = _scene_of(scene)
    check_scalar("spacing", spacing, positive=True)
    models, tables = [], []
    for t in range(tiling.num_tiles):
        sub = TwoRayModel(tile_scene(scene, tiling, t))
        models.append(sub)
        tables.append(phasor_table(sub, search_grid(sub, spacing, "ue")))
    return TileTables(tuple(models), tuple(tables))


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
    cost wins; its exhaustive search (:func:`~dmimo_jax.estimators.egs`: the certified
    arg-min of eq. 18 over its grid, with the wider screen and the table-free scan where
    the certificate fails) is refined too and kept unless a start's cost is lower by more
    than 1 (another optimum; closer, they are one optimum found twice). With fewer
    than M APs per tile, the answer gets ``num_steps`` more steps on the APs of ``fine``:
    ``"all"`` (every AP: O(M) per step, where far APs still add information) or ``"tile"``.

    With one tile and every AP (``tile_aps(..., rule="all")`` on a tile as large as the
    region) it is :func:`~dmimo_jax.estimators.egs` then
    :func:`~dmimo_jax.estimators.refine_batch` with ``num_steps``, or a refined start of
    lower ML cost.

    Raises:
        ValueError: bad snapshots, neither ``spacing`` nor ``tables``, ``fine`` not
            ``"all"`` or ``"tile"``, bad settings.
    """
    scene = _scene_of(model)
    full = TwoRayModel(scene)
    warn_if_float32("tiled_egs")
    rb = as_snapshot_batch("r", r, scene.num_aps, scene.ap_positions.dtype)
    if fine not in ("all", "tile"):
        raise ValueError(f"fine must be 'all' or 'tile', got {fine!r}")
    if tables is None:
        if spacing is None:
            raise ValueError("spacing (m) or tables (tile_tables) must be given")
        check_scalar("spacing", spacing, positive=True)
    elif not isinstance(tables, TileTables) or len(tables.tables) != tiling.num_tiles:
        raise ValueError("tables must be tile_tables' TileTables of this tiling")
    check_int("num_steps", num_steps, minimum=1)
    check_int("num_candidates", num_candidates, minimum=1)
    check_int("num_starts", num_starts, minimum=1)
    if not isinstance(tiling, Tiling) or tiling.aps.max() >= scene.num_aps:
        raise ValueError("tiling must be tile_aps' Tiling of this scene")

    def tile_model(t: int) -> tuple[TwoRayModel, Any]:
        if tables is not None:
            return tables.models[t], tables.tables[t]
        sub = TwoRayModel(tile_scene(scene, tiling, t))
        return sub, phasor_table(sub, search_grid(sub, spacing, "ue"))

    best: RefineResult | None = None
    tile = jnp.zeros(rb.shape[0], jnp.int32)
    certified = jnp.zeros(rb.shape[0], bool)
    steps = range(tiling.num_tiles)
    if progress:
        from tqdm.auto import tqdm

        steps = tqdm(steps, desc="tiles", unit="tile")
    for t in steps:
        sub, table = tile_model(t)
        rt = rb[:, tiling.aps[t]]
        starts = min(num_starts, table.grid.size)
        fit = coarse_to_fine_unchecked(rt, sub, table, starts, num_steps)
        del table  # one tile's table at a time
        if best is None:
            best = fit
            continue
        better = fit.cost < best.cost
        best = _where_rows(better, fit, best)
        tile = jnp.where(better, t, tile)
    assert best is not None
    best = RefineResult(best.x, jnp.zeros_like(best.cost), best.cost, jnp.zeros_like(tile))
    for t in np.unique(np.asarray(tile)):  # the winner's exhaustive search, certified
        rows = np.flatnonzero(np.asarray(tile) == t)
        sub, table = tile_model(int(t))
        rt = rb[rows][:, tiling.aps[t]]
        exact = egs(rt, sub, table, num_candidates=num_candidates)
        fit = refine_batch_unchecked(exact.x, rt, sub, num_steps, 1e-3)
        take = ~(best.cost[rows] < fit.cost - 1.0)  # another optimum only if clearly lower
        merged = _where_rows(take, fit, jax.tree.map(lambda a, rows=rows: a[rows], best))
        best = jax.tree.map(lambda a, b, rows=rows: a.at[rows].set(b), best, merged)
        certified = certified.at[rows].set(exact.screened)
    answer = best
    if fine == "all" and tiling.num_aps < scene.num_aps:
        answer = refine_batch_unchecked(best.x, rb, full, num_steps, 1e-3)
    single = np.ndim(r) == 1
    out = TiledResult(answer.x, answer.cost, tile, best.cost, certified)
    return jax.tree.map(lambda a: a[0], out) if single else out
