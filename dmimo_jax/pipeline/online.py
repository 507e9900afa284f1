"""The online stage of Fig. 1: coarse estimate -> safeguard screen -> fine refinement.

:func:`locate` (a regression network's position, the safeguard window, refinement) and, beyond
the paper, :func:`locate_candidates` (a cell classifier's candidates, the two-tier candidate
screen, the fine stage) compose the stages; :class:`Locator` holds one trained coarse stage
with its screen and fine models and runs them one at a time (so each can be timed) or all at
once.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
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
    recheck_costly,
    refine_batch,
    window_covers_table,
    window_search,
)
from dmimo_jax.estimators.candidates import (
    candidate_search_unchecked,
    cell_groups,
    check_cell_table,
)
from dmimo_jax.estimators.grid import bucket_size, cost_gate_failed
from dmimo_jax.estimators.mle import check_num_steps, refine_batch_unchecked
from dmimo_jax.estimators.search import coarse_to_fine_unchecked
from dmimo_jax.learning.nets import jit_method
from dmimo_jax.physics import PhaseModel


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
            "locate_candidates(r, classifier, ...) or pipeline.Locator(offline, 'cells')"
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
    p: np.ndarray,
    screen: PhaseModel,
    table: CellTable,
    fallback_table: PhasorTable | None,
    settings: ScreenSettings,
) -> CandidateScreen:
    """:func:`screen_candidates` on checked inputs (``p`` the probabilities as NumPy)."""
    first_cells, first_mass, min_mass, num_starts, screen_steps = settings
    num_cells = cells.shape[1]
    mass = p.sum(axis=-1)
    fallback = mass < min_mass
    narrow = ~fallback & (p[:, :first_cells].sum(axis=-1) >= first_mass)
    r64 = r.astype(jnp.result_type(float))
    xs = jnp.zeros((r.shape[0], 3), r64.dtype)
    cells = cells.astype(jnp.int32)

    def search(k):  # grouped cell by cell when that pays (estimators.cell_groups)
        def run(ri, ci):
            ci = ci[:, :k]
            groups = cell_groups(ci, table.cells.num_cells)
            return candidate_search_unchecked(
                ri, screen, table, ci, num_starts, screen_steps, 8, groups
            ).x

        return run

    tiers = (
        (np.flatnonzero(narrow), first_cells),
        (np.flatnonzero(~narrow & ~fallback), num_cells),
    )
    for rows, k in tiers:
        if rows.size:
            xs = xs.at[rows].set(bucketed(search(k), rows, r64, cells))
    bad = np.flatnonzero(fallback)
    if bad.size:
        if fallback_table is None:
            raise ValueError(
                f"{bad.size} snapshots fell below min_mass={min_mass}; pass fallback_table"
            )
        found = bucketed(lambda ri: whole_region_screen(ri, screen, fallback_table), bad, r64)
        xs = xs.at[bad].set(found)
    return CandidateScreen(xs, jnp.asarray(narrow), jnp.asarray(fallback), jnp.asarray(mass))


def whole_region_screen(r: Array, screen: PhaseModel, table: PhasorTable) -> Array:
    """The fallback of the candidate screen and of the cost gate (B, 3): the hierarchical
    search :func:`~dmimo_jax.estimators.coarse_to_fine` of ``table`` (its defaults: 8 starts
    of 25 LM steps) on checked snapshots ``r`` (B, M)."""
    if not isinstance(table, PhasorTable):
        raise ValueError(f"table must be a PhasorTable, got {type(table).__name__}")
    check_table_aps(table, screen)
    k = min(8, table.grid.size)
    return coarse_to_fine_unchecked(r.astype(table.grid.low.dtype), screen, table, k, 25).x


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


# ----------------------------------------------------------------------------- one Locator


class LocatorResult(NamedTuple):
    """Output of :class:`Locator` (leading batch axis B)."""

    x: Array  # (B, 3) the fine estimates, m
    fallback: Array  # (B,) bool: the whole region was screened (unsure, or recovered)
    coarse: Array  # (B, 3) the coarse position (for cells: the most likely cell's centre)
    screened: Array  # (B, 3) the screen's refined best point
    cost: Array  # (B,) ML cost (eq. 17) of ``x`` under the fine model
    cpo: Array  # (B,) CPO estimate at ``x``
    recovered: Array  # (B,) bool: the first answer failed the cost gate and was re-screened


class WindowScreen(NamedTuple):
    """Output of a regression network's safeguard in :class:`Locator` (leading batch axis B)."""

    x: Array  # (B, 3) refined best point of the window search
    fallback: Array  # (B,) bool: the window spans the whole table (the whole region searched)


