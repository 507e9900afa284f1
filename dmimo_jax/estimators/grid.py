r"""Grids of the UE region or the room, their sharding over devices, and the paper's lookup table.

Grid points are cell centres ``low + (i + 1/2) * spacing`` of a box, so a 10 x 10 x 4 m
room at :math:`\lambda/8` has 213 x 213 x 85 = 3.86 M points (the paper's
:math:`V/\delta^3`) and no point lies on the ground. Points are generated from their
flat index inside each chunk, so a scan over the grid never stores it.

The searches over a grid (:mod:`~dmimo_jax.estimators.search`: EGS, eq. 18, and
``coarse_to_fine``) scan it in chunks (memory flat in the grid size), sharded over
``jax.devices()`` when there are several: :func:`device_mesh`, :func:`scan_top_k` and
:func:`sharded_top_k` are that machinery. :func:`phasor_table` is the paper's lookup
table: the grid's model phasors :math:`e^{j\theta_m(\mathbf x)}`, precomputed once as
float32 rows (:func:`~dmimo_jax.estimators.phasors.phasor_rows`), sharded by rows.

Why float32 for the table: grid quantisation alone puts the nearest point up to
:math:`\pi\sqrt3\,\delta/\lambda` = 0.68 rad from the truth per AP at :math:`\lambda/8`;
float32 rounding of a wrapped phasor is 6e-8. The search's certificate carries a margin
for it, and its final costs are float64.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from dmimo_jax._checks import check_finite, check_int, check_table_aps, is_concrete
from dmimo_jax.estimators.phasors import phasor_rows
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.pytree import map_in_chunks, pytree_dataclass, static_field
from dmimo_jax.scene import Scene

GRID_AXIS = "grid"  # mesh axis the grid chunks are sharded over


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
        """The number of grid points."""
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
    """Positions (..., 3) of flat grid indices (C order), none below z = 1 mm (the points
    of a grid that reaches below the ground are kept on it: :func:`~dmimo_jax.estimators.cell_table`'s
    grid widens the cells by half a spacing)."""
    ijk = jnp.stack(jnp.unravel_index(jnp.asarray(index), grid.shape), axis=-1)
    low = grid.low.reshape((1,) * (ijk.ndim - 1) + (3,))
    x = low + (ijk.astype(grid.low.dtype) + 0.5) * grid.spacing
    return x.at[..., 2].max(1e-3)  # a grid reaching below the ground: its points on it


# ----------------------------------------------------------------------------- devices


def device_mesh(devices: Any) -> Mesh | None:
    """A 1-D mesh over ``devices`` (default: this process's local devices; with several
    processes, jax.distributed, each keeps its own copy), or None for a single device."""
    devices = jax.local_devices() if devices is None else list(devices)
    if len(devices) == 0:
        raise ValueError("devices must name at least one device")
    return None if len(devices) == 1 else Mesh(np.asarray(devices), (GRID_AXIS,))


def num_chunks_for(size: int, chunk_size: int, mesh: Mesh | None) -> int:
    """Chunks covering ``size`` points, rounded up to a multiple of the device count."""
    n_dev = 1 if mesh is None else mesh.size
    chunks = math.ceil(size / chunk_size)
    return math.ceil(chunks / n_dev) * n_dev


def sharded_top_k(local, mesh, num_chunks, k, sharded=(), replicated=()):
    """Run ``local(first_chunk, num_local_chunks, *sharded, *replicated)`` on every device.

    ``local`` returns its (B, k) best scores and indices over its chunks; the per-device
    winners are merged into the overall top ``k``.
    """
    if mesh is None:
        return local(jnp.zeros((), jnp.int32), num_chunks, *sharded, *replicated)
    per = num_chunks // mesh.size

    def per_device(*args):
        first = jax.lax.axis_index(GRID_AXIS).astype(jnp.int32) * per
        return local(first, per, *args)

    in_specs = (P(GRID_AXIS),) * len(sharded) + (P(),) * len(replicated)
    scores, index = jax.shard_map(
        per_device, mesh=mesh, in_specs=in_specs, out_specs=P(None, GRID_AXIS), check_vma=False
    )(*sharded, *replicated)
    return top_k(scores, index, k)


def top_k(scores: Array, index: Array, k: int) -> tuple[Array, Array]:
    """The ``k`` largest ``scores`` (B, n) per row and their ``index`` (B, n), best first."""
    if k == 1:
        j = jnp.argmax(scores, axis=1)[:, None]
    else:
        _, j = jax.lax.top_k(scores, k)
    return jnp.take_along_axis(scores, j, axis=1), jnp.take_along_axis(index, j, axis=1)


def scan_top_k(score_chunk, first, num_chunks, chunk_size, size, k, batch, dtype):
    """Running top-``k`` (B, k) scores and flat indices over chunks ``first + 0..num_chunks-1``.

    ``score_chunk(local_chunk, idx)`` scores the points ``idx`` (chunk,) of one chunk
    (B, chunk); points past ``size`` score ``-inf``. Traceable (a ``lax.scan``). Each step
    takes the top ``k`` of the running ``k`` and the chunk's scores in one ``top_k`` (the
    carry first: equal scores keep the lower index, as a sort of all points would), not the
    chunk's own top ``k`` and then a merge: the same answer, one partial sort fewer.
    """

    def body(carry, c):
        idx = c * chunk_size + jnp.arange(chunk_size, dtype=jnp.int32)
        valid = (idx < size)[None, :]
        scores = jnp.where(valid, score_chunk(c - first, jnp.minimum(idx, size - 1)), -jnp.inf)
        idx = jnp.broadcast_to(idx[None, :], scores.shape)
        both = jnp.concatenate([carry[0], scores], axis=1), jnp.concatenate([carry[1], idx], 1)
        return top_k(*both, k), None

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
        """The number of APs, M."""
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
        chunk_size: grid points per matrix product of the screen.
        devices: devices to shard the rows over (default: this process's ``jax.local_devices()``).
        max_bytes: refuse tables larger than this (use the table-free
            :func:`~dmimo_jax.estimators.egs`).

    Raises:
        ValueError: bad ``chunk_size`` or a table above ``max_bytes``.
    """
    model = as_phase_model(model)
    check_int("chunk_size", chunk_size, minimum=1)
    mesh = device_mesh(devices)
    chunk_size = min(chunk_size, grid.size)
    num_chunks = num_chunks_for(grid.size, chunk_size, mesh)
    nbytes = num_chunks * chunk_size * 2 * model.num_aps * 4
    if nbytes > max_bytes:
        raise ValueError(
            f"a phasor table of {grid.size} points x {model.num_aps} APs needs "
            f"{nbytes / 2**30:.1f} GiB > max_bytes = {max_bytes / 2**30:.1f} GiB; use a coarser "
            "grid, coarse_to_fine, or the table-free egs(r, model, grid)"
        )
    data = _table_rows(model, grid, num_chunks * chunk_size, chunk_size)
    if mesh is not None:
        data = jax.device_put(data, NamedSharding(mesh, P(GRID_AXIS)))
    return PhasorTable(data, grid, chunk_size, num_chunks, mesh)


