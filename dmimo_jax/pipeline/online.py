"""The online stage of Fig. 1: coarse estimate -> safeguard screen -> fine refinement.

:func:`locate` composes the paper's stages from their parts (a regression network's
position, the safeguard window, refinement). Beyond the paper, the cell classifier's
two-tier candidate screen (:func:`cell_screen`, with its checks of a classifier's output
and settings) is the screen of :class:`~dmimo_jax.pipeline.Locator`, the one online object
that holds a trained coarse stage with its screen and fine models and runs them one at a
time (so each can be timed) or all at once.
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
)
from dmimo_jax.estimators import (
    CellTable,
    PhasorTable,
    refine_batch,
    window_search,
)
from dmimo_jax.estimators.candidates import (
    check_cell_table,
    tiered_candidate_starts,
)
from dmimo_jax.estimators.mle import refine_multistart_unchecked
from dmimo_jax.estimators.rows import on_rows
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
            "pipeline.Locator.from_offline(offline, 'cells')"
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

    coarse: Array
    """(B, 3) learned estimate."""
    screened: Array
    """(B, 3) best point of the safeguard window (after its cheap refinement)."""
    fine: Array
    """(B, 3) refined with the exact phase model."""
    cost: Array
    """(B,) ML cost (eq. 17) at the fine estimate."""
    cpo: Array
    """(B,) CPO estimate at the fine estimate."""


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


def cell_probabilities(classifier: nnx.Module, r: ArrayLike, k: int) -> tuple[Array, Array]:
    """The ``k`` most likely cells (B, k) of a :class:`~dmimo_jax.learning.cells.CellClassifier`,
    most likely first, and their probabilities (B, k), run as one jitted pure function of
    the current weights."""
    r = as_snapshot_batch("r", r, classifier.num_aps)
    check_int("k", k, minimum=1, maximum=classifier.cells.num_cells)
    return _cell_probabilities(classifier, r, k)


def _cell_probabilities(classifier: nnx.Module, r: Array, k: int) -> tuple[Array, Array]:
    return jit_method(classifier, "top_cells", r.astype(jnp.float32), k=k)


class CandidateScreen(NamedTuple):
    """Output of the candidate screen :func:`cell_screen` (leading batch axis B)."""

    x: Array
    """(B, 3) refined best point of the screen."""
    narrow: Array
    """(B,) bool: only the first cells were screened (confident)."""
    fallback: Array
    """(B,) bool: the whole region was screened (unsure)."""
    mass: Array
    """(B,) probability of the num_cells candidates (the confidence signal)."""


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
    """``ValueError`` unless the candidate screen's settings (:func:`cell_screen`) fit
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
    check_int("screen_steps", screen_steps)
    return ScreenSettings(first_cells, first_mass, min_mass, num_starts, screen_steps)


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
    """The two-tier candidate screen of a cell classifier's candidates ``cells`` (B, K),
    most likely first, and their probabilities ``probs`` (B, K), traced and unchecked.

    Each row screens its first ``settings.first_cells`` cells when they hold
    ``first_mass`` (confident), all K when they hold ``min_mass``, in one search over the
    batch (:func:`~dmimo_jax.estimators.candidates.tiered_candidate_starts`: cell by cell
    for a batch of at least :data:`BY_CELL_BATCH` rows, else row by row); the unsure rows
    (less than ``min_mass`` in all K) screen the whole region on at most ``capacity`` rows
    (:func:`~dmimo_jax.pipeline.program.on_rows`).

    Returns:
        ``(screen, overflow)``: the :class:`CandidateScreen` and the (B,) mask of unsure
        rows beyond the capacity (their ``x`` is meaningless: run them again).
    """
    starts, narrow, fallback, mass = cell_starts(r, cells, probs, table, settings)
    xs = refine_multistart_unchecked(starts, r, screen, settings.screen_steps).x
    overflow = jnp.zeros(r.shape[0], bool)
    if fallback_table is not None:
        whole = lambda ri: whole_region_screen_unchecked(ri, screen, fallback_table)
        xs, overflow = on_rows(fallback, capacity, whole, xs, r)
    return CandidateScreen(xs, narrow, fallback, mass), overflow


def cell_starts(
    r: Array,
    cells: Array,
    probs: Array,
    table: CellTable,
    settings: ScreenSettings,
    by_cell: bool | None = None,
) -> tuple[Array, Array, Array, Array]:
    """The starts of :func:`cell_screen` before their refinement, traced and unchecked:
    ``(starts, narrow, fallback, mass)``, the (B, num_starts, 3) most coherent points of
    each row's screened cells (its first ``first_cells`` when they hold ``first_mass``,
    all K when they hold ``min_mass``; the unsure rows, ``fallback``, screen none and their
    starts are meaningless), whether a row screened only its first cells, whether it is
    unsure, and the probability mass of its K cells (B,). ``by_cell`` (static) screens cell
    by cell or row by row (default: cell by cell for at least :data:`BY_CELL_BATCH` rows);
    ``table`` may be a :class:`~dmimo_jax.pipeline.tiled_screen.TiledCellTable` (every
    tile's cells, one screen for the rows of all of them)."""
    first_cells, first_mass, min_mass, num_starts, _ = settings
    num_cells = cells.shape[1]
    p = probs.astype(r.dtype)
    mass = p.sum(axis=-1)
    fallback = ~(mass >= min_mass)
    narrow = ~fallback & (p[:, :first_cells].sum(axis=-1) >= first_mass)
    count = jnp.where(fallback, 0, jnp.where(narrow, first_cells, num_cells))
    by_cell = r.shape[0] >= BY_CELL_BATCH if by_cell is None else by_cell
    tiers = (first_cells, num_cells)
    starts = tiered_candidate_starts(r, table, cells, count, num_starts, by_cell, tiers)
    return starts, narrow, fallback, mass


BY_CELL_BATCH = 32
"""Batches of at least this many rows screen their candidates cell by cell (one matrix
product of a cell's points with the rows that name it), smaller ones row by row."""


def whole_region_screen_unchecked(r: Array, screen: PhaseModel, table: PhasorTable) -> Array:
    """The fallback of the candidate screen (B, 3): the hierarchical search
    :func:`~dmimo_jax.estimators.coarse_to_fine` of ``table`` (8 starts of 25 LM steps)
    on snapshots ``r`` (B, M), traceable and unchecked."""
    k = min(REGION_STARTS, table.grid.size)
    x = r.astype(table.grid.low.dtype)
    return coarse_to_fine_unchecked(x, screen, table, k, REGION_STEPS).x
