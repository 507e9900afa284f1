"""The online stage of Fig. 1: coarse estimate -> safeguard screen -> fine refinement.

:func:`locate` (a regression network's position, the safeguard window, refinement) and, beyond
the paper, :func:`locate_candidates` (a cell classifier's candidates, the two-tier candidate
screen, the fine stage) compose the stages; :class:`Locator` holds one trained coarse stage
with its screen and fine models and runs them one at a time (so each can be timed) or all at
once.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax import gp
from dmimo_jax._checks import (
    as_snapshot_batch,
    check_int,
    check_num_aps,
    check_scalar,
    check_table_aps,
)
from dmimo_jax.estimators import (
    CellTable,
    PhasorTable,
    refine_batch,
    window_search,
)
from dmimo_jax.estimators.candidates import (
    check_cell_table,
    tiered_candidate_search,
)
from dmimo_jax.estimators.mle import check_num_steps, refine_batch_unchecked
from dmimo_jax.estimators.rows import bucket_size, on_rows
from dmimo_jax.estimators.search import coarse_to_fine_unchecked
from dmimo_jax.learning.nets import jit_method
from dmimo_jax.physics import PhaseModel
from dmimo_jax.pipeline.rescues import REGION_STARTS, REGION_STEPS


def coarse_estimate(estimator: Any, r: ArrayLike) -> Array:
    """Online step 1: (B, 3) float64 positions from a trained estimator (POPT, MLP or HI).

    A Flax network runs as a pure jitted function of its current state (split on every
    call, so further training of the network is always seen; nothing is cached here
    beyond JAX's own compilation cache, keyed by the network's structure).

    Raises:
        ValueError: a cell classifier (it gives cells, not positions), or an estimator whose
            output is not (B, 3).
    """
    if hasattr(estimator, "top_cells"):
        raise ValueError(
            "estimator is a cell classifier: it gives candidate cells, not positions; use "
            "locate_candidates(r, classifier, ...) or pipeline.Locator.from_offline(offline, 'cells')"
        )
    num_aps = getattr(estimator, "num_aps", None)
    r = jnp.atleast_2d(r) if num_aps is None else as_snapshot_batch("r", r, num_aps)
    if isinstance(estimator, nnx.Module):
        out = jit_method(estimator, "__call__", r.astype(jnp.float32))
    else:
        out = estimator(r)
    if np.shape(out) != (r.shape[0], 3):
        raise ValueError(
            f"estimator must map r {tuple(r.shape)} to positions ({r.shape[0]}, 3), "
            f"got {np.shape(out)}"
        )
    return jnp.asarray(out, jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)


# ----------------------------------------------------------------------------- online


class OnlineResult(NamedTuple):
    """Output of :func:`locate` (leading batch axis B)."""

    coarse: Array  # (B, 3) learned estimate
    screened: Array  # (B, 3) best point of the safeguard window (after its cheap refinement)
    fine: Array  # (B, 3) refined with the exact phase model
    cost: Array  # (B,) ML cost (eq. 17) at the fine estimate
    cpo: Array  # (B,) CPO estimate at the fine estimate


def locate(
    r: ArrayLike,
    estimator: Any,
    model: PhaseModel,
    *,
    screen: PhaseModel | None = None,
    radius: float = 0.5,
    spacing: float | None = None,
    num_starts: int = 8,
    refine_steps: int = 15,
    table: PhasorTable | None = None,
) -> OnlineResult:
    """The online stage: coarse estimate -> safeguard window -> refinement with ``model``.

    Args:
        r: (M,) or (B, M) wrapped phases.
        estimator: trained POPT / MLP / :class:`HIEstimator` (anything r -> positions).
        model: the exact PhaseModel for the fine estimate (the GP model; or the analytic
            model for a matched-model study).
        screen: the cheap model of the window search (default: the tabulated mean of
            ``model`` when it is a :class:`~dmimo_jax.gp.GPPhaseModel`, else ``model``).
        radius: the window (:func:`window_search`).
        spacing: see ``radius``.
        num_starts: see ``radius``.
        refine_steps: LM steps of the final refinement.
        table: a :class:`~dmimo_jax.estimators.PhasorTable` of ``screen`` for wide windows.
    """
    r = as_snapshot_batch("r", r, model.num_aps)
    if screen is None:
        screen = (
            gp.TabulatedGPModel.from_model(model, variance=False)
            if isinstance(model, gp.GPPhaseModel)
            else model
        )
    x0 = coarse_estimate(estimator, r)
    r = r.astype(x0.dtype)
    xs = window_search(
        r, screen, x0, radius=radius, spacing=spacing, num_starts=num_starts, table=table
    )
    fine = refine_batch(xs, r, model, num_steps=refine_steps)
    return OnlineResult(x0, xs, fine.x, fine.cost, fine.cpo)


# ----------------------------------------------------------------------------- candidates


class CandidateOnlineResult(NamedTuple):
    """Output of :func:`locate_candidates` (leading batch axis B)."""

    cells: Array  # (B, K) candidate cells, most likely first
    mass: Array  # (B,) their total probability (the confidence signal)
    fallback: Array  # (B,) bool: screened over the whole region instead
    narrow: Array  # (B,) bool: confident enough to screen only the first few cells
    screened: Array  # (B, 3) refined best point of the screen (under the tabulated model)
    fine: Array  # (B, 3) after the fine stage's steps under ``model``
    cost: Array  # (B,) ML cost (eq. 17) of ``fine`` under ``model``
    cpo: Array  # (B,) CPO estimate at ``fine``


def cell_probabilities(classifier: nnx.Module, r: ArrayLike, k: int) -> tuple[Array, Array]:
    """The ``k`` most likely cells (B, k) of a :class:`~dmimo_jax.learning.cells.CellClassifier`,
    most likely first, and their probabilities (B, k), run as one jitted pure function of
    the current weights."""
    r = as_snapshot_batch("r", r, classifier.num_aps)
    check_int("k", k, minimum=1, maximum=classifier.cells.num_cells)
    return _cell_probabilities(classifier, r, k)


def _cell_probabilities(classifier: nnx.Module, r: Array, k: int) -> tuple[Array, Array]:
    return jit_method(classifier, "top_cells", r.astype(jnp.float32), k=k)


def bucketed(fn: Any, rows: np.ndarray, *arrays: Array) -> Array:
    """``fn(*(a[rows] for a in arrays))`` with ``rows`` padded to :func:`bucket_size`.

    The online stage splits a batch by confidence; padding each part (repeating its last
    row) bounds the shapes a jitted stage ever sees to a few per octave of the batch size,
    so a new mix of confident and unsure snapshots rarely compiles anything.
    """
    rows = np.asarray(rows)
    if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise ValueError(f"rows must be a 1-D array of row indices, got {rows.dtype} {rows.shape}")
    n = rows.size
    if n == 0:
        raise ValueError("rows must name at least one row (skip an empty part instead)")
    size = bucket_size(n)
    padded = np.concatenate([rows, np.full(size - n, rows[-1])])
    out = fn(*(a[padded] for a in arrays))
    return jax.tree.map(lambda v: v[:n], out)


class CandidateScreen(NamedTuple):
    """Output of :func:`screen_candidates` (leading batch axis B)."""

    x: Array  # (B, 3) refined best point of the screen
    narrow: Array  # (B,) bool: only the first cells were screened (confident)
    fallback: Array  # (B,) bool: the whole region was screened (unsure)
    mass: Array  # (B,) probability of the num_cells candidates (the confidence signal)


def screen_candidates(
    r: ArrayLike,
    cells: ArrayLike,
    probs: ArrayLike,
    screen: PhaseModel,
    table: CellTable,
    *,
    fallback_table: PhasorTable | None = None,
    first_cells: int | None = None,
    first_mass: float = 0.999,
    min_mass: float = 0.5,
    num_starts: int = 4,
    screen_steps: int = 2,
) -> CandidateScreen:
    """The candidate safeguard: screen each snapshot's candidate cells, in two tiers.

    A snapshot whose first ``first_cells`` candidates (default ``min(4, K)``) hold at
    least ``first_mass`` of the probability screens only those (most snapshots); one whose
    K candidates hold at least ``min_mass`` screens all K; the others (the classifier
    itself is unsure) fall back to the whole-region hierarchical screen
    (:func:`~dmimo_jax.estimators.coarse_to_fine` on ``fallback_table``). Thresholds above
    1 are never met (``min_mass > 1``: every snapshot falls back). Each part runs
    :func:`~dmimo_jax.estimators.candidate_search` under ``screen`` (``num_starts``
    Levenberg-Marquardt refinements of ``screen_steps``), padded by :func:`bucketed`.

    Args:
        r: (B, M) wrapped phases.
        cells: (B, K) candidate cells, most likely first (:func:`cell_probabilities`).
        probs: (B, K) their probabilities.
        screen: the cheap PhaseModel ``table`` was built from.
        table: :func:`~dmimo_jax.estimators.cell_table` of ``screen``.

    Raises:
        ValueError: a fallback is needed and no ``fallback_table`` was given, or bad input.
    """
    r = as_snapshot_batch("r", r, screen.num_aps)
    cells, p = check_candidates(r, cells, probs, table)
    settings = check_screen_settings(
        screen,
        table,
        cells.shape[1],
        first_cells=first_cells,
        first_mass=first_mass,
        min_mass=min_mass,
        num_starts=num_starts,
        screen_steps=screen_steps,
    )
    return _screen_candidates(r, cells, p, screen, table, fallback_table, settings)


def check_candidates(
    r: Array, cells: ArrayLike, probs: ArrayLike, table: CellTable
) -> tuple[Array, np.ndarray]:
    """A classifier's ``(cells, probs)`` for the (B, M) snapshots ``r``: both (B, K), the cells
    indices of ``table``'s cells, the probabilities in [0, 1]. Returns them as arrays."""
    cells, p = jnp.asarray(cells), np.asarray(probs, np.float64)
    if cells.ndim != 2 or cells.shape != p.shape or cells.shape[0] != r.shape[0]:
        raise ValueError(
            f"cells and probs must both have shape ({r.shape[0]}, K), got {cells.shape} "
            f"and {p.shape}"
        )
    if cells.size and not (0 <= int(cells.min()) and int(cells.max()) < table.cells.num_cells):
        raise ValueError(f"cells must index the {table.cells.num_cells} cells of the table")
    check_probabilities("probs", p)
    return cells, p