def check_table_of(table: PhasorTable, model: PhaseModel | Scene, name: str = "table") -> None:
    """``ValueError`` unless ``table`` tabulates ``model`` over its UE region: its grid
    covers the region (to one spacing), and its rows at eight grid points spread over the
    table equal the model's phasors there (to float32 rounding of the table: 1e-3). A table
    of another deployment, another material or another region is refused by name. Concrete
    tables only (a traced one passes)."""
    model = as_phase_model(model)
    check_table_aps(table, model)
    if not is_concrete(table.data, table.grid.low):
        return
    grid, scene = table.grid, model.scene
    low = np.asarray(grid.low, float)
    high = low + np.asarray(grid.shape) * grid.spacing
    ue_low, ue_high = np.asarray(scene.ue_low, float), np.asarray(scene.ue_high, float)
    if np.any(low > ue_low + grid.spacing) or np.any(high < ue_high - grid.spacing):
        raise ValueError(
            f"{name} covers {low.round(3).tolist()} to {high.round(3).tolist()} m, not the "
            f"model's UE region {ue_low.round(3).tolist()} to {ue_high.round(3).tolist()} m: "
            "build it with estimators.phasor_table(model, estimators.search_grid(...))"
        )
    index = jnp.asarray(np.linspace(0, grid.size - 1, 8).round().astype(np.int32))
    rows = np.asarray(table.data[index], float)
    expected = np.asarray(phasor_rows(jax.vmap(model.mean)(grid_points(grid, index))), float)
    worst = float(np.max(np.abs(rows - expected)))
    if not worst <= 1e-3:
        raise ValueError(
            f"{name} does not tabulate this model: its phasors differ from the model's by up to "
            f"{worst:.3g} at its own grid points (another deployment, material or offsets?)"
        )


@partial(jax.jit, static_argnames=("rows", "chunk_size"))
def _table_rows(model: PhaseModel | Scene, grid: Grid, rows: int, chunk_size: int) -> Array:
    def mean(i: Array) -> Array:  # lax.map with batch_size vmaps this
        return model.mean(grid_points(grid, jnp.minimum(i, grid.size - 1)))

    def chunk(i: Array) -> Array:
        # the phases of a chunk come out of a loop of several sub-batches and only then
        # become phasors: with the model and cos/sin in one loop body, XLA's CPU code for
        # the fused body ran 2.3x slower (lambda/8 room grid of the paper's scene: 21 s vs
        # 9 s; the model alone 6 s)
        theta = map_in_chunks(mean, i, max(chunk_size // 4, 1))
        return jnp.where((i < grid.size)[:, None], phasor_rows(theta), 0.0)

    index = jnp.arange(rows, dtype=jnp.int32).reshape(-1, chunk_size)
    return jax.lax.map(chunk, index).reshape(rows, -1)
