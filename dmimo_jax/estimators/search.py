r"""Exhaustive grid search (EGS) of the LS cost, eq. (18), and the hierarchical ``coarse_to_fine``.

Two exact paths, both scanning a :class:`~dmimo_jax.estimators.Grid` in chunks (memory
flat in the grid size) and sharding the chunks over ``jax.devices()`` when there are
several (:mod:`~dmimo_jax.estimators.grid`):

* **table-free** (``egs(r, model, grid)``): the model phases are computed per chunk and
  the LS cost (eq. 18) evaluated at every point. Memory ~ ``batch * chunk * M`` floats.
* **lookup table** (``egs(r, model, phasor_table(model, grid))``, the paper's table, and
  the fast path): for a batch of snapshots the *coherence*
  :math:`c(\mathbf x) = |\sum_m e^{j(r_m - \theta_m(\mathbf x))}|` of every grid point is
  one real matrix product (:mod:`~dmimo_jax.estimators.phasors`); the ``num_candidates``
  most coherent points per snapshot are then re-ranked with the exact float64 LS cost.
  The screen is *certified*: for any CPO :math:`\phi`,
  :math:`\tilde C \ge 2\sum_m(1-\cos e_m) = 2(M - \mathrm{Re}\,e^{-j\phi}\sum_m e^{j(r_m-\theta_m)})
  \ge 2(M - c)` (from :math:`1-\cos e \le e^2/2`), so when the best re-ranked cost is at
  most :math:`2(M - c_K)` for the K-th coherence :math:`c_K`, no unscreened point can beat
  it. Snapshots whose certificate fails are re-run on the table-free path, so the result
  is always the exact arg-min of eq. (18).
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.sharding import Mesh
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    as_snapshot_batch,
    check_int,
    check_num_aps,
    check_table_aps,
    warn_if_float32,
)
from dmimo_jax.estimators.grid import (
    Grid,
    PhasorTable,
    as_spacing,
    device_mesh,
    grid_points,
    num_chunks_for,
    scan_top_k,
    search_grid,
    sharded_top_k,
)
from dmimo_jax.estimators.mle import check_num_steps, refine_multistart_unchecked
from dmimo_jax.estimators.phasors import coherence_weights, squared_coherence
from dmimo_jax.likelihood import ls_costs
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.scene import Scene


class EgsResult(NamedTuple):
    """Output of :func:`egs` (leading batch axis B)."""

    x: Array
    """(B, 3) arg-min positions, m."""
    cost: Array
    """(B,) minimal LS cost (eq. 18)."""
    index: Array
    """(B,) flat grid index of the arg-min."""
    screened: Array
    """(B,) bool: True where a table screen certified the arg-min."""
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
    warn_if_float32("egs")
    if region not in ("room", "ue"):  # checked with a grid or table too (unused there)
        raise ValueError(f"region must be 'room' or 'ue', got {region!r}")
    if not isinstance(grid, (Grid, PhasorTable)):
        grid = search_grid(model, as_spacing(grid), region)
    if chunk_size is not None:
        check_int("chunk_size", chunk_size, minimum=1)
    check_int("num_candidates", num_candidates, minimum=1)
    check_int("widen", widen, minimum=1)
    dtype = grid.grid.low.dtype if isinstance(grid, PhasorTable) else grid.low.dtype
    r = as_snapshot_batch("r", r, model.num_aps, dtype)
    if r.shape[0] == 0:  # an empty batch: empty results
        empty = jnp.zeros((0,), dtype)
        return EgsResult(
            jnp.zeros((0, 3), dtype), empty, jnp.zeros((0,), jnp.int32), jnp.zeros((0,), bool)
        )
    if isinstance(grid, PhasorTable):
        check_table_aps(grid, model)
        res = egs_table_search(r, model, grid, min(num_candidates, grid.grid.size))
        bad = np.flatnonzero(~np.asarray(res.screened))
        if bad.size and widen > 1:  # certificate failed: a wider screen for those snapshots
            wide = egs_table_search(
                r[bad], model, grid, min(widen * num_candidates, grid.grid.size)
            )
            res = _scatter(res, bad, wide)
            bad = np.flatnonzero(~np.asarray(res.screened))
        if bad.size:  # still uncertified: the exact table-free scan (screened stays False)
            exact = _egs_scan_auto(r[bad], model, grid.grid, None, grid.mesh)
            res = _scatter(res, bad, exact._replace(screened=jnp.zeros(bad.size, bool)))
        return res
    return _egs_scan_auto(r, model, grid, chunk_size, device_mesh(devices))


def _egs_scan_auto(r, model, grid, chunk_size, mesh) -> EgsResult:
    """:func:`egs_scan` with the default chunk size (about 2^23 floats of work per step)."""
    if chunk_size is None:
        chunk_size = int(np.clip(2**23 // (r.shape[0] * model.num_aps), 64, 8192))
    return egs_scan(r, model, grid, min(chunk_size, grid.size), mesh)


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
    num_chunks = num_chunks_for(grid.size, chunk_size, mesh)

    def local(first, n, r, model, grid):
        def neg_cost(_, idx):
            theta = jax.vmap(model.mean)(grid_points(grid, idx))
            return -ls_costs(r[:, None, :], theta[None, :, :])  # (B, chunk)

        return scan_top_k(neg_cost, first, n, chunk_size, grid.size, 1, r.shape[0], r.dtype)

    score, index = sharded_top_k(local, mesh, num_chunks, 1, replicated=(r, model, grid))
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
    costs = ls_costs(r[:, None, :], theta)
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
    snap = coherence_weights(r)  # (2M, 2B)

    def local(first, n, data, snap):
        def coherence2(c_local, _):
            rows = jax.lax.dynamic_slice_in_dim(data, c_local * chunk, chunk)
            return squared_coherence(rows, snap)  # (B, chunk)

        return scan_top_k(coherence2, first, n, chunk, table.grid.size, k, batch, jnp.float32)

    return sharded_top_k(
        local, table.mesh, table.num_chunks, k, sharded=(table.data,), replicated=(snap,)
    )


class CoarseToFineResult(NamedTuple):
    """Output of :func:`coarse_to_fine` (leading batch axis B)."""

    x: Array
    """(B, 3) refined estimate with the lowest ML cost, m."""
    cost: Array
    """(B,) its ML cost (eq. 17)."""
    start: Array
    """(B, 3) the coarse grid point it was refined from."""
    starts: Array
    """(B, K) flat coarse-grid indices of all starts."""


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
    warn_if_float32("coarse_to_fine")
    if not isinstance(table, PhasorTable):
        raise ValueError(
            f"table must be a PhasorTable (build one with phasor_table(model, grid)), got "
            f"{type(table).__name__}"
        )
    r = as_snapshot_batch("r", r, model.num_aps, table.grid.low.dtype)
    check_num_steps(num_steps)
    check_int("num_starts", num_starts, minimum=1, maximum=table.grid.size)
    check_table_aps(table, model)
    if r.shape[0] == 0:
        z = jnp.zeros((0, 3), r.dtype)
        return CoarseToFineResult(z, jnp.zeros((0,), r.dtype), z, jnp.zeros((0, 0), jnp.int32))
    return coarse_to_fine_unchecked(r, model, table, num_starts, num_steps)


def coarse_to_fine_starts(r: Array, table: PhasorTable, k: int) -> tuple[Array, Array]:
    """The starts of :func:`coarse_to_fine_unchecked` before their refinement: the ``k``
    most coherent grid points (B, k, 3) of ``table`` for snapshots ``r`` (B, M) and their
    flat grid indices (B, k). Traced, ``k`` static."""
    _, cand = screen(r, table, k)
    return grid_points(table.grid, cand), cand


@partial(jax.jit, static_argnames=("k", "num_steps"))
def coarse_to_fine_unchecked(
    r: Array, model: PhaseModel, table: PhasorTable, k: int, num_steps: int
) -> CoarseToFineResult:
    """:func:`coarse_to_fine`'s jitted core, without input checks: ``r`` (B, M) float64,
    ``k`` starts, ``num_steps`` LM steps (both static)."""
    batch = r.shape[0]
    x0, cand = coarse_to_fine_starts(r, table, k)
    fine = refine_multistart_unchecked(x0, r, model, num_steps)
    start = jnp.take_along_axis(x0, fine.index[:, None, None], axis=1)[:, 0]
    return CoarseToFineResult(fine.x, fine.cost, start, cand.reshape(batch, k))