def check_probabilities(name: str, p: np.ndarray) -> None:
    """``ValueError`` unless ``p`` (B, K) holds probabilities: finite, in [0, 1], each row
    summing to at most 1 (logits or scores passed by mistake would fake a confident mass)."""
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{name} must be finite probabilities, got NaN or inf entries")
    tol = 1e-4  # float32 softmax outputs
    if p.size and (p.min() < 0 or p.max() > 1 + tol or np.max(p.sum(axis=-1)) > 1 + tol):
        raise ValueError(
            f"{name} must be probabilities in [0, 1] whose rows sum to at most 1 (the top-K of a "
            f"softmax), got values in [{p.min():.3g}, {p.max():.3g}] and a row sum up to "
            f"{np.max(p.sum(axis=-1)):.3g}: logits passed by mistake?"
        )


class ScreenSettings(NamedTuple):
    """The candidate screen's checked settings (:func:`check_screen_settings`)."""

    first_cells: int
    first_mass: float
    min_mass: float
    num_starts: int
    screen_steps: int


def check_screen_settings(
    screen: PhaseModel,
    table: CellTable,
    num_cells: int,
    *,
    first_cells: int | None,
    first_mass: float,
    min_mass: float,
    num_starts: int,
    screen_steps: int,
) -> ScreenSettings:
    """``ValueError`` unless the candidate screen's settings (:func:`screen_candidates`) fit
    ``screen``, its cell ``table`` and ``num_cells`` candidates; returns them checked, with
    ``first_cells``'s default (``min(4, num_cells)``) filled in."""
    check_num_aps(screen.num_aps)
    check_cell_table(table, screen)
    first_cells = min(4, num_cells) if first_cells is None else first_cells
    check_int("first_cells", first_cells, minimum=1)
    if first_cells > num_cells:
        raise ValueError(f"first_cells={first_cells} must be <= the K={num_cells} candidates")
    for name, v in (("first_mass", first_mass), ("min_mass", min_mass)):
        check_scalar(name, v)
        if v < 0:
            raise ValueError(f"{name} must be a probability threshold >= 0, got {v}")
    check_int("num_starts", num_starts, minimum=1)
    if num_starts > first_cells * table.points_per_cell:
        raise ValueError(f"num_starts={num_starts} exceeds the screened points")
    check_num_steps(screen_steps)
    return ScreenSettings(first_cells, first_mass, min_mass, num_starts, screen_steps)


