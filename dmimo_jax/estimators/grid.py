r"""Exhaustive grid search (EGS) of the LS cost, eq. (18): grids, lookup tables, chunked search.

Grid points are cell centres ``low + (i + 1/2) * spacing`` of a box, so a 10 x 10 x 4 m
room at :math:`\lambda/8` has 213 x 213 x 85 = 3.86 M points (the paper's
:math:`V/\delta^3`) and no point lies on the ground. Points are generated from their
flat index inside each chunk, so the table-free path never stores the grid.

Two exact paths, both scanning the grid in chunks (memory flat in the grid size) and
sharding the chunks over ``jax.devices()`` when there are several:

* **table-free** (``egs(r, model, grid)``): the model phases are computed per chunk and
  the LS cost (eq. 18) evaluated at every point. Memory ~ ``batch * chunk * M`` floats.
* **lookup table** (``egs(r, model, phasor_table(model, grid))``, the paper's table, and
  the fast path): the grid's model phasors :math:`e^{j\theta_m(\mathbf x)}` are
  precomputed once (G x 2M, float32). For a batch of snapshots the *coherence*
  :math:`c(\mathbf x) = |\sum_m e^{j(r_m - \theta_m(\mathbf x))}|` of every grid point is
  one real matrix product (G x 2M)(2M x 2B); the ``num_candidates`` most coherent
  points per snapshot are then re-ranked with the exact float64 LS cost. The screen is
  *certified*: for any CPO :math:`\phi`,
  :math:`\tilde C \ge 2\sum_m(1-\cos e_m) = 2(M - \mathrm{Re}\,e^{-j\phi}\sum_m e^{j(r_m-\theta_m)})
  \ge 2(M - c)` (from :math:`1-\cos e \le e^2/2`), so when the best re-ranked cost is at
  most :math:`2(M - c_K)` for the K-th coherence :math:`c_K`, no unscreened point can beat
  it. Snapshots whose certificate fails are re-run on the table-free path, so the result
  is always the exact arg-min of eq. (18).

Why float32 for the table: grid quantisation alone puts the nearest point up to
:math:`\pi\sqrt3\,\delta/\lambda` = 0.68 rad from the truth per AP at :math:`\lambda/8`;
float32 rounding of a wrapped phasor is 6e-8. The certificate carries a margin for it,
and the final costs are float64.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_finite,
    check_num_aps,
    check_phases,
    is_concrete,
    warn_if_float32,
)
from dmimo_jax.estimators.mle import check_lm_settings, compressed_residuals, refine_multistart
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.pytree import pytree_dataclass, static_field
from dmimo_jax.scene import Scene

__all__ = [
    "Grid",
    "as_spacing",
    "make_grid",
    "search_grid",
    "grid_points",
    "PhasorTable",
    "phasor_table",
    "EgsResult",
    "egs",
    "CoarseToFineResult",
    "coarse_to_fine",
    "egs_scan",
    "egs_table_search",
    "screen",
]

_AXIS = "grid"  # mesh axis the grid chunks are sharded over


@pytree_dataclass
class Grid:
    """A uniform grid of cell centres: ``low + (index + 1/2) * spacing`` (a pytree).

    Attributes:
        low: (3,) lower corner of the box, m.
        spacing: cell size, m (static).
        shape: points per axis (static).
    """

    low: Array
    spacing: float = static_field()
    shape: tuple[int, int, int] = static_field()

    @property
    def size(self) -> int:
        return math.prod(self.shape)


def as_spacing(spacing: Any) -> float:
    """A grid spacing as a Python float: any real scalar (Python, NumPy or a concrete JAX
    array, e.g. ``scene.wavelength / 8``), finite and > 0, else ``ValueError``."""
    if isinstance(spacing, bool) or np.ndim(spacing) != 0 or not is_concrete(spacing):
        raise ValueError(f"spacing must be a concrete real scalar (metres), got {spacing!r}")
    try:
        value = float(spacing)
    except (TypeError, ValueError) as err:
        raise ValueError(f"spacing must be a real number of metres, got {spacing!r}") from err
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"spacing must be a positive finite number of metres, got {spacing!r}")
    return value


def make_grid(low: ArrayLike, high: ArrayLike, spacing: float) -> Grid:
    """The cell-centre grid of the box ``[low, high]`` with cells of ``spacing`` metres.

    Raises:
        ValueError: non-positive or non-finite spacing, or a box smaller than one cell.
    """
    spacing = as_spacing(spacing)
    low_np, high_np = np.asarray(low, float), np.asarray(high, float)
    if low_np.shape != (3,) or high_np.shape != (3,):
        raise ValueError(f"low and high must have shape (3,), got {low_np.shape}, {high_np.shape}")
    check_finite("low", low_np)
    check_finite("high", high_np)
    counts = np.floor((high_np - low_np) / spacing + 1e-9).astype(int)
    if np.any(counts < 1):
        raise ValueError(f"box {low_np}..{high_np} is smaller than one cell of {spacing} m")
    size = int(np.prod(counts.astype(np.int64)))
    if size >= 2**31:
        raise ValueError(f"a grid of {size} points is too large; at most 2**31 - 1 are supported")
    return Grid(jnp.asarray(low_np), float(spacing), tuple(int(c) for c in counts))


def search_grid(scene: Any, spacing: float, region: str = "room") -> Grid:
    """The search grid of the paper: the room box ``[0, room_size]`` (V = 400 m^3) or the UE region.

    Args:
        scene: a Scene (or a model with a ``.scene``).
        spacing: grid spacing delta, m (e.g. ``scene.wavelength / 8``).
        region: ``"room"`` (default, as the paper's FLOP count) or ``"ue"``.
    """
    scene = getattr(scene, "scene", scene)
    if region == "room":
        return make_grid(np.zeros(3), np.asarray(scene.room_size), spacing)
    if region == "ue":
        return make_grid(np.asarray(scene.ue_low), np.asarray(scene.ue_high), spacing)
    raise ValueError(f"region must be 'room' or 'ue', got {region!r}")


def grid_points(grid: Grid, index: ArrayLike) -> Array:
    """Positions (..., 3) of flat grid indices (C order)."""
    ijk = jnp.stack(jnp.unravel_index(jnp.asarray(index), grid.shape), axis=-1)
    low = grid.low.reshape((1,) * (ijk.ndim - 1) + (3,))
    return low + (ijk.astype(grid.low.dtype) + 0.5) * grid.spacing


# ----------------------------------------------------------------------------- devices


def _mesh(devices: Any) -> Mesh | None:
    """A 1-D mesh over ``devices`` (default: all), or None for a single device."""
    devices = jax.devices() if devices is None else list(devices)
    if len(devices) == 0:
        raise ValueError("devices must name at least one device")
    return None if len(devices) == 1 else Mesh(np.asarray(devices), (_AXIS,))


def _num_chunks(size: int, chunk_size: int, mesh: Mesh | None) -> int:
    """Chunks covering ``size`` points, rounded up to a multiple of the device count."""
    n_dev = 1 if mesh is None else mesh.size
    chunks = math.ceil(size / chunk_size)
    return math.ceil(chunks / n_dev) * n_dev


def _sharded_top_k(local, mesh, num_chunks, k, sharded=(), replicated=()):
    """Run ``local(first_chunk, num_local_chunks, *sharded, *replicated)`` on every device.

    ``local`` returns its (B, k) best scores and indices over its chunks; the per-device
    winners are merged into the overall top ``k``.
    """
    if mesh is None:
        return local(jnp.zeros((), jnp.int32), num_chunks, *sharded, *replicated)
    per = num_chunks // mesh.size

    def per_device(*args):
        first = jax.lax.axis_index(_AXIS).astype(jnp.int32) * per
        return local(first, per, *args)

    in_specs = (P(_AXIS),) * len(sharded) + (P(),) * len(replicated)
    scores, index = jax.shard_map(
        per_device, mesh=mesh, in_specs=in_specs, out_specs=P(None, _AXIS), check_vma=False
    )(*sharded, *replicated)
    return _top_k(scores, index, k)


def _top_k(scores: Array, index: Array, k: int) -> tuple[Array, Array]:
    """The ``k`` largest ``scores`` (B, n) per row and their ``index`` (B, n), best first."""
    if k == 1:
        j = jnp.argmax(scores, axis=1)[:, None]
    else:
        _, j = jax.lax.top_k(scores, k)
    return jnp.take_along_axis(scores, j, axis=1), jnp.take_along_axis(index, j, axis=1)


def _scan_chunks(score_chunk, first, num_chunks, chunk_size, size, k, batch, dtype):
    """Running top-``k`` of ``score_chunk(c)`` (B, chunk) over chunks ``first + 0..num_chunks-1``."""

    def body(carry, c):
        idx = c * chunk_size + jnp.arange(chunk_size, dtype=jnp.int32)
        valid = (idx < size)[None, :]
        scores = jnp.where(valid, score_chunk(c - first, jnp.minimum(idx, size - 1)), -jnp.inf)
        idx = jnp.broadcast_to(idx[None, :], scores.shape)
        new = _top_k(scores, idx, k)
        return _top_k(
            jnp.concatenate([carry[0], new[0]], axis=1), jnp.concatenate([carry[1], new[1]], 1), k
        ), None

    init = (jnp.full((batch, k), -jnp.inf, dtype), jnp.zeros((batch, k), jnp.int32))
    chunks = first + jnp.arange(num_chunks, dtype=jnp.int32)
    return jax.lax.scan(body, init, chunks)[0]


# ----------------------------------------------------------------------------- table


@pytree_dataclass
class PhasorTable:
    r"""The paper's lookup table: model phasors on a grid, ``[cos theta, sin theta]`` (a pytree).

    Attributes:
        data: (num_chunks * chunk_size, 2M) float32; rows past ``grid.size`` are zero.
            Sharded by rows over ``mesh`` when there are several devices.
        grid: the grid it tabulates.
        chunk_size: rows per matrix product (static).
        num_chunks: chunks in ``data``, a multiple of the device count (static).
        mesh: the device mesh ``data`` is sharded over, or None (static).
    """

    data: Array
    grid: Grid
    chunk_size: int = static_field()
    num_chunks: int = static_field()
    mesh: Mesh | None = static_field()

    @property
    def num_aps(self) -> int:
        return self.data.shape[1] // 2


def phasor_table(
    model: PhaseModel | Scene,
    grid: Grid,
    *,
    chunk_size: int = 8192,
    devices: Any = None,
    max_bytes: float = 8 * 2**30,
) -> PhasorTable:
    r"""Tabulate :math:`e^{j\theta_m(\mathbf x)}` (eq. 7b, without CPO) on every grid point, once.

    A :math:`\lambda/8` room grid (3.86 M points, 17 APs) takes 0.52 GB.

    Args:
        model: PhaseModel or Scene (the float64 model; entries are rounded to float32).
        grid: the search grid.
        chunk_size: grid points per matrix product in :func:`egs`.
        devices: devices to shard the rows over (default: all of ``jax.devices()``).
        max_bytes: refuse tables larger than this (use the table-free :func:`egs`).

    Raises:
        ValueError: bad ``chunk_size`` or a table above ``max_bytes``.
    """
    model = as_phase_model(model)
    if not (isinstance(chunk_size, int) and chunk_size >= 1):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    mesh = _mesh(devices)
    chunk_size = min(chunk_size, grid.size)
    num_chunks = _num_chunks(grid.size, chunk_size, mesh)
    nbytes = num_chunks * chunk_size * 2 * model.num_aps * 4
    if nbytes > max_bytes:
        raise ValueError(
            f"a phasor table of {grid.size} points x {model.num_aps} APs needs "
            f"{nbytes / 2**30:.1f} GiB > max_bytes = {max_bytes / 2**30:.1f} GiB; use a coarser "
            "grid, coarse_to_fine, or the table-free egs(r, model, grid)"
        )
    data = _phasor_rows(model, grid, num_chunks * chunk_size, chunk_size)
    if mesh is not None:
        data = jax.device_put(data, NamedSharding(mesh, P(_AXIS)))
    return PhasorTable(data, grid, chunk_size, num_chunks, mesh)


@partial(jax.jit, static_argnames=("rows", "chunk_size"))
def _phasor_rows(model: PhaseModel | Scene, grid: Grid, rows: int, chunk_size: int) -> Array:
    def one(i: Array) -> Array:  # lax.map with batch_size vmaps this over a chunk
        theta = model.mean(grid_points(grid, jnp.minimum(i, grid.size - 1)))
        row = jnp.concatenate([jnp.cos(theta), jnp.sin(theta)])
        return jnp.where(i < grid.size, row, 0.0).astype(jnp.float32)

    return jax.lax.map(one, jnp.arange(rows, dtype=jnp.int32), batch_size=chunk_size)


# ----------------------------------------------------------------------------- search


class EgsResult(NamedTuple):
    """Output of :func:`egs` (leading batch axis B)."""

    x: Array  # (B, 3) arg-min positions, m
    cost: Array  # (B,) minimal LS cost (eq. 18)
    index: Array  # (B,) flat grid index of the arg-min
    screened: Array  # (B,) bool: True where a table screen certified the arg-min
    # (always True on the table-free path; False where the table path needed a full scan)


def egs(
    r: ArrayLike,
    model: PhaseModel | Scene,
    grid: Grid | PhasorTable | float,
    *,
    region: str = "room",
    chunk_size: int | None = None,
    num_candidates: int = 64,
    widen: int = 16,
    devices: Any = None,
) -> EgsResult:
    r"""Exhaustive grid search of the LS cost, eq. (18), for one or many snapshots.

    Args:
        r: (M,) or (B, M) wrapped phases.
        model: PhaseModel or Scene.
        grid: a :class:`Grid`; a spacing in metres (the grid of :func:`search_grid` over
            ``region``); or a :class:`PhasorTable` of ``model`` on a grid (fast path).
        region: ``"room"`` or ``"ue"`` when ``grid`` is a spacing.
        chunk_size: grid points per step of the table-free scan (default: about 2^23
            floats of work per step); a table carries its own.
        num_candidates: points per snapshot re-ranked exactly after the table screen.
        widen: snapshots whose certificate fails are screened again with
            ``widen * num_candidates`` candidates before falling back to the table-free scan.
        devices: devices the table-free scan is sharded over (default: all); a table
            uses the devices it was built on.

    Returns:
        :class:`EgsResult`: the exact arg-min of eq. (18) over the grid.
    """
    model = as_phase_model(model)
    check_num_aps(model.num_aps)
    check_phases("r", r, model.num_aps)
    warn_if_float32("egs")
    if not isinstance(grid, (Grid, PhasorTable)):
        grid = search_grid(model, as_spacing(grid), region)
    if chunk_size is not None and not (isinstance(chunk_size, int) and chunk_size >= 1):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if not (isinstance(num_candidates, int) and num_candidates >= 1):
        raise ValueError(f"num_candidates must be a positive int, got {num_candidates!r}")
    if not (isinstance(widen, int) and widen >= 1):
        raise ValueError(f"widen must be a positive int, got {widen!r}")
    dtype = grid.grid.low.dtype if isinstance(grid, PhasorTable) else grid.low.dtype
    r = jnp.asarray(r, dtype)
    r = r[None, :] if r.ndim == 1 else r
    if r.shape[0] == 0:  # an empty batch: empty results
        empty = jnp.zeros((0,), dtype)
        return EgsResult(
            jnp.zeros((0, 3), dtype), empty, jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool)
        )
    if isinstance(grid, PhasorTable):
        if grid.num_aps != model.num_aps:
            raise ValueError(f"table has {grid.num_aps} APs, the model {model.num_aps}")
        res = egs_table_search(r, model, grid, min(num_candidates, grid.grid.size))
        bad = np.flatnonzero(~np.asarray(res.screened))
        if bad.size and widen > 1:  # certificate failed: a wider screen for those snapshots
            wide = egs_table_search(
                r[bad], model, grid, min(widen * num_candidates, grid.grid.size)
            )
            res = _scatter(res, bad, wide)
            bad = np.flatnonzero(~np.asarray(res.screened))
        if bad.size:  # still uncertified: the exact table-free scan (screened stays False)
            devices = None if grid.mesh is None else grid.mesh.devices.ravel()
            exact = egs(r[bad], model, grid.grid, devices=devices)
            res = _scatter(res, bad, exact._replace(screened=jnp.zeros(bad.size, bool)))
        return res
    if chunk_size is None:
        chunk_size = int(np.clip(2**23 // (r.shape[0] * model.num_aps), 64, 8192))
    chunk_size = min(chunk_size, grid.size)
    return egs_scan(r, model, grid, chunk_size, _mesh(devices))


def _scatter(res: EgsResult, rows: np.ndarray, new: EgsResult) -> EgsResult:
    """``res`` with ``rows`` replaced by ``new`` (``screened`` as ``new`` reports it)."""
    return EgsResult(*(a.at[rows].set(b) for a, b in zip(res, new, strict=True)))


@partial(jax.jit, static_argnames=("chunk_size", "mesh"))
def egs_scan(
    r: Array, model: PhaseModel, grid: Grid, chunk_size: int, mesh: Mesh | None
) -> EgsResult:
    """The table-free path of :func:`egs`, jitted and unchecked: every grid point's LS cost.

    Args:
        r: (B, M) wrapped phases (float64).
        model: a PhaseModel (not a Scene).
        grid: the grid to scan.
        chunk_size: points per scan step (static).
        mesh: device mesh the chunks are sharded over, or None (static).
    """
    num_chunks = _num_chunks(grid.size, chunk_size, mesh)

    def local(first, n, r, model, grid):
        def neg_cost(_, idx):
            theta = jax.vmap(model.mean)(grid_points(grid, idx))
            return -_ls_costs(r, theta)

        return _scan_chunks(neg_cost, first, n, chunk_size, grid.size, 1, r.shape[0], r.dtype)

    score, index = _sharded_top_k(local, mesh, num_chunks, 1, replicated=(r, model, grid))
    index = index[:, 0]
    return EgsResult(grid_points(grid, index), -score[:, 0], index, jnp.ones(index.shape, bool))


@partial(jax.jit, static_argnames=("k",))
def egs_table_search(r: Array, model: PhaseModel, table: PhasorTable, k: int) -> EgsResult:
    """The table path of :func:`egs`, jitted and unchecked: coherence screen of ``table``,
    float64 re-rank of the ``k`` best points, and the certificate (``screened``); no
    fallback for uncertified snapshots (:func:`egs` adds it).
    """
    grid, m = table.grid, model.num_aps
    score, cand = screen(r, table, k)
    # exact float64 re-rank of the candidates
    theta = jax.vmap(jax.vmap(model.mean))(grid_points(grid, cand))  # (B, k, M)
    costs = jnp.sum(compressed_residuals(r[:, None, :], theta) ** 2, axis=-1)
    costs = jnp.where(jnp.isfinite(score), costs, jnp.inf)
    j = jnp.argmin(costs, axis=1)
    cost = jnp.take_along_axis(costs, j[:, None], axis=1)[:, 0]
    index = jnp.take_along_axis(cand, j[:, None], axis=1)[:, 0]
    # certificate: every unscreened point has coherence <= c_k, so LS >= 2 (M - c_k)
    c_k = jnp.sqrt(jnp.maximum(score[:, -1].astype(r.dtype), 0.0))
    margin = 64 * m * float(jnp.finfo(jnp.float32).eps)
    screened = (cost <= 2 * (m - c_k) - margin) | ~jnp.isfinite(score[:, -1])
    return EgsResult(grid_points(grid, index), cost, index, screened)


def screen(r: Array, table: PhasorTable, k: int) -> tuple[Array, Array]:
    """Top-``k`` squared coherences |sum_m e^{j(r_m - theta_m)}|^2 (B, k) and their flat
    grid indices (B, k), best first: the matrix-product screen of the phasor table
    (traceable, unchecked; ``k`` static under jit)."""
    batch, chunk = r.shape[0], table.chunk_size
    c, s = jnp.cos(r).astype(jnp.float32), jnp.sin(r).astype(jnp.float32)
    # Re and Im of sum_m e^{j r_m} e^{-j theta_m} = [cos th, sin th] @ [[c, s], [s, -c]]^T
    snap = jnp.concatenate(
        [jnp.concatenate([c, s], axis=1), jnp.concatenate([s, -c], axis=1)], axis=0
    ).T  # (2M, 2B)

    def local(first, n, data, snap):
        def coherence2(c_local, _):
            rows = jax.lax.dynamic_slice_in_dim(data, c_local * chunk, chunk)
            z = jnp.einsum("mb,cm->bc", snap, rows)  # (2B, chunk): 2x faster than rows @ snap
            return z[:batch] ** 2 + z[batch:] ** 2

        return _scan_chunks(coherence2, first, n, chunk, table.grid.size, k, batch, jnp.float32)

    return _sharded_top_k(
        local, table.mesh, table.num_chunks, k, sharded=(table.data,), replicated=(snap,)
    )


def _ls_costs(r: Array, theta: Array) -> Array:
    """LS cost (eq. 18) of snapshots r (B, M) against model phases theta (K, M): (B, K)."""
    return jnp.sum(compressed_residuals(r[:, None, :], theta[None, :, :]) ** 2, axis=-1)


# ----------------------------------------------------------------------------- coarse to fine


class CoarseToFineResult(NamedTuple):
    """Output of :func:`coarse_to_fine` (leading batch axis B)."""

    x: Array  # (B, 3) refined estimate with the lowest ML cost, m
    cost: Array  # (B,) its ML cost (eq. 17)
    start: Array  # (B, 3) the coarse grid point it was refined from
    starts: Array  # (B, K) flat coarse-grid indices of all starts


def coarse_to_fine(
    r: ArrayLike,
    model: PhaseModel | Scene,
    table: PhasorTable,
    *,
    num_starts: int = 8,
    num_steps: int = 25,
) -> CoarseToFineResult:
    r"""Hierarchical search (beyond the paper): coarse coherence screen + multi-start refinement.

    The ``num_starts`` most coherent points of a coarse table (e.g. :math:`\lambda/4`) start
    Levenberg-Marquardt refinements of the ML cost (eq. 17, :func:`refine_batch`); the
    refined point of lowest cost wins. This replaces a :math:`\lambda/8` EGS + refinement
    at 1/8 of the table and matrix work (see ``benchmarks/egs_flops.py`` for the agreement).

    Args:
        r: (M,) or (B, M) wrapped phases.
        model: PhaseModel or Scene the table was built from.
        table: coarse :class:`PhasorTable`.
        num_starts: refinements per snapshot.
        num_steps: LM steps per refinement.
    """
    model = as_phase_model(model)
    check_num_aps(model.num_aps)
    check_phases("r", r, model.num_aps)
    warn_if_float32("coarse_to_fine")
    if not isinstance(table, PhasorTable):
        raise ValueError(
            f"table must be a PhasorTable (build one with phasor_table(model, grid)), got "
            f"{type(table).__name__}"
        )
    check_lm_settings(num_steps, 1e-3)
    if not (isinstance(num_starts, int) and 1 <= num_starts <= table.grid.size):
        raise ValueError(f"num_starts must be an int in [1, {table.grid.size}], got {num_starts!r}")
    if table.num_aps != model.num_aps:
        raise ValueError(f"table has {table.num_aps} APs, the model {model.num_aps}")
    r = jnp.asarray(r, table.grid.low.dtype)
    r = r[None, :] if r.ndim == 1 else r
    if r.shape[0] == 0:
        z = jnp.zeros((0, 3), r.dtype)
        return CoarseToFineResult(z, jnp.zeros((0,), r.dtype), z, jnp.zeros((0, 0), jnp.int32))
    return _coarse_to_fine(r, model, table, num_starts, num_steps)


@partial(jax.jit, static_argnames=("k", "num_steps"))
def _coarse_to_fine(r, model, table, k, num_steps) -> CoarseToFineResult:
    batch = r.shape[0]
    _, cand = screen(r, table, k)
    x0 = grid_points(table.grid, cand)  # (B, k, 3)
    fine = refine_multistart(x0, r, model, num_steps=num_steps)
    start = jnp.take_along_axis(x0, fine.index[:, None, None], axis=1)[:, 0]
    return CoarseToFineResult(fine.x, fine.cost, start, cand.reshape(batch, k))
