"""Tiles of the UE region and each tile's APs (the model side of :mod:`dmimo_jax.tiles`)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jax.typing import ArrayLike

from dmimo_jax._checks import check_int, check_scalar
from dmimo_jax.bounds import linearize, peb_from_fim
from dmimo_jax.physics import TwoRayModel
from dmimo_jax.scene import Scene

RULES = ("bound", "nearest", "all")
"""The rules by which :func:`tile_aps` chooses a tile's APs."""


class Tiling(NamedTuple):
    """Tiles of a scene's UE region and each tile's APs (:func:`tile_aps`)."""

    low: np.ndarray
    """(T, 3) each tile's lower corner, m."""
    high: np.ndarray
    """(T, 3) its upper corner, m."""
    aps: np.ndarray
    """(T, K) int: each tile's APs, nearest its centre first."""
    ratio: np.ndarray
    """(T,) the tile's worst PEB of its K APs over the all-AP PEB."""
    need: np.ndarray
    """(T,) int: the fewest of its nearest APs each tile needs by the rule (K is their
    maximum: the tiles share one K so that they stack; rules other than ``"bound"``: K)."""
    rule: str
    """How the APs were chosen ("bound", "nearest" or "all")."""

    @property
    def num_tiles(self) -> int:
        """The number of tiles, T."""
        return int(self.low.shape[0])

    @property
    def num_aps(self) -> int:
        """K, the APs of each tile."""
        return int(self.aps.shape[1])

    def take(self, tiles: ArrayLike) -> Tiling:
        """These tiles only, in the order given (a sample of a building's, to measure a
        floor too large to run whole: :func:`fit_tiles` and
        :func:`~dmimo_jax.pipeline.tile_offlines` take it like the whole).

        Raises:
            ValueError: ``tiles`` not distinct indices of this tiling's tiles.
        """
        tiles = np.asarray(tiles)
        if (tiles.ndim != 1 or tiles.size == 0 or not np.issubdtype(tiles.dtype, np.integer)
                or tiles.min() < 0 or tiles.max() >= self.num_tiles
                or np.unique(tiles).size != tiles.size):  # fmt: skip
            raise ValueError(
                f"tiles must be distinct indices in [0, {self.num_tiles}), got {tiles.tolist()}"
            )
        return Tiling(self.low[tiles], self.high[tiles], self.aps[tiles], self.ratio[tiles],
                      self.need[tiles], self.rule)  # fmt: skip


def scene_of(model: Any) -> Scene:
    """The scene of ``model``: a :class:`~dmimo_jax.scene.Scene` itself or a
    :class:`~dmimo_jax.physics.TwoRayModel`'s (``ValueError`` for anything else)."""
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
        # below 4 APs a position and a CPO are not identifiable (the FIM is singular)
        enough = jnp.arange(1, order.shape[0] + 1) >= 4
        return jnp.where(enough, jax.vmap(peb_from_fim)(fim), jnp.inf)

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
      positions spanning the tile (its corners included); K the largest any tile needs
      (each tile's own count in :attr:`Tiling.need`).
    * ``"nearest"``: the ``num_aps`` nearest APs.
    * ``"all"``: every AP (locality off).

    Returns:
        :class:`Tiling` with each tile's worst ratio of its K-AP PEB to the all-AP PEB and
        the APs it needs alone.

    Raises:
        ValueError: an unknown ``rule``, ``factor`` below 1, a ``num_aps`` out of [4, M]
            (or given for another rule), ``points`` below 2.
    """
    scene = scene_of(model)
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
    if rule == "bound":
        need = np.array([np.argmax(np.all(p <= factor * p[:, -1:], axis=0)) + 1 for p in pebs])
        k = int(need.max())
    else:
        k = m if rule == "all" else int(num_aps)
        need = np.full(low.shape[0], k)
    aps = np.stack([o[:k] for o in orders])
    ratio = np.array([float(np.max(p[:, k - 1] / p[:, -1])) for p in pebs])
    return Tiling(low, high, aps, ratio, need.astype(int), rule)


def tile_scene(scene: Scene, tiling: Tiling, t: int) -> Scene:
    """Tile ``t``'s deployment: the scene of its APs (:meth:`~dmimo_jax.scene.Scene.subset`)
    with its box as the UE region."""
    check_int("t", t, maximum=tiling.num_tiles - 1)
    return scene.subset(tiling.aps[t]).replace(ue_low=tiling.low[t], ue_high=tiling.high[t])


def tile_sharding(devices: Any) -> NamedSharding | None:
    """The sharding of a tile axis over ``devices`` (``jax.sharding`` along the leading
    axis, named ``"tiles"``), or None for one device; ``devices=None`` is this process's
    first device (the tiles' functions run on one device unless given more).

    Raises:
        ValueError: an empty ``devices``.
    """
    devices = [jax.local_devices()[0]] if devices is None else list(devices)
    if not devices:
        raise ValueError("devices must name at least one device")
    if len(devices) == 1:
        return None
    return NamedSharding(Mesh(np.asarray(devices), ("tiles",)), PartitionSpec("tiles"))