def _screen_candidates(
    r: Array,
    cells: Array,
    p: Any,
    screen: PhaseModel,
    table: CellTable,
    fallback_table: PhasorTable | None,
    settings: ScreenSettings,
) -> CandidateScreen:
    """:func:`screen_candidates` on checked inputs: one program with every rare row fitted
    (capacity = the batch), after the host check that a needed fallback has its table."""
    p = jnp.asarray(p, jnp.result_type(float))
    if fallback_table is None:
        short = int(jnp.sum(~(p.sum(axis=-1) >= settings.min_mass)))
        if short:
            raise ValueError(
                f"{short} snapshots fell below min_mass={settings.min_mass}; pass fallback_table"
            )
    found, _ = _cell_screen_jit(
        r, cells.astype(jnp.int32), p, screen, table, fallback_table, settings, max(r.shape[0], 1)
    )
    return found


def cell_screen(
    r: Array,
    cells: Array,
    probs: Array,
    screen: PhaseModel,
    table: CellTable,
    fallback_table: PhasorTable | None,
    settings: ScreenSettings,
    capacity: int,
) -> tuple[CandidateScreen, Array]:
    """The two-tier candidate screen (:func:`screen_candidates`) as traced code, unchecked.

    Each row screens its first ``settings.first_cells`` cells when they hold
    ``first_mass`` (confident), all K when they hold ``min_mass``, in one search over the
    batch (:func:`~dmimo_jax.estimators.candidates.tiered_candidate_search`: cell by cell
    for a batch of at least :data:`BY_CELL_BATCH` rows, else row by row); the unsure rows
    (less than ``min_mass`` in all K) screen the whole region on at most ``capacity`` rows
    (:func:`~dmimo_jax.pipeline.program.on_rows`).

    Returns:
        ``(screen, overflow)``: the :class:`CandidateScreen` and the (B,) mask of unsure
        rows beyond the capacity (their ``x`` is meaningless: run them again).
    """
    first_cells, first_mass, min_mass, num_starts, screen_steps = settings
    num_cells = cells.shape[1]
    p = probs.astype(r.dtype)
    mass = p.sum(axis=-1)
    fallback = ~(mass >= min_mass)
    narrow = ~fallback & (p[:, :first_cells].sum(axis=-1) >= first_mass)
    count = jnp.where(fallback, 0, jnp.where(narrow, first_cells, num_cells))
    xs = tiered_candidate_search(
        r,
        screen,
        table,
        cells,
        count,
        num_starts,
        screen_steps,
        r.shape[0] >= BY_CELL_BATCH,
        (first_cells, num_cells),
    ).x
    overflow = jnp.zeros(r.shape[0], bool)
    if fallback_table is not None:
        whole = lambda ri: whole_region_screen_unchecked(ri, screen, fallback_table)
        xs, overflow = on_rows(fallback, capacity, whole, xs, r)
    return CandidateScreen(xs, narrow, fallback, mass), overflow