@dataclasses.dataclass(frozen=True)
class CellStage:
    """The coarse stage of a cell classifier in :class:`Locator`: the top cells and their
    probabilities, then the two-tier candidate screen (:func:`screen_candidates`)."""

    defaults = MappingProxyType({"num_starts": 4, "screen_steps": 2, "fine_steps": 3})

    def check(self, loc: Locator) -> None:
        """The classifier's cells are the cells its table tabulates; the screen's settings."""
        check_int("num_cells", loc.num_cells, minimum=1)
        grid, tabled = loc.estimator.cells, getattr(loc.offline.cells, "cells", None)
        if tabled is None or (
            grid.shape != tabled.shape
            or grid.cell_size != tabled.cell_size
            or not np.allclose(np.asarray(grid.low), np.asarray(tabled.low))
        ):
            raise ValueError(
                "offline.cells (the cell table) does not belong to the classifier's cells "
                f"(classifier: {grid.shape} cells of {grid.cell_size} m from "
                f"{np.asarray(grid.low).tolist()}; table: "
                + (
                    "none"
                    if tabled is None
                    else f"{tabled.shape} cells of {tabled.cell_size} m from "
                    f"{np.asarray(tabled.low).tolist()}"
                )
                + "): use the Offline of one run_offline call"
            )
        own = grid.num_cells
        if loc.num_cells > own:
            raise ValueError(f"num_cells={loc.num_cells} exceeds the classifier's {own} cells")
        settings = check_screen_settings(
            loc.offline.screen,
            loc.offline.cells,
            loc.num_cells,
            first_cells=loc.first_cells,
            first_mass=loc.first_mass,
            min_mass=loc.min_mass,
            num_starts=loc.num_starts,
            screen_steps=loc.screen_steps,
        )
        object.__setattr__(loc, "first_cells", settings.first_cells)

    def coarse(self, loc: Locator, r: Array) -> tuple[Array, Array]:
        return _cell_probabilities(loc.estimator, r, loc.num_cells)

    def check_coarse(self, loc: Locator, r: Array, coarse: Any) -> Any:
        """A user's ``(cells, probs)``, checked as :func:`screen_candidates` checks them."""
        cells, p = check_candidates(r, *coarse, loc.offline.cells)
        if cells.shape[1] != loc.num_cells:
            raise ValueError(f"cells: expected {loc.num_cells} per snapshot, got {cells.shape[1]}")
        return cells, p

    def screen(self, loc: Locator, r: Array, coarse: Any) -> CandidateScreen:
        cells, probs = coarse
        off = loc.offline
        probs = np.asarray(probs, np.float64)
        settings = loc.screen_settings
        return _screen_candidates(r, cells, probs, off.screen, off.cells, off.table, settings)

    def position(self, loc: Locator, coarse: Any) -> Array:
        """The most likely cell's centre (B, 3)."""
        return loc.offline.cells.cells.centre(coarse[0][:, 0])


@dataclasses.dataclass(frozen=True)
class WindowStage:
    """The coarse stage of a regression network (POPT, MLP, HI) in :class:`Locator`: its
    position, then the safeguard window of the offline stage's radius
    (:func:`~dmimo_jax.estimators.window_search`)."""

    defaults = MappingProxyType({"num_starts": 8, "screen_steps": 15, "fine_steps": 15})

    def check(self, loc: Locator) -> None:
        """Nothing beyond the shared settings."""

    def coarse(self, loc: Locator, r: Array) -> Array:
        return coarse_estimate(loc.estimator, r)

    def check_coarse(self, loc: Locator, r: Array, coarse: Any) -> Array:
        """A user's coarse positions: (B, 3), finite."""
        x = jnp.asarray(coarse, r.dtype)
        if x.shape != (r.shape[0], 3) or not bool(jnp.all(jnp.isfinite(x))):
            raise ValueError(f"coarse: expected finite positions of shape ({r.shape[0]}, 3)")
        return x

    def screen(self, loc: Locator, r: Array, coarse: Any) -> WindowScreen:
        off = loc.offline
        radius = off.radii[loc.kind]
        xs = window_search(
            r,
            off.screen,
            coarse,
            radius=radius,
            num_starts=loc.num_starts,
            num_steps=loc.screen_steps,
            table=off.table,
        )
        whole = window_covers_table(off.screen.scene, radius, off.table)
        return WindowScreen(xs, jnp.full(r.shape[0], whole))

    def position(self, loc: Locator, coarse: Any) -> Array:
        return coarse


