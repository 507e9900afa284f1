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
* :func:`tile_labels`, :func:`label_count`, :func:`fit_tiles` -> :class:`TileModels`: the
  shared GP of Sec. III per tile: its hyperparameters from a few tiles' local pairs (a
  composite likelihood, :func:`~dmimo_jax.gp.fit_blocks`), each tile's GP conditioned on
  its nearest labels (by default those within 3 m of it) at its K APs and tabulated, so
  calibration costs the area, not (L M)^3.
* :func:`tile_tables`: every tile's model and phasor table, stacked on a tile axis (one
  vmapped program, split over devices).
* :func:`tiled_egs`: the exact MLE over tiles: each tile's coherence screen and multi-start
  refinement under the ML cost (eq. 17) on its K APs (its table from :func:`tile_tables`,
  or built and dropped in turn, so memory is one tile's); the tile of lowest ML cost wins
  (the same K everywhere: the same chi-square), the winner's certified exhaustive search
  (eq. 18) is refined too, and the answer is refined on the APs ``fine`` asks for. With
  one tile and K = M it is :func:`~dmimo_jax.estimators.egs` followed by
  :func:`~dmimo_jax.estimators.refine_batch` wherever that finds the optimum.
"""

from dmimo_jax.tiles.models import LABEL_MARGIN, TileModels, fit_tiles, label_count, tile_labels
from dmimo_jax.tiles.search import TiledResult, TileTables, tile_tables, tiled_egs
from dmimo_jax.tiles.tiling import RULES, Tiling, scene_of, tile_aps, tile_boxes, tile_scene

__all__ = [
    "LABEL_MARGIN",
    "RULES",
    "Tiling",
    "TileTables",
    "TiledResult",
    "TileModels",
    "fit_tiles",
    "label_count",
    "tile_labels",
    "scene_of",
    "tile_boxes",
    "tile_aps",
    "tile_scene",
    "tile_tables",
    "tiled_egs",
]