BY_CELL_BATCH = 32
"""Batches of at least this many rows screen their candidates cell by cell (one matrix
product of a cell's points with the rows that name it), smaller ones row by row."""

_cell_screen_jit = jax.jit(cell_screen, static_argnums=(6, 7))


def whole_region_screen(r: Array, screen: PhaseModel, table: PhasorTable) -> Array:
    """The fallback of the candidate screen and of the cost gate (B, 3): the hierarchical
    search :func:`~dmimo_jax.estimators.coarse_to_fine` of ``table`` (its defaults: 8 starts
    of 25 LM steps) on checked snapshots ``r`` (B, M)."""
    if not isinstance(table, PhasorTable):
        raise ValueError(f"table must be a PhasorTable, got {type(table).__name__}")
    check_table_aps(table, screen)
    return whole_region_screen_unchecked(r, screen, table)


def whole_region_screen_unchecked(r: Array, screen: PhaseModel, table: PhasorTable) -> Array:
    """:func:`whole_region_screen`, traceable and unchecked."""
    k = min(REGION_STARTS, table.grid.size)
    x = r.astype(table.grid.low.dtype)
    return coarse_to_fine_unchecked(x, screen, table, k, REGION_STEPS).x


def locate_candidates(
    r: ArrayLike,
    classifier: nnx.Module,
    model: PhaseModel,
    *,
    screen: PhaseModel,
    table: CellTable,
    fallback_table: PhasorTable | None = None,
    num_cells: int = 16,
    first_cells: int | None = None,
    first_mass: float = 0.999,
    min_mass: float = 0.5,
    num_starts: int = 4,
    screen_steps: int = 2,
    fine_steps: int = 3,
) -> CandidateOnlineResult:
    """The online stage with a cell classifier: candidates -> cell screen -> refinement.

    1. :func:`cell_probabilities`: the classifier's ``num_cells`` most likely cells;
    2. :func:`screen_candidates`, the candidate safeguard in two tiers (the first
       ``first_cells`` cells when they hold ``first_mass``, all ``num_cells`` when they hold
       ``min_mass``, else the whole region from ``fallback_table``);
    3. the fine stage: ``fine_steps`` Levenberg-Marquardt steps under ``model``. With the
       tabulated GP model of eq. (27) (:class:`~dmimo_jax.gp.TabulatedGPModel` with its
       variance table, what :func:`run_offline` returns as ``screen``) as ``model`` the
       whole stage runs on tables: its estimate agrees with the exact GP model's on
       noise-free snapshots (``tests/test_candidates.py`` states the tolerance) at a
       fraction of the cost; with the exact :class:`~dmimo_jax.gp.GPPhaseModel` the same steps
       finish exactly.

    Raises:
        ValueError: a fallback is needed and no ``fallback_table`` was given, or bad input.
    """
    r = as_snapshot_batch("r", r, model.num_aps)
    if classifier.num_aps != model.num_aps:
        raise ValueError(
            f"classifier was trained for {classifier.num_aps} APs, the model has {model.num_aps}"
        )
    own, used = classifier.cells, table.cells
    if own.shape != used.shape or not (
        np.allclose(np.asarray(own.low), np.asarray(used.low), atol=1e-4)
        and abs(own.cell_size - used.cell_size) < 1e-9
    ):
        raise ValueError(
            "classifier was trained for another scene or partition: its cells "
            f"{own.shape} of {own.cell_size} m from {np.asarray(own.low)}, the table's "
            f"{used.shape} of {used.cell_size} m from {np.asarray(used.low)}"
        )
    check_int("num_cells", num_cells, minimum=1)
    if num_cells > own.num_cells:
        raise ValueError(f"num_cells={num_cells} exceeds the classifier's {own.num_cells} cells")
    check_int("fine_steps", fine_steps, minimum=1)
    settings = check_screen_settings(
        screen,
        table,
        num_cells,
        first_cells=first_cells,
        first_mass=first_mass,
        min_mass=min_mass,
        num_starts=num_starts,
        screen_steps=screen_steps,
    )
    if r.shape[0] == 0:  # an empty batch: nothing to screen
        dtype = jnp.result_type(float)
        empty = jnp.zeros((0, 3), dtype)
        none = jnp.zeros((0,), bool)
        return CandidateOnlineResult(
            jnp.zeros((0, num_cells), jnp.int32),
            jnp.zeros((0,), dtype),
            none,
            none,
            empty,
            empty,
            jnp.zeros((0,), dtype),
            jnp.zeros((0,), dtype),
        )
    cells, probs = _cell_probabilities(classifier, r, num_cells)
    found = _screen_candidates(
        r,
        cells,
        np.asarray(probs, np.float64),
        screen,
        table,
        fallback_table,
        settings,
    )
    r64 = r.astype(jnp.result_type(float))
    fine = refine_batch_unchecked(found.x, r64, model, fine_steps)
    return CandidateOnlineResult(
        cells, found.mass, found.fallback, found.narrow, found.x, fine.x, fine.cost, fine.cpo
    )
