r"""The online safeguard (beyond the paper's Fig. 1): a window search around a coarse estimate.

The LS cost of eq. (17) is screened on a :math:`\lambda/4` grid in a cube of
half-width ``radius`` around each coarse estimate, with a cheap PhaseModel (e.g. the
tabulated GP mean, :class:`~dmimo_jax.gp.TabulatedGPModel`); the ``num_starts`` best
points start Levenberg-Marquardt refinements under the same model
(:func:`~dmimo_jax.estimators.refine_multistart`, the ending it shares with
:func:`~dmimo_jax.estimators.coarse_to_fine`); the best wins. Refinement alone converges
to the nearest local minimum of a cost that repeats every ~lambda/2; the window keeps
the estimate in the right basin whenever the coarse error is below the radius.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import as_snapshot_batch, check_int, check_scalar, check_table_aps
from dmimo_jax.estimators.grid import PhasorTable
from dmimo_jax.estimators.mle import (
    RefineResult,
    check_num_steps,
    refine_batch_unchecked,
    refine_multistart_unchecked,
)
from dmimo_jax.estimators.phasors import cube_offsets
from dmimo_jax.estimators.rows import bucket_size, cost_gate_failed, gate_limit, on_rows
from dmimo_jax.estimators.search import coarse_to_fine_unchecked
from dmimo_jax.likelihood import ls_costs
from dmimo_jax.physics import PhaseModel


def window_offsets(radius: float, spacing: float) -> np.ndarray:
    """The (P, 3) offsets of a window cube of half-width ``radius`` on a ``spacing`` grid
    (the points :func:`window_search` screens around each centre), m."""
    n = int(np.ceil(radius / spacing))
    return cube_offsets(np.arange(-n, n + 1) * spacing)


def window_points(radius: float, spacing: float, low: ArrayLike, high: ArrayLike) -> int:
    """Points of a window cube of half-width ``radius`` (capped at the box's extent)."""
    radius = min(float(radius), float(np.max(np.asarray(high) - np.asarray(low))))
    return (2 * int(np.ceil(radius / spacing)) + 1) ** 3


def window_covers_table(
    scene: Any, radius: float, table: PhasorTable | None, spacing: float | None = None
) -> bool:
    """Whether :func:`window_search` screens the whole ``table`` instead of a window of
    ``radius`` (the window would hold at least 1/16 of the table's points; the default
    region and spacing): the coarse stage then adds nothing, a fallback to the region."""
    if table is None:
        return False
    spacing = float(scene.wavelength) / 4 if spacing is None else float(spacing)
    low, high = np.asarray(scene.ue_low) - 0.25, np.asarray(scene.ue_high) + 0.25
    return 16 * window_points(radius, spacing, low, high) >= table.grid.size


def window_search(
    r: ArrayLike,
    model: PhaseModel,
    x_coarse: ArrayLike,
    *,
    radius: float,
    spacing: float | None = None,
    num_starts: int = 8,
    num_steps: int = 15,
    region: tuple[ArrayLike, ArrayLike] | None = None,
    table: PhasorTable | None = None,
) -> Array:
    """Online step 2, the safeguard: best LS point near each coarse estimate (B, 3).

    When a ``table`` of ``model`` is given and the window would hold more than 1/16 of
    the table's points, the window is the whole table: the search becomes the
    hierarchical search :func:`~dmimo_jax.estimators.coarse_to_fine` (coherence screen of
    the table, then the same multi-start refinement), which costs a few ms per snapshot
    whatever the radius. A coarse estimator that is no better than the region's size then
    adds nothing, and the result says so through the radius it was given.

    Args:
        r: (B, M) wrapped phases.
        model: a cheap PhaseModel (e.g. :class:`~dmimo_jax.gp.TabulatedGPModel`).
        x_coarse: (B, 3) coarse estimates.
        radius: half-width of the window cube, m.
        spacing: window grid spacing (default lambda / 4 of the model's scene).
        num_starts: window points that start a Levenberg-Marquardt refinement.
        num_steps: LM steps per start.
        region: (low, high) box the window is clipped to (default the scene's UE region
            widened by 0.25 m).
        table: optional :class:`~dmimo_jax.estimators.PhasorTable` of ``model`` (see above).

    Returns:
        (B, 3) estimates, the best of the ``num_starts`` refined window points.
    """
    scene = model.scene
    r = as_snapshot_batch("r", r, model.num_aps)
    x_coarse = jnp.asarray(x_coarse, r.dtype).reshape(-1, 3)
    if not bool(jnp.all(jnp.isfinite(x_coarse))):
        raise ValueError("x_coarse contains non-finite positions")
    if x_coarse.shape[0] != r.shape[0]:
        raise ValueError(
            f"x_coarse must have {r.shape[0]} rows to match r, got {x_coarse.shape[0]}"
        )
    spacing = float(scene.wavelength) / 4 if spacing is None else float(spacing)
    if not (radius > 0 and spacing > 0):
        raise ValueError(f"radius and spacing must be > 0, got {radius}, {spacing}")
    if region is None:
        low, high = jnp.asarray(scene.ue_low) - 0.25, jnp.asarray(scene.ue_high) + 0.25
    else:
        low, high = (jnp.asarray(v, r.dtype) for v in region)
        if low.shape != (3,) or high.shape != (3,) or not bool(jnp.all(high > low)):
            raise ValueError(
                f"region must be (low, high), each of shape (3,) with low < high, got "
                f"{np.asarray(low)} and {np.asarray(high)}"
            )
        if float(low[2]) <= 0:
            raise ValueError(f"region must lie above the ground (low z > 0), got {float(low[2])}")
    check_num_steps(num_steps)
    # a window wider than the region adds nothing: cap the radius at the region's extent
    radius = min(float(radius), float(jnp.max(high - low)))
    count = window_points(radius, spacing, low, high)
    check_int("num_starts", num_starts, minimum=1, maximum=count)
    # the table's coherence screen is far cheaper per point than evaluating the model (the
    # table vs plain rows of docs/performance.md): past 1/16 of the table, screen all of it
    if table is not None and 16 * count >= table.grid.size:
        check_table_aps(table, model)
        if num_starts > table.grid.size:
            raise ValueError(
                f"num_starts must be an int in [1, {table.grid.size}], got {num_starts}"
            )
        if r.shape[0] == 0:
            return jnp.zeros((0, 3), r.dtype)
        r = r.astype(table.grid.low.dtype)
        return coarse_to_fine_unchecked(r, model, table, num_starts, num_steps).x
    if count > 2_000_000:
        raise ValueError(
            f"radius={radius:.3g} m at spacing {spacing:.3g} m is a {count}-point window per "
            "snapshot; pass table= (a PhasorTable of the model) for wide windows"
        )
    offsets = jnp.asarray(window_offsets(radius, spacing), r.dtype)
    return window_search_unchecked(r, model, x_coarse, offsets, low, high, num_starts, num_steps)


@partial(jax.jit, static_argnums=(6, 7))
def window_search_unchecked(
    r: Array,
    model: PhaseModel,
    x_coarse: Array,
    offsets: Array,
    low: Array,
    high: Array,
    k: int,
    num_steps: int,
) -> Array:
    """:func:`window_search`'s jitted core, without input checks: ``r`` (B, M), the window
    centres ``x_coarse`` (B, 3), its ``offsets`` (P, 3) (:func:`window_offsets`), the box
    ``low``/``high`` (3,) it is clipped to, ``k`` starts of ``num_steps`` LM steps (both
    static). Returns the best refined point (B, 3)."""

    x0 = window_starts(r, model, x_coarse, offsets, low, high, k)
    return refine_multistart_unchecked(x0, r, model, num_steps).x


def window_starts(
    r: Array, model: PhaseModel, x_coarse: Array, offsets: Array, low: Array, high: Array, k: int
) -> Array:
    """The ``k`` window points of lowest LS cost (eq. 18) around each centre ``x_coarse``
    (B, 3) (clipped to ``low``/``high``), of snapshots ``r`` (B, M): (B, k, 3), the starts
    :func:`window_search_unchecked` refines. Traced, ``k`` static."""

    def starts(args):  # the k best window points of one snapshot (k, 3)
        ri, xi = args
        centre = jnp.clip(xi, low, high)  # a coarse estimate may lie outside the region
        pts = jnp.clip(centre[None, :] + offsets, low[None, :], high[None, :])
        cost = ls_costs(ri[None, :], jax.vmap(model.mean)(pts))
        _, idx = jax.lax.top_k(-cost, k)
        return pts[idx]

    return jax.lax.map(starts, (r, x_coarse))


def recheck_costly(
    r: ArrayLike,
    model: PhaseModel,
    result: Any,
    *,
    gate: float = 100.0,
    max_fraction: float = 0.05,
    radius: float | None = None,
    spacing: float | None = None,
    num_starts: int = 32,
    num_steps: int = 15,
    chunk: int = 64,
) -> tuple[Any, np.ndarray]:
    r"""The cost gate's local search (beyond the paper): search again, in a dense window
    around it, every answer whose ML cost is not that of a right answer.

    At the right position the ML cost of eq. (17) is about chi-square with M - 4 degrees of
    freedom; an answer whose cost exceeds ``gate * (M - 4)`` is not where the snapshot was
    taken. In a piecewise model (a scene of faces) the global search can return a point a
    few millimetres from the UE but across a shadow boundary, where a path the UE receives
    is missing; one refinement cannot cross that boundary. The window (half-width
    ``radius``, default lambda/4; grid ``spacing``, default lambda/16) around the answer
    is screened with the LS cost, its ``num_starts`` best points refined
    (:func:`window_search`), the winner refined once more (:func:`refine_batch`), and it
    replaces the answer when its cost is lower.

    The gate is for a search's rare misses. When more than ``max_fraction`` of the answers
    fail it, the model itself does not explain the snapshots (a nominal or mismatched
    model), a local search cannot help, and nothing is searched again (the mask still
    says which answers failed).

    Args:
        r: (B, M) wrapped phases.
        model: the PhaseModel ``result`` was refined under.
        result: (B,) answers under ``model`` with fields ``x`` and ``cost`` (a
            :class:`~dmimo_jax.estimators.RefineResult`, a
            :class:`~dmimo_jax.estimators.CoarseToFineResult`, ...).
        gate: the threshold, in units of M - 4.
        max_fraction: the largest fraction of failing answers that is searched again.
        radius: the window's half-width, m (default lambda/4).
        spacing: the window's grid spacing, m (default lambda/16).
        num_starts: window points refined (:func:`window_search`).
        num_steps: LM steps of each.
        chunk: answers searched at once (bounds the memory of the window's model calls).

    Returns:
        ``(result, failed)``: the result with the improved rows' fields that a
        :class:`~dmimo_jax.estimators.RefineResult` also has (``x``, ``cost``, ``cpo``, ...)
        replaced, the others kept; and the (B,) bool mask of the answers that failed the gate.
    """
    r = as_snapshot_batch("r", r, model.num_aps)
    x = jnp.asarray(result.x, r.dtype).reshape(-1, 3)
    cost = np.asarray(result.cost, np.float64).reshape(-1)
    if x.shape[0] != r.shape[0] or cost.shape[0] != r.shape[0]:
        raise ValueError(
            f"result must hold {r.shape[0]} answers to match r, got x {x.shape}, cost {cost.shape}"
        )
    check_scalar("gate", gate, positive=True)
    check_scalar("max_fraction", max_fraction)
    if not 0 <= max_fraction <= 1:
        raise ValueError(f"max_fraction must be in [0, 1], got {max_fraction!r}")
    check_int("chunk", chunk, minimum=1)
    lam = float(model.scene.wavelength)
    radius = lam / 4 if radius is None else radius
    spacing = lam / 16 if spacing is None else spacing
    check_scalar("radius", radius, positive=True)
    check_scalar("spacing", spacing, positive=True)
    if spacing > radius:
        raise ValueError(f"spacing ({spacing!r} m) must not exceed radius ({radius!r} m)")
    failed = cost_gate_failed(cost, model.num_aps, gate)
    rows = np.flatnonzero(failed)
    if rows.size == 0 or rows.size > max_fraction * r.shape[0]:
        return result, failed
    found = []
    for part in np.array_split(rows, -(-rows.size // chunk)):
        # padded (bucket_size): a few shapes compile, whatever the number of misses
        size = bucket_size(part.size)
        padded = np.concatenate([part, np.full(size - part.size, part[-1])])
        xw = window_search(
            r[padded],
            model,
            x[padded],
            radius=radius,
            spacing=spacing,
            num_starts=num_starts,
            num_steps=num_steps,
        )
        again = refine_batch_unchecked(xw, r[padded], model, 25, 1e-3)
        found.append(jax.tree.map(lambda a, n=part.size: a[:n], again))
    again = jax.tree.map(lambda *a: jnp.concatenate(a), *found)
    better = np.asarray(again.cost) < cost[rows]
    take, src = rows[better], np.flatnonzero(better)
    shared = [f for f in result._fields if f in RefineResult._fields]
    out = result._replace(
        **{f: jnp.asarray(getattr(result, f)).at[take].set(getattr(again, f)[src]) for f in shared}
    )
    return out, failed


def dense_recheck(
    r: Array,
    model: PhaseModel,
    fine: RefineResult,
    offsets: Array,
    low: Array,
    high: Array,
) -> RefineResult:
    """:func:`recheck_costly`'s search for every row, traced and unchecked: the window of
    ``offsets`` (:func:`window_offsets`, by default half-width lambda/4 at lambda/16)
    around each answer ``fine.x`` clipped to ``low``/``high``, its 32 best points refined
    (15 LM steps), the best refined 25 more steps; kept where its cost is lower."""
    k = min(32, offsets.shape[0])
    xw = window_search_unchecked(r, model, fine.x, offsets, low, high, k, 15)
    again = refine_batch_unchecked(xw.astype(r.dtype), r, model, 25, 1e-3)
    better = again.cost < fine.cost
    pick = lambda a, b: jnp.where(better.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)
    return jax.tree.map(pick, again, fine)


def gate_recheck(
    r: Array,
    model: PhaseModel,
    fine: RefineResult,
    gate: float,
    offsets: Array,
    low: Array,
    high: Array,
    fraction: float,
) -> tuple[RefineResult, Array]:
    """The cost gate's dense recheck, traced: the answers whose ML cost exceeds
    ``gate * (M - 4)`` (or is not finite) searched again with :func:`dense_recheck` when at
    most ``fraction`` of the batch (at least one row) fails (more: the model itself misses,
    :func:`recheck_costly`'s rule); returns the answers and the (B,) mask of those that
    still fail (``rejected``). ``fraction`` 0 turns the search off."""
    limit = gate_limit(model.num_aps, gate)
    still = ~(fine.cost <= limit)
    if fraction > 0:
        few = max(1, int(fraction * r.shape[0]))
        rare = still & (jnp.sum(still) <= few)
        fine, _ = on_rows(
            rare,
            few,
            lambda ri, fi: dense_recheck(ri, model, fi, offsets, low, high),
            fine,
            r,
            fine,
        )
    return fine, ~(fine.cost <= limit)
