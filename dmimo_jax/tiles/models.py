r"""The GP phase model per tile (the calibration side of :mod:`dmimo_jax.tiles`): the shared
GP of Sec. III fitted on local training pairs, so its cost grows with the area, not as the
cube of (labels x APs).

The dense fit (:func:`dmimo_jax.gp.fit`) factors one (LM x LM) covariance per likelihood
evaluation: 800 labels of a 40 m hall of 272 APs give 217,600 x 217,600 (379 GB). A tile
needs only its labels and its APs: :func:`tile_labels` picks the n labels nearest each tile,
:func:`fit_tiles` fits the four hyperparameters :math:`\psi` of eq. (22), shared by every AP
and so by every tile, on a few tiles' blocks of (n x K) pairs (the composite likelihood of
:func:`~dmimo_jax.gp.fit_blocks`), then conditions each tile's GP on its own pairs (one
(nK x nK) Cholesky per tile, eq. 25) and tabulates its mean
(:class:`~dmimo_jax.gp.TabulatedGPModel`): a stack of T tile models of one shape, which
:func:`~dmimo_jax.tiles.tile_tables` turns into phasor tables.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import PartitionSpec
from jax.typing import ArrayLike

from dmimo_jax import gp
from dmimo_jax._checks import check_finite, check_int, check_scalar, warn_if_float32
from dmimo_jax.scene import Scene
from dmimo_jax.tiles.tiling import Tiling, scene_of, tile_scene, tile_sharding


def tile_labels(tiling: Tiling, x: ArrayLike, num_labels: int) -> np.ndarray:
    """The ``num_labels`` labeled positions nearest each tile (T, n) int: ranked by their
    horizontal distance from the tile's box (0 inside it), ties by the distance from its
    centre.

    Raises:
        ValueError: ``x`` not (L, 3), ``num_labels`` out of [2, L].
    """
    x = np.asarray(x, float)
    if x.ndim != 2 or x.shape[1] != 3:
        raise ValueError(f"x must have shape (L, 3), got {x.shape}")
    check_finite("x", x)
    check_int("num_labels", num_labels, minimum=2, maximum=x.shape[0])
    out = []
    for lo, hi in zip(tiling.low, tiling.high, strict=True):
        outside = np.maximum(np.maximum(lo[:2] - x[:, :2], x[:, :2] - hi[:2]), 0.0)
        centre = np.linalg.norm(x[:, :2] - (lo[:2] + hi[:2]) / 2, axis=1)
        order = np.lexsort((centre, np.linalg.norm(outside, axis=1)))
        out.append(np.sort(order[:num_labels]))
    return np.stack(out)


LABEL_MARGIN = 3.0
"""The default margin (m) of :func:`label_count`: each tile's GP sees the labels within 3 m
of it (measured against 1 m in docs/locality_measurements.md: about half the model error)."""


def label_count(tiling: Tiling, scene: Scene, num_labels: int, margin: float = LABEL_MARGIN) -> int:
    """The labels per tile n of :func:`fit_tiles` by default: as many as the labels' mean
    density over the UE region (``num_labels`` over its horizontal area) puts in a tile's
    box grown by ``margin`` m on every side (the tiles' mean box), at least 2 and at most
    ``num_labels``.

    Examples:
        >>> import dmimo_jax as dj
        >>> scene = dj.datasets.hall_scene(20, seed=0)
        >>> label_count(dj.tiles.tile_aps(scene, 5.0), scene, 180)  # 180 over 19 x 19 m
        58

    Raises:
        ValueError: ``num_labels`` below 2, a negative ``margin``.
    """
    check_int("num_labels", num_labels, minimum=2)
    check_scalar("margin", margin)
    if margin < 0:
        raise ValueError(f"margin must be a distance >= 0 in m, got {margin}")
    scene = scene_of(scene)
    extent = np.asarray(scene.ue_high - scene.ue_low, float)[:2]
    density = num_labels / float(np.prod(extent))
    sides = np.asarray(tiling.high - tiling.low, float)[:, :2] + 2 * margin
    n = int(np.ceil(density * float(np.mean(np.prod(sides, axis=1))) - 1e-9))
    return int(min(max(n, 2), num_labels))


class TileModels(NamedTuple):
    """Output of :func:`fit_tiles`: every tile's GP phase model, stacked on a tile axis."""

    models: gp.TabulatedGPModel
    """Each leaf (T, ...): the tiles' tabulated GP models."""
    params: gp.GPParams
    """The hyperparameters every tile shares."""
    labels: np.ndarray
    """(T, n) int: the labels each tile was conditioned on."""
    cpo: Array
    """(T, n) each tile's profiled CPOs of its labels."""
    fitted_on: np.ndarray
    """(S,) int: the tiles whose pairs fitted ``params`` (none when they were given)."""

    def tile(self, t: int) -> gp.TabulatedGPModel:
        """Tile ``t``'s model."""
        return jax.tree.map(lambda a: a[t], self.models)


def _block(x, r, noise_var, scene, tiling, labels, t) -> tuple[Any, Any, Any, Scene]:
    """Tile ``t``'s training block: its labels' positions (n, 3), their phases and variances
    (n, K) at its APs, and its scene."""
    pick = np.ix_(labels[t], tiling.aps[t])
    return x[labels[t]], r[pick], noise_var[pick], tile_scene(scene, tiling, t)


def _tile_model(params, x, r, noise_var, scene, *, grids: dict, chunk: int):
    """One tile's GP model (traceable: looped over tiles by :func:`fit_tiles`): its CPOs
    profiled at ``params``, the GP conditioned on its pairs and its tables."""
    cpo = gp.profiled_cpos(params, x, r, noise_var, scene)
    exact = gp.GPPhaseModel.from_data(params, cpo, x, r, noise_var, scene)
    return gp.TabulatedGPModel.tabulate(exact, **grids, chunk=chunk), cpo


@partial(jax.jit, static_argnames=("grids", "chunk", "sharding"))
def _tiles_program(params, *blocks, grids: tuple, chunk: int, sharding: Any):
    """:func:`_tile_model` of every tile of ``blocks`` (each leaf (G, ...)): a loop over
    the tiles (``lax.map``), on each device over its share of them (``shard_map`` along
    the tile axis). A loop, not a ``vmap``: XLA:CPU's batched factorizations of the vmapped
    program sometimes never returned (1 to 2 runs in 3 under the tests' compiler settings)."""

    def local(params, *blocks):
        one = partial(_tile_model, grids=dict(grids), chunk=chunk)
        return jax.lax.map(lambda b: one(params, *b), blocks)

    if sharding is None:
        return local(params, *blocks)
    tiles_spec = sharding.spec
    return jax.shard_map(
        local,
        mesh=sharding.mesh,
        in_specs=(PartitionSpec(),) + (tiles_spec,) * len(blocks),
        out_specs=tiles_spec,
        check_vma=False,
    )(params, *blocks)


def fit_tiles(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    tiling: Tiling,
    *,
    num_labels: int | None = None,
    fit_on: int = 4,
    num_steps: int = 50,
    rtol: float = 1e-8,
    variance: bool = True,
    tabulate: dict | None = None,
    devices: Any = None,
    tiles_per_device: int = 4,
    params: gp.GPParams | None = None,
    progress: bool = False,
) -> TileModels:
    r"""Every tile's GP phase model from L labeled snapshots of all M APs (module docstring).

    1. :func:`tile_labels`: each tile's ``num_labels`` nearest labels.
    2. :math:`\psi` by :func:`~dmimo_jax.gp.fit_blocks` on ``fit_on`` tiles spread over the
       region (tiles 0 .. T-1 evenly; every tile when ``fit_on`` >= T): the blocks of their
       labels times their K APs.
    3. Each tile (one compiled loop over the tiles, split over ``devices``): its CPOs
       profiled at :math:`\psi` (:func:`~dmimo_jax.gp.profile_cpos`),
       the GP conditioned on its n x K pairs (:class:`~dmimo_jax.gp.GPPhaseModel`, its scene
       the tile's, :func:`~dmimo_jax.tiles.tile_scene`) and its mean tabulated
       (:class:`~dmimo_jax.gp.TabulatedGPModel`, with its variance table when ``variance``,
       eq. 27: the weights of the ML cost where the tile's labels leave the GP unsure;
       otherwise the model's variance is the LoS phase noise), over the path differences
       of the whole building so that every tile's tables have one shape.

    Memory and time per tile are the tile's: T Choleskys of (nK x nK), where the dense fit
    needs one of (LM x LM) per likelihood evaluation.

    Args:
        x: the L labeled positions (L, 3), m.
        r: their wrapped phases (L, M).
        noise_var: their phase-noise variances (L, M) (as :func:`~dmimo_jax.gp.fit`'s).
        scene: the building (geometry and wavelength; its permittivity is not used).
        tiling: :func:`~dmimo_jax.tiles.tile_aps` of ``scene``.
        num_labels: n, the labels per tile (at least 2; a tile's own labels and those just
            around it); default :func:`label_count` (the labels' density over the tile
            and :data:`LABEL_MARGIN` m around it).
        fit_on: tiles whose pairs fit the hyperparameters.
        num_steps: the most L-BFGS iterations of :func:`~dmimo_jax.gp.fit_blocks`.
        rtol: its relative stopping tolerance.
        variance: tabulate the GP's predictive variance too (eq. 27; over the 10, 20 and
            40 m halls of two seeds the tiled search's RMSE was 2.7-4.8 times the PEB with
            it and 6.0-13.3 without, docs/locality_measurements.md).
        tabulate: more keyword arguments of
            :meth:`~dmimo_jax.gp.TabulatedGPModel.from_model` (the tables' spacings); by
            default the variance's grid is lambda/16 x 32 nodes (a weight: 16 times fewer
            solves than from_model's lambda/64 x 128).
        devices: the devices the tiles are split over (``jax.sharding`` along the tile
            axis; default: this process's first device).
        tiles_per_device: tiles per device in one call of the compiled program (the tiles
            run ``len(devices) * tiles_per_device`` at a time, the last call padded: one
            program for every call; memory per device grows with it).
        params: the hyperparameters, given: step 2 is skipped (``fit_on``, ``num_steps``
            and ``rtol`` unused). They are the physics' (eq. 22: shared by every AP), so a
            second tiling of the same tiles (a ring of more APs each, for
            :class:`~dmimo_jax.pipeline.tiled.TiledLocator`) takes the first's.
        progress: a tqdm bar over the calls.

    Raises:
        ValueError: bad training data (:func:`~dmimo_jax.gp.check_training_data`), a tiling
            of another scene, a bad ``num_labels`` or ``fit_on``, ``params`` not
            :class:`~dmimo_jax.gp.GPParams`.
    """
    scene = scene_of(scene)
    if not isinstance(tiling, Tiling) or tiling.aps.max() >= scene.num_aps:
        raise ValueError("tiling must be tile_aps' Tiling of this scene")
    gp.check_training_data(x, r, noise_var, scene.num_aps)
    check_int("fit_on", fit_on, minimum=1)
    warn_if_float32("tiles.fit_tiles")
    x, r, noise_var = (np.asarray(v, float) for v in (x, r, noise_var))
    if num_labels is None:
        num_labels = label_count(tiling, scene, x.shape[0])
    labels = tile_labels(tiling, x, num_labels)
    t_all = tiling.num_tiles
    if params is None:
        fitted_on = np.unique(np.round(np.linspace(0, t_all - 1, min(fit_on, t_all))).astype(int))
        blocks = [_block(x, r, noise_var, scene, tiling, labels, t) for t in fitted_on]
        stacked = jax.tree.map(lambda *a: jnp.stack(a), *blocks)
        params = gp.fit_blocks(*stacked, num_steps=num_steps, rtol=rtol).params
    elif isinstance(params, gp.GPParams):
        fitted_on = np.zeros(0, int)
    else:
        raise ValueError(f"params must be GPParams (a fit's), got {type(params).__name__}")
    lam = float(scene.wavelength)
    top = float(np.max(np.asarray(scene.ap_positions)[:, 2]))
    if tabulate is None and variance:  # the variance, a weight: lambda/16 x 32 nodes
        tabulate = dict(var_dd_step=lam / 16, var_num_gamma=32)
    options = dict(tabulate or {})
    chunk = options.pop("chunk", 4096)
    # from_model's margin for its coarsest grid, one for all tiles: tables of one shape
    options = dict(max_path_difference=2 * top + 4 * lam / 16) | options
    # one set of grids for every tile, checked against each tile as from_model checks it
    grids = gp.table_grids(tile_scene(scene, tiling, 0), **options)
    for t in range(1, t_all):
        gp.table_grids(tile_scene(scene, tiling, t), **options)
    if not variance:
        grids["var_dd_step"] = None
    check_int("tiles_per_device", tiles_per_device, minimum=1)
    sharding = tile_sharding(devices)
    per_call = (1 if sharding is None else sharding.mesh.size) * tiles_per_device
    # jitted once at module level, the grids static (a sorted tuple: hashable): a second
    # fit of the same shapes reuses the compiled program
    program = partial(
        _tiles_program, grids=tuple(sorted(grids.items())), chunk=chunk, sharding=sharding
    )
    calls = range(0, t_all, per_call)
    if progress:
        from tqdm.auto import tqdm

        calls = tqdm(calls, desc=f"tile models ({per_call} per call)", unit="call")
    models, cpos = [], []
    for first in calls:
        # the last call padded with copies of its first tile: one program for every call
        group = [t if t < t_all else first for t in range(first, first + per_call)]
        blocks = [_block(x, r, noise_var, scene, tiling, labels, t) for t in group]
        stacked = jax.tree.map(lambda *a: jnp.stack(a), *blocks)
        if sharding is not None:
            stacked = jax.device_put(stacked, sharding)
        model, cpo = program(params, *stacked)
        keep = min(per_call, t_all - first)
        models.append(jax.tree.map(lambda a, keep=keep: a[:keep], model))
        cpos.append(cpo[:keep])
    stacked = jax.tree.map(lambda *a: jnp.concatenate(a), *models)
    return TileModels(stacked, params, labels, jnp.concatenate(cpos), fitted_on)