@dataclasses.dataclass(frozen=True)
class Locator:
    """The online stage of one trained coarse estimator: coarse -> screen -> fine.

    The one online stage of the package (``dj.Locator(offline, kind)``), over any coarse
    stage that :func:`~dmimo_jax.pipeline.run_offline` trained. Each stage is a method, so a
    benchmark can time them one at a time; ``locator(r)`` runs all three, then the cost gate
    (:meth:`certify`), and equals :func:`locate_candidates` (cells) or :func:`locate` (POPT,
    MLP, HI) with the same settings wherever the gate does not trip. Those two functions
    remain for one distinct use: the stages over an estimator and models a user holds
    without an ``Offline`` (a network trained elsewhere); they have no cost gate.

    Attributes:
        offline: the :class:`~dmimo_jax.pipeline.Offline` of :func:`~dmimo_jax.pipeline.run_offline`.
        kind: ``"cells"``, ``"popt"``, ``"mlp"`` or ``"hi"`` (one of ``offline.estimators``).
        num_cells, first_cells, first_mass, min_mass: the candidate screen's tiers (cells,
            :func:`screen_candidates`).
        num_starts: refinement starts of the screen (default 4 for cells, 8 for a window).
        screen_steps: LM steps of each start (default 2 for cells, 15 for a window).
        fine_steps: LM steps of the fine stage (default 3 for cells, 15 for a window).
        fine: ``"screen"`` (default: the screen's model; for the GP its tables of eq. 27, no
            kernel online) or ``"model"`` (``offline.model``: the exact GP).
        cost_gate: the likelihood check of ``__call__``: an answer whose ML cost (eq. 17,
            about chi-square with M - 4 degrees of freedom at the right position) exceeds
            ``cost_gate * (M - 4)`` is in a wrong cell or lobe (its residuals are radians,
            not the noise), and is re-screened over the whole region; one still above it
            is searched again in a dense window around it
            (:func:`~dmimo_jax.estimators.recheck_costly`). ``None`` turns it off.
            The default 100 sits far above the chi-square (and above the paper GP's worst
            right answer, docs/deployment.md) and far below a wrong answer's cost.
    """

    offline: Any
    kind: str = "cells"
    num_cells: int = 16
    first_cells: int | None = None
    first_mass: float = 0.999
    min_mass: float = 0.5
    num_starts: int | None = None
    screen_steps: int | None = None
    fine_steps: int | None = None
    fine: str = "screen"
    cost_gate: float | None = 100.0

    def __post_init__(self):
        estimators = getattr(self.offline, "estimators", None)
        if estimators is None:
            raise ValueError(
                f"offline must be run_offline's result, got {type(self.offline).__name__}"
            )
        if self.kind not in estimators:
            raise ValueError(
                f"kind={self.kind!r} was not trained in this offline stage (it has "
                f"{sorted(estimators)}): pass it in run_offline(kinds=...)"
            )
        if self.fine not in ("screen", "model"):
            raise ValueError(f"fine must be 'screen' or 'model', got {self.fine!r}")
        if self.cost_gate is not None:
            check_scalar("cost_gate", self.cost_gate, positive=True)
        stage = self.stage
        for name, default in stage.defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
            check_int(name, getattr(self, name), minimum=1)
        stage.check(self)

    @property
    def stage(self) -> CellStage | WindowStage:
        """The coarse stage of ``kind``: :class:`CellStage` for the classifier,
        :class:`WindowStage` for a regression network."""
        return CellStage() if self.kind == "cells" else WindowStage()

    @property
    def estimator(self) -> Any:
        """The trained coarse estimator."""
        return self.offline.estimators[self.kind]

    @property
    def screen_settings(self) -> ScreenSettings:
        """The candidate screen's settings (checked at construction)."""
        return ScreenSettings(
            self.first_cells, self.first_mass, self.min_mass, self.num_starts, self.screen_steps
        )

    @property
    def fine_model(self) -> PhaseModel:
        """The model of the fine stage."""
        return self.offline.screen if self.fine == "screen" else self.offline.model

    def _snapshots(self, r: ArrayLike) -> Array:
        """The one check of the Locator's input: (B, M) float64 (the stages' cores trust it)."""
        r = as_snapshot_batch("r", r, self.offline.screen.num_aps)
        return r.astype(jnp.result_type(float))

    # Each public stage checks its snapshots once and runs the stage's core (the underscored
    # method); __call__ checks once and runs the cores.

    def coarse(self, r: ArrayLike) -> Any:
        """Stage 1: ``(cells, probs)`` (B, K) for the classifier, else positions (B, 3)."""
        return self._coarse(self._snapshots(r))

    def _coarse(self, r: Array) -> Any:
        return self.stage.coarse(self, r)

    def screen(self, r: ArrayLike, coarse: Any) -> CandidateScreen | WindowScreen:
        """Stage 2, the safeguard: the candidate screen (cells) or the window (regression)."""
        r = self._snapshots(r)
        return self._screen(r, self.stage.check_coarse(self, r, coarse))

    def _screen(self, r: Array, coarse: Any) -> CandidateScreen | WindowScreen:
        return self.stage.screen(self, r, coarse)

    def fine_stage(self, r: ArrayLike, screened: ArrayLike) -> Any:
        """Stage 3: ``fine_steps`` Levenberg-Marquardt steps under :attr:`fine_model`."""
        r = self._snapshots(r)
        return refine_batch(
            jnp.asarray(screened, r.dtype), r, self.fine_model, num_steps=self.fine_steps
        )

    def _fine_stage(self, r: Array, screened: Array) -> Any:
        return refine_batch_unchecked(screened.astype(r.dtype), r, self.fine_model, self.fine_steps)

    def coarse_position(self, coarse: Any) -> Array:
        """The coarse stage's position (B, 3): the most likely cell's centre for cells."""
        return self.stage.position(self, coarse)

    def whole_region(self, r: ArrayLike) -> tuple[Array, Any]:
        """The fallback: the screen's whole-region search (its phasor table over the UE
        region, :func:`~dmimo_jax.estimators.coarse_to_fine`) + the fine stage."""
        return self._whole_region(self._snapshots(r))

    def _whole_region(self, r: Array) -> tuple[Array, Any]:
        screened = whole_region_screen(r, self.offline.screen, self.offline.table)
        return screened, self._fine_stage(r, screened)

    def certify(self, r: ArrayLike, screened: Array, fine: Any) -> tuple[Array, Any, np.ndarray]:
        """The cost gate: re-screen over the whole region (:meth:`whole_region`) every answer
        of ``fine`` (a :class:`~dmimo_jax.estimators.RefineResult`) whose ML cost exceeds
        ``cost_gate * (M - 4)``. Returns ``(screened, fine, recovered)`` with those rows
        replaced and the (B,) mask of them."""
        return self._certify(self._snapshots(r), screened, fine)

    def _certify(self, r: Array, screened: Array, fine: Any) -> tuple[Array, Any, np.ndarray]:
        recovered = np.zeros(np.shape(fine.cost), bool)
        if self.cost_gate is None:
            return screened, fine, recovered
        recovered = cost_gate_failed(fine.cost, self.offline.screen.num_aps, self.cost_gate)
        rows = np.flatnonzero(recovered)
        if rows.size:
            again, out = bucketed(self._whole_region, rows, r)
            screened = screened.at[rows].set(again)
            fine = jax.tree.map(lambda a, b: a.at[rows].set(b), fine, out)
            # still not a right answer's cost (in a scene of faces: a shadow boundary between
            # it and the UE): the gate's dense window around it, for a batch's rare misses
            fine, _ = recheck_costly(r, self.fine_model, fine, gate=self.cost_gate)
        return screened, fine, recovered

    def __call__(self, r: ArrayLike) -> LocatorResult:
        """All three stages on (M,) or (B, M) wrapped phases, then the cost gate."""
        r = self._snapshots(r)
        coarse = self._coarse(r)
        found = self._screen(r, coarse)
        screened, fine, recovered = self._certify(r, found.x, self._fine_stage(r, found.x))
        return LocatorResult(
            fine.x,
            jnp.asarray(found.fallback) | jnp.asarray(recovered),
            self.coarse_position(coarse),
            screened,
            fine.cost,
            fine.cpo,
            jnp.asarray(recovered),
        )
