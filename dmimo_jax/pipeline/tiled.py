r"""The online stage over tiles (:mod:`dmimo_jax.tiles`): a building located tile by tile,
each snapshot costing what a snapshot of one room costs.

A building's UE region is split into tiles (:func:`~dmimo_jax.tiles.tile_aps`), each with
the K APs that carry its information. The coarse stage is hierarchical:

1. **The tile.** A :class:`~dmimo_jax.learning.CellClassifier` over all M APs whose cells
   are the tiles (:func:`tile_grid`), trained on a whole-building phase model (the
   surveyed two-ray model by default: a tile is metres wide, far coarser than a phase
   model's errors).
2. **Within the tile.** The tile's own :class:`~dmimo_jax.pipeline.Locator` on its K APs:
   its cell classifier of fixed input (K APs) and output (the tile's cells), its screen,
   fine stage and cost gate, all from :func:`~dmimo_jax.pipeline.run_offline` on the tile's
   scene (:func:`~dmimo_jax.tiles.tile_scene`) under the tile's GP model
   (:func:`~dmimo_jax.tiles.fit_tiles`).

Tiles of one shape give Locators of one tree structure and shapes, so **one compiled
program serves every tile** (:meth:`Locator.compiled_programs` counts it; per batch size,
one with the gate's rescues and one without). A snapshot whose tile's answer the cost gate
rejects is tried in the next most likely tiles, first by the gate alone, then with its
rescues (``gate_tries``, ``tries``): the gate, not the tile classifier, decides. Per
snapshot: the tile classifier (O(M)) and one room-sized Locator call (O(K)), independent of
the number of tiles.

* :func:`run_offline_tiled` -> :class:`TiledOffline`: every tile's offline stage (cached and
  resumable like :func:`~dmimo_jax.pipeline.run_offline`; :func:`tile_offlines` alone, for
  any tiles) and the tile classifier (:mod:`~dmimo_jax.pipeline.tiled_offline`, its names
  importable from here too).
* :class:`TiledLocator` -> :class:`TiledResult`: the online stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_int,
    check_phases,
    check_positions,
    check_probability,
    check_scalar,
)
from dmimo_jax.bounds import move_statistic_unchecked, position_chi2_quantile
from dmimo_jax.estimators.mle import refine_batch_unchecked
from dmimo_jax.estimators.rows import bucket_size, gate_limit
from dmimo_jax.learning.cells import CellClassifier
from dmimo_jax.pipeline.batches import snug_parts
from dmimo_jax.pipeline.locator import Locator
from dmimo_jax.pipeline.rescues import Status
from dmimo_jax.pipeline.settings import checked_settings
from dmimo_jax.pipeline.stages import Network
from dmimo_jax.pipeline.tiled_offline import (  # noqa: F401 (also this module's names)
    TILE_CELLS,
    TILE_CLASSIFIER,
    TiledOffline,
    run_offline_tiled,
    tile_grid,
    tile_offlines,
)
from dmimo_jax.pipeline.tiled_screen import TiledCellTable, tile_results
from dmimo_jax.tiles import TileModels, Tiling

SHARED_SCREEN_TILES = 2
"""The first pass screens the rows of every tile as one (:attr:`TiledLocator.screen`) when
they fall in at least this many tiles; fewer run each tile's own Locator, one call a tile
(against its coarse stage, the shared screen and its first answer: fewer calls)."""


class TiledResult(NamedTuple):
    """Output of :class:`TiledLocator` (leading batch axis B)."""

    x: Array
    """(B, 3) the fine estimates, m."""
    tile: np.ndarray
    """(B,) int: the tile whose Locator answered."""
    rank: np.ndarray
    """(B,) int: the answering tile's place in the tile classifier's ranking (0: its most
    likely)."""
    cost: Array
    """(B,) the tile's answer's ML cost (eq. 17) on its tile's APs (before the ring's
    refinement, where :attr:`TiledLocator.ring` refined it)."""
    status: Array
    """(B,) int32 :class:`~dmimo_jax.pipeline.rescues.Status` of the answering tile."""
    excluded: np.ndarray
    """(B, M) bool: APs left out as faulty (of all M)."""

    @property
    def rejected(self) -> Array:
        """(B,) no tile tried brought the answer under its cost gate."""
        return self.status == Status.REJECTED


@dataclasses.dataclass(frozen=True)
class TiledLocator:
    """The online stage of a tiled building (module docstring): the tile classifier ranks
    the tiles, then the tiles' :class:`~dmimo_jax.pipeline.Locator` s answer on their K APs
    in two passes:

    1. **The tiles, by the gate alone**: each row in its most likely tile, with the cost
       gate but none of its rescues (``quick``); a row the gate rejects goes on to the next
       tile, up to ``gate_tries`` tiles. A wrong tile's answer fails the gate and costs one
       first answer, not a rescue.
    2. **The rescues**: a row no tile passed is run again through the full Locators (the
       gate's rescues: faulty APs left out, the tile searched whole, a dense recheck), its
       first ``tries`` ranked tiles in turn; one no tile passes is ``REJECTED`` with its
       first tile's answer.
    3. **The ring** (with ``ring``): the accepted answers refined on more APs than the
       tables hold (far APs still add information: with K chosen by the bound, the K-AP
       PEB is up to ``factor`` times the all-AP one), under each tile's GP over its ring;
       a refinement is kept where it passes the gate over the ring and moves no farther
       than the tile's own information allows (:attr:`ring_risk`).

    The grouping of rows by tile happens on the host, between calls of the programs that
    every tile shares (per batch size: the first pass's coarse stage, its one screen of
    every tile's rows, its first answer; the Locator with its rescues); call it on concrete
    snapshots.
    """

    classifier: CellClassifier
    """The tile classifier over all M APs."""
    locators: tuple[Locator, ...]
    """Each tile's Locator (on its K APs)."""
    quick: tuple[Locator, ...]
    """The same Locators without the gate's rescues (the first pass)."""
    aps: np.ndarray
    """(T, K) int: each tile's APs."""
    tile_of: np.ndarray
    """(T,) int: the tile of each of the classifier's cells."""
    tries: int = 2
    """The most tiles tried per snapshot with the gate's rescues (the classifier's most
    likely first)."""
    ring: TileModels | None = None
    """Each tile's GP phase model over its ring of APs (:func:`~dmimo_jax.tiles.fit_tiles`
    on :attr:`ring_aps`), or None: the fine stage on more APs than the tables hold."""
    ring_aps: np.ndarray | None = None
    """(T, R) int: each tile's ring, its K APs first then the next nearest its centre."""
    ring_steps: int = 10
    """LM steps of the refinement on the ring."""
    ring_risk: float = 1e-3
    """The chance that the ring's agreement test refuses a sound refinement: a refinement
    is kept only where its move from the tile's answer is within the chi-square (3 degrees
    of freedom) ``1 - ring_risk`` quantile in the tile's own information
    (:func:`~dmimo_jax.bounds.move_statistic_unchecked` under the ring's GP over the tile's
    K APs): a larger move is the far APs' model pulling the answer, not information."""
    screen: TiledCellTable | None = None
    """Every tile's cell table as one (:class:`~dmimo_jax.pipeline.tiled_screen.TiledCellTable`:
    the tiles' own arrays, no copy): the first pass screens the rows of all tiles in one
    search (:func:`~dmimo_jax.pipeline.tiled_screen.tile_results`) when they fall in at
    least :data:`SHARED_SCREEN_TILES` tiles; None: tile by tile."""
    gate_tries: int = 8
    """The most tiles the first pass tries per snapshot by the gate alone (the classifier's
    most likely first; at least ``tries``, at most every tile: :attr:`first_tries`). A row
    whose tile the classifier ranks below ``tries`` is then located by its tile's first
    answer instead of failing every rescue of the tiles before it (which cost more than a
    first answer in each of the others: docs/locality_measurements.md, "Rows the tile
    classifier ranks low")."""

    network: Network = dataclasses.field(init=False, repr=False, compare=False)
    """:attr:`classifier` as a pytree (its graph and weights when this Locator was built, as
    a :class:`~dmimo_jax.pipeline.Locator` holds its networks): what :meth:`ranked_tiles`
    runs, without splitting the module on every call."""

    def __post_init__(self) -> None:
        """The settings checked however the Locator is built (:meth:`from_offline`, the
        constructor, ``dataclasses.replace``)."""
        _check_settings(len(self.locators), self.tries, self.ring_steps, self.ring_risk,
                        self.gate_tries)  # fmt: skip
        if (self.ring is None) != (self.ring_aps is None):
            raise ValueError("ring and ring_aps must be given together (or neither)")
        if self.screen is not None and self.screen.num_tiles != len(self.locators):
            raise ValueError(
                f"screen must hold the cell tables of the {len(self.locators)} tiles, "
                f"got {self.screen.num_tiles}"
            )
        object.__setattr__(self, "network", Network.of(self.classifier))

    @classmethod
    def from_offline(
        cls,
        tiled: TiledOffline,
        *,
        tries: int = 2,
        gate_tries: int = 8,
        ring: tuple[Tiling, TileModels] | None = None,
        ring_steps: int = 10,
        ring_risk: float = 1e-3,
        shared_screen: bool = True,
        **settings: Any,
    ) -> TiledLocator:
        """Every tile's :meth:`Locator.from_offline` (``settings`` passed to each) and the
        tile classifier of ``tiled``; with ``ring``, a tiling of the same tiles with more APs
        each (``tile_aps(scene, size, rule="nearest", num_aps=R)``, R >= K) and its
        :func:`~dmimo_jax.tiles.fit_tiles`: the answers are refined on the ring
        (:meth:`__call__`); ``shared_screen`` (with more than one tile): the first pass
        screens every tile's rows as one (:attr:`screen`; False: tile by tile, the same
        answers).

        Raises:
            ValueError: ``tiled`` not :func:`run_offline_tiled`'s, ``tries`` out of
                [1, tiles], ``gate_tries`` below 1, tiles whose Locators differ in structure (one program each), a
                ``ring`` of other tiles or without each tile's K APs first, ``ring_steps``
                below 1, ``ring_risk`` not in (0, 1).
        """
        if not isinstance(tiled, TiledOffline):
            raise ValueError(
                f"tiled must be run_offline_tiled's result, got {type(tiled).__name__}"
            )
        # before the work
        _check_settings(tiled.tiling.num_tiles, tries, ring_steps, ring_risk, gate_tries)
        ring_models, ring_aps = checked_ring(ring, tiled.tiling)
        locators = [Locator.from_offline(off, "cells", **settings) for off in tiled.tiles]
        # the gate's noise-fit bound (a static setting) of every tile: the largest chance
        # over the tiles, so each tile allows at most the exclusions its own bound allows
        fits = [loc.settings.noise_fit for loc in locators]
        if fits[0]:
            worst = tuple(float(v) for v in np.max(np.asarray(fits), axis=0))
            locators = [
                dataclasses.replace(loc, settings=checked_settings(
                    loc, {**loc.settings._asdict(), "noise_fit": worst}))
                for loc in locators
            ]  # fmt: skip
        # the classifiers' graphs hold their cells' corner, which inference never reads
        # (the screen's cells are the tile's CellTable): one graph for every tile
        first = locators[0].stage.network
        locators = [_with_graph(loc, first.graphdef, first.module.cell_low) for loc in locators]
        shapes = {
            str(jax.tree.structure(loc)) + str([jnp.shape(a) for a in jax.tree.leaves(loc)])
            for loc in locators
        }
        if len(shapes) > 1:
            raise ValueError(
                f"the tiles' Locators differ in structure or shapes ({len(shapes)} kinds): "
                "tiles of one size and one K share one program"
            )
        quick = tuple(loc.replace(rescues=()) for loc in locators)
        aps = np.asarray(tiled.tiling.aps)
        screen = None
        if shared_screen and len(quick) > 1:
            screen = TiledCellTable.of([loc.stage.cell_table(loc) for loc in quick])
        return cls(tiled.classifier, tuple(locators), quick, aps, tiled.tile_of, tries,
                   ring_models, ring_aps, ring_steps, ring_risk, screen, gate_tries)  # fmt: skip

    @property
    def num_aps(self) -> int:
        """M, the building's APs."""
        return int(self.classifier.num_aps)

    @property
    def first_tries(self) -> int:
        """The tiles the first pass tries per snapshot at most: :attr:`gate_tries`, at least
        :attr:`tries`, at most every tile."""
        return min(max(self.gate_tries, self.tries), len(self.locators))

    def ranked_tiles(self, r: ArrayLike) -> np.ndarray:
        """(B, :attr:`first_tries`) the tiles of snapshots ``r`` (B, M) (or (M,): B = 1),
        most likely first. ``ValueError`` unless ``r`` holds finite real phases of the M APs."""
        check_phases("r", r, self.num_aps)
        r = np.asarray(r, np.float32).reshape(-1, self.num_aps)
        return self.tile_of[np.asarray(_top_cells(self.network, r, self.first_tries))]

    def __call__(self, r: ArrayLike) -> TiledResult:
        """Locate snapshots ``r`` (B, M) of all M APs (module docstring); one (M,) snapshot
        gives a result without the batch axis, as :class:`~dmimo_jax.Locator`'s call does.

        Raises:
            ValueError: ``r`` not (M,) or (B, M) finite real phases.
        """
        check_phases("r", r, self.num_aps)
        single = np.ndim(r) == 1
        r = np.asarray(r, float).reshape(-1, self.num_aps)
        b = r.shape[0]
        ranked = self.ranked_tiles(r)
        answer = dict(
            x=np.full((b, 3), np.nan),
            cost=np.full(b, np.inf),
            status=np.full(b, int(Status.REJECTED), np.int32),
            tile=ranked[:, 0].copy(),
            rank=np.zeros(b, int),
            excluded=np.zeros((b, self.num_aps), bool),
        )
        pending = np.ones(b, bool)
        for locators, k in self._tries():
            tried = np.flatnonzero(pending)
            for t, rows, out in self._results(locators, r, tried, ranked[tried, k]):
                ok = ~np.asarray(out.rejected)
                # a passing answer is kept; else the first tile's with its rescues
                keep = ok | ((locators is self.locators) & (k == 0))
                _write(answer, rows[keep], out, keep, t, k, self.aps[t])
                pending[rows[ok]] = False
            if not pending.any():
                break
        if self.ring is not None:
            self._refine_on_ring(answer, r)
        out = TiledResult(
            answer["x"], answer["tile"], answer["rank"], answer["cost"], answer["status"],
            answer["excluded"],
        )  # fmt: skip
        return TiledResult(*(a[0] for a in out)) if single else out

    def _tries(self) -> list[tuple[tuple[Locator, ...], int]]:
        """``(locators, rank)`` in the order a pending row tries them: its first ``tries``
        tiles by the gate alone, its first tile with the rescues, its further tiles (up to
        :attr:`first_tries`) by the gate alone, then the rescues of its other ``tries``
        tiles."""
        quick = [(self.quick, k) for k in range(self.first_tries)]
        full = [(self.locators, k) for k in range(self.tries)]
        return quick[: self.tries] + full[:1] + quick[self.tries :] + full[1:]

    def _refine_on_ring(self, answer: dict, r: np.ndarray) -> None:
        """The accepted answers with no AP left out, refined on their tile's ring by
        :func:`refine_on_ring` (its settings :attr:`ring_steps`, :attr:`ring_risk` and the
        tile's cost gate)."""
        fine = (answer["status"] != int(Status.REJECTED)) & ~answer["excluded"].any(axis=1)
        for t in np.unique(answer["tile"][fine]):
            rows = np.flatnonzero(fine & (answer["tile"] == t))
            answer["x"][rows] = refine_on_ring(
                answer["x"][rows], r[np.ix_(rows, self.ring_aps[t])], self.ring.tile(t),
                self.aps.shape[1], steps=self.ring_steps, risk=self.ring_risk,
                cost_gate=self.locators[t].settings.cost_gate,
            )[0]  # fmt: skip

    def _results(
        self, locators: tuple[Locator, ...], r: np.ndarray, rows: np.ndarray, tiles: np.ndarray
    ) -> Iterator[tuple[int, np.ndarray, Any]]:
        """``(t, its rows, its result)`` of each tile of ``tiles`` (n,) on its ``rows`` (n,)
        of ``r``: the first pass (``quick``) in one screen where :attr:`screen` is set and
        the rows fall in at least :data:`SHARED_SCREEN_TILES` tiles, else tile by tile."""
        hit = np.unique(tiles)
        # an empty batch screens nothing, whatever the threshold
        shared = self.screen is not None and hit.size >= max(SHARED_SCREEN_TILES, 1)
        if locators is self.quick and shared:
            own = np.take_along_axis(r[rows], self.aps[tiles], axis=1)
            for t, i, out in tile_results(self.quick, self.screen, own, tiles):
                yield t, rows[i], out
            return
        for t in hit:
            mine = rows[tiles == t]
            yield t, mine, self._tile_call(locators[t], r[np.ix_(mine, self.aps[t])])

    @staticmethod
    def _tile_call(loc: Locator, r: np.ndarray) -> Any:
        """A tile's Locator ``loc`` on its rows ``r`` (n, K), in :func:`snug_parts` (a
        tile's rows are few: padding them to the next batch size would cost up to 4x)."""
        outs, start = [], 0
        for n in snug_parts(r.shape[0]):
            outs.append(loc(r[start : start + n]))
            start += n
        return outs[0] if len(outs) == 1 else jax.tree.map(lambda *a: np.concatenate(a), *outs)


@partial(jax.jit, static_argnums=2)
def _top_cells(network: Network, r: Array, k: int) -> Array:
    """(B, k) the ``k`` most likely cells of a :class:`CellClassifier` ``network`` for
    snapshots ``r`` (B, M) float32."""
    return network.module.top_cells(r, k)[0]


def refine_on_ring(
    x: ArrayLike,
    r: ArrayLike,
    model: Any,
    num_aps: int,
    *,
    steps: int = 10,
    risk: float = 1e-3,
    cost_gate: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """One tile's answers refined on its ring of APs: the fine stage of a
    :class:`TiledLocator` built with ``ring``, for rows whose tile is already known (a
    tile's own :class:`~dmimo_jax.pipeline.Locator` on its K APs, then this).

    ``steps`` LM steps of eq. 17 under ``model`` from each answer; a refinement is kept
    where its ML cost passes the tile's ``cost_gate`` over the ring's R APs
    (:func:`~dmimo_jax.estimators.rows.gate_limit`: the APs beyond K were never checked for
    faults, so one that a faulty AP pulls away fails it; None: no gate) and its move from
    the answer passes the agreement test: the move statistic in the tile's own K-AP
    information (:func:`~dmimo_jax.bounds.move_statistic_unchecked`, the ring's APs beyond
    K left out) within the ``1 - risk`` quantile of chi-square with 3 degrees of freedom.
    Elsewhere the answer stays. Rows run in parts padded to
    :func:`~dmimo_jax.estimators.rows.bucket_size` (a few programs for any count).

    Args:
        x: (n, 3) the tile's answers, m.
        r: (n, R) the snapshots' phases at the ring's R APs, the tile's ``num_aps`` first
            (:attr:`TiledLocator.ring_aps`; :func:`~dmimo_jax.tiles.tile_aps` with
            ``rule="nearest"``).
        model: the ring's GP phase model of this tile (:meth:`TileModels.tile` of
            :func:`~dmimo_jax.tiles.fit_tiles` over the ring's tiling), R APs.
        num_aps: K, the tile's own APs.
        steps: LM steps (>= 1).
        risk: the chance in (0, 1) that the agreement test refuses a sound refinement.
        cost_gate: the tile's cost gate (its Locator's ``settings.cost_gate``) or None.

    Returns:
        ``(x, kept)``: (n, 3) float64 answers, the refined ones where kept, and (n,) bool.

    Raises:
        ValueError: ``model`` without a scene, ``x`` not (n, 3) finite positions, ``r`` not
            (n, R) finite phases for the model's R APs, ``num_aps`` not in [4, R], ``steps``,
            ``risk`` or ``cost_gate`` out of range.
    """
    aps = getattr(getattr(model, "scene", None), "ap_positions", None)
    if aps is None:
        raise ValueError(f"model must be a phase model of a scene (the ring's), got {model!r}")
    size = int(np.shape(aps)[-2])
    check_positions("x", x, batched=True)
    check_phases("r", r, size, batched=True)
    check_int("num_aps", num_aps, minimum=4, maximum=size)
    check_int("steps", steps, minimum=1)
    check_probability("risk", risk)
    if cost_gate is not None:
        check_scalar("cost_gate", cost_gate, positive=True)
    x, r = np.asarray(x, float).reshape(-1, 3), np.asarray(r, float).reshape(-1, size)
    if x.shape[0] != r.shape[0]:
        raise ValueError(f"x and r must hold the same rows, got {x.shape[0]} and {r.shape[0]}")
    out, kept = x.copy(), np.zeros(x.shape[0], bool)
    if x.shape[0] == 0:
        return out, kept
    limit = np.inf if cost_gate is None else gate_limit(size, cost_gate)
    beyond = jnp.arange(size) >= num_aps  # the ring's APs that are not the tile's
    agree = position_chi2_quantile(risk)
    for part in np.array_split(np.arange(x.shape[0]), -(-x.shape[0] // 256)):
        pad = np.resize(part, bucket_size(part.size))  # repeated rows: same answers
        start = jnp.asarray(x[pad])
        fit = refine_batch_unchecked(start, jnp.asarray(r[pad]), model, steps)
        move = np.asarray(_ring_moves(start, fit.x, model, beyond))[: part.size]
        xs, cost = np.asarray(fit.x)[: part.size], np.asarray(fit.cost)[: part.size]
        keep = np.isfinite(cost) & (cost <= limit) & (move <= agree)
        out[part[keep]], kept[part] = xs[keep], keep
    return out, kept


_ring_moves = jax.jit(jax.vmap(move_statistic_unchecked, in_axes=(0, 0, None, None)))
"""(n,) each refinement's move from its start (n, 3) to its answer (n, 3) in the tile's
K-AP information under the ring's model (its APs beyond K excluded)."""


def _check_settings(
    num_tiles: int, tries: int, ring_steps: int, ring_risk: float, gate_tries: int
) -> None:
    """``ValueError`` naming the setting of a :class:`TiledLocator` of ``num_tiles`` tiles
    that is out of range: ``tries`` in [1, tiles], ``ring_steps`` >= 1, ``ring_risk`` in
    (0, 1), ``gate_tries`` >= 1."""
    check_int("tries", tries, minimum=1, maximum=num_tiles)
    check_int("ring_steps", ring_steps, minimum=1)
    check_probability("ring_risk", ring_risk)
    check_int("gate_tries", gate_tries, minimum=1)


def _write(
    answer: dict, rows: np.ndarray, out: Any, keep: np.ndarray, t: int, k: int, aps: np.ndarray
) -> None:
    """Rows ``rows`` of ``answer`` (the host arrays of :class:`TiledResult`) from the
    ``keep`` rows of tile ``t``'s result ``out`` (its ``k``-th ranked tile, APs ``aps``)."""
    answer["x"][rows] = np.asarray(out.x)[keep]
    answer["cost"][rows] = np.asarray(out.cost)[keep]
    answer["status"][rows] = np.asarray(out.status)[keep]
    answer["tile"][rows], answer["rank"][rows] = t, k
    answer["excluded"][rows] = False
    answer["excluded"][np.ix_(rows, aps)] = np.asarray(out.excluded)[keep]


def checked_ring(
    ring: tuple[Tiling, TileModels] | None, tiling: Tiling
) -> tuple[TileModels | None, np.ndarray | None]:
    """``(models, aps)`` of a ring ``(ring_tiling, its fit_tiles)`` of ``tiling``'s tiles
    (``ValueError`` naming ``ring`` otherwise), or ``(None, None)``: the same tiles, each
    tile's K APs first (what :func:`refine_on_ring` assumes of its ``r``), one model per tile
    and AP. What :meth:`TiledLocator.from_offline` checks of its ``ring``; for a caller that
    runs :func:`refine_on_ring` itself."""
    if ring is None:
        return None, None
    if not (isinstance(ring, tuple) and len(ring) == 2 and isinstance(ring[0], Tiling)
            and isinstance(ring[1], TileModels)):  # fmt: skip
        raise ValueError("ring must be (tiling, fit_tiles of it): a Tiling and its TileModels")
    wide, models = ring
    k = tiling.num_aps
    if (wide.num_tiles != tiling.num_tiles or not np.allclose(wide.low, tiling.low)
            or not np.allclose(wide.high, tiling.high) or wide.num_aps < k
            or np.any(np.sort(wide.aps[:, :k], 1) != np.sort(tiling.aps, 1))):  # fmt: skip
        raise ValueError(
            "ring must tile the same tiles with each tile's K APs first (tile_aps with "
            f"rule='nearest' and num_aps >= {k} on the same tile size)"
        )
    aps = np.shape(models.models.scene.ap_positions)  # (T, R, 3) for fit_tiles of the ring
    if models.labels.shape[0] != wide.num_tiles or aps[:2] != (wide.num_tiles, wide.num_aps):
        raise ValueError("ring's models must be fit_tiles of its tiling (one per tile and AP)")
    return models, np.asarray(wide.aps)


def _with_graph(loc: Locator, graph: Any, cell_low: tuple) -> Locator:
    """``loc`` with its classifier's graph ``graph`` (whose cell corner is ``cell_low``)
    where the two differ only in that corner (``ValueError`` otherwise)."""
    module = loc.stage.network.module
    module.cell_low = cell_low
    network = Network.of(module)
    if network.graphdef != graph:
        raise ValueError("the tiles' cell classifiers differ in architecture: one program each")
    return dataclasses.replace(loc, stage=dataclasses.replace(loc.stage, network=network))
