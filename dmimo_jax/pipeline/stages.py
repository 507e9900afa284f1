"""The coarse stages of the one online program (:class:`~dmimo_jax.pipeline.Locator`) as
pytrees: a Flax NNX network split into its graph (static) and state (leaves), the cell
classifier's stage (its most likely cells, then the two-tier candidate screen) and a
regression network's stage (its position, then the safeguard window).

Each stage answers the Locator's questions the same way (``coarse``, ``screen``,
``position``, ``check_coarse``), so the program is written once for every kind.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array

from dmimo_jax.estimators import CellGrid, CellTable, window_covers_table
from dmimo_jax.estimators.candidates import check_cell_table as check_aligned_table
from dmimo_jax.estimators.hyperbola import estimate as hyperbola_estimate
from dmimo_jax.estimators.search import coarse_to_fine_starts, coarse_to_fine_unchecked
from dmimo_jax.estimators.window import window_offsets, window_search_unchecked, window_starts
from dmimo_jax.learning.cells import CellClassifier
from dmimo_jax.learning.hi import HIEstimator
from dmimo_jax.pipeline.online import CandidateScreen, cell_screen, cell_starts, check_candidates
from dmimo_jax.pytree import pytree_dataclass, static_field

if TYPE_CHECKING:
    from dmimo_jax.pipeline.locator import Locator


class WindowScreen(NamedTuple):
    """Output of a regression network's safeguard in :class:`Locator` (leading batch axis B)."""

    x: Array
    """(B, 3) refined best point of the window search."""
    fallback: Array
    """(B,) bool: the window spans the whole table (the whole region searched)."""


@pytree_dataclass
class Network:
    """A Flax NNX network as a pytree: its graph (static) and its state (leaves). Calling it
    runs ``method`` of the merged network on float32 inputs."""

    graphdef: Any = static_field()
    state: Any

    @classmethod
    def of(cls, module: nnx.Module) -> Network:
        graphdef, state = nnx.split(module)
        return cls(graphdef, state)

    @property
    def module(self) -> nnx.Module:
        return nnx.merge(self.graphdef, self.state)


@pytree_dataclass
class CellStage:
    """The coarse stage of a cell classifier: its ``num_cells`` most likely cells and their
    probabilities, then the two-tier candidate screen
    (:func:`~dmimo_jax.pipeline.cell_screen`) of the cells' points in the Locator's phasor
    table (a grid aligned with the cells: :func:`~dmimo_jax.estimators.cell_table`)."""

    network: Network
    cells: CellGrid
    per_edge: int = static_field()
    """The table's grid spacings per cell edge."""
    defaults: ClassVar[dict] = {"num_starts": 4, "screen_steps": 2, "fine_steps": 3}

    def cell_table(self, loc: Locator) -> CellTable:
        """The cell table of the Locator's phasor table (a view: no copy)."""
        return CellTable(self.cells, loc.table, self.per_edge)

    def coarse(self, loc: Locator, r: Array) -> tuple[Array, Array]:
        return self.network.module.top_cells(r.astype(jnp.float32), loc.settings.num_cells)

    def screen(
        self, loc: Locator, r: Array, coarse: Any, capacity: int, whole: bool = True
    ) -> tuple[CandidateScreen, Array]:
        """The two-tier screen; ``whole=False`` leaves the unsure rows (``fallback``) to
        the caller (the program runs them with the cost gate's re-screen)."""
        cells, probs = coarse
        return cell_screen(
            r,
            cells.astype(jnp.int32),
            probs,
            loc.screen_model,
            self.cell_table(loc),
            loc.table if whole else None,
            loc.settings.screen,
            capacity,
        )

    def starts(self, loc: Locator, r: Array, coarse: Any) -> tuple[Array, Array]:
        """The screen's starts (B, num_starts, 3) before their refinement and the unsure
        rows (B,) (:func:`~dmimo_jax.pipeline.online.cell_starts`: the cost gate's
        whole-region search takes those)."""
        cells, probs = coarse
        x0, _, unsure, _ = cell_starts(
            r, cells.astype(jnp.int32), probs, self.cell_table(loc), loc.settings.screen
        )
        return x0, unsure

    def position(self, coarse: Any) -> Array:
        """The most likely cell's centre (B, 3)."""
        return self.cells.centre(coarse[0][:, 0])

    def check_coarse(self, loc: Locator, r: Array, coarse: Any) -> Any:
        """A user's ``(cells, probs)``, checked (:func:`~dmimo_jax.pipeline.online.check_candidates`)."""
        cells, p = check_candidates(r, *coarse, self.cell_table(loc))
        if cells.shape[1] != loc.settings.num_cells:
            raise ValueError(
                f"cells: expected {loc.settings.num_cells} per snapshot, got {cells.shape[1]}"
            )
        return cells.astype(jnp.int32), jnp.asarray(p)


@pytree_dataclass
class Regressor:
    """A position regressor (POPT, MLP): positions (B, 3) in the snapshots' dtype."""

    network: Network

    def __call__(self, r: Array) -> Array:
        return self.network.module(r.astype(jnp.float32)).astype(r.dtype)


@pytree_dataclass
class Hyperbolas:
    """The HI benchmark's coarse stage (:class:`~dmimo_jax.learning.hi.HIEstimator`) as a
    pytree: the ambiguity classifier's integers, the hyperboloids' intersection, clipped to
    the UE region."""

    network: Network
    ap_positions: Array
    starts: Array
    low: Array
    high: Array
    wavelength: float = static_field()
    reference: int = static_field()

    def __call__(self, r: Array) -> Array:
        n = self.network.module.predict(r.astype(jnp.float32))
        x = hyperbola_estimate(
            r,
            n,
            self.ap_positions.astype(self.starts.dtype),
            self.wavelength,
            self.starts,
            reference=self.reference,
        )
        return jnp.clip(x, self.low[None, :], self.high[None, :]).astype(r.dtype)


@pytree_dataclass
class WindowStage:
    """The coarse stage of a regression network (POPT, MLP, HI): its position, then the
    safeguard window of the offline stage's radius (the whole table when the window would
    hold 1/16 of it: :func:`~dmimo_jax.estimators.window_covers_table`)."""

    estimator: Regressor | Hyperbolas
    offsets: Array
    """(P, 3) the window's points around the coarse position."""
    low: Array
    """(3,) the box the window is clipped to."""
    high: Array
    whole: bool = static_field()
    defaults: ClassVar[dict] = {"num_starts": 8, "screen_steps": 15, "fine_steps": 15}

    def coarse(self, loc: Locator, r: Array) -> Array:
        return self.estimator(r)

    def screen(
        self, loc: Locator, r: Array, coarse: Array, capacity: int, whole: bool = True
    ) -> tuple[WindowScreen, Array]:
        s = loc.settings
        if self.whole:
            xs = coarse_to_fine_unchecked(
                r, loc.screen_model, loc.table, s.num_starts, s.screen_steps
            ).x
        else:
            xs = window_search_unchecked(
                r,
                loc.screen_model,
                coarse,
                self.offsets,
                self.low,
                self.high,
                s.num_starts,
                s.screen_steps,
            )
        none = jnp.zeros(r.shape[0], bool)
        return WindowScreen(xs, jnp.full(r.shape[0], self.whole)), none

    def starts(self, loc: Locator, r: Array, coarse: Array) -> tuple[Array, Array]:
        """The screen's starts (B, num_starts, 3) before their refinement (the phasor
        table's most coherent points when the window spans it, else the window's points of
        lowest LS cost) and no unsure row."""
        k = loc.settings.num_starts
        if self.whole:
            x0 = coarse_to_fine_starts(r, loc.table, k)[0]
        else:
            x0 = window_starts(r, loc.screen_model, coarse, self.offsets, self.low, self.high, k)
        return x0, jnp.zeros(r.shape[0], bool)

    def position(self, coarse: Array) -> Array:
        return coarse

    def check_coarse(self, loc: Locator, r: Array, coarse: Any) -> Array:
        """A user's coarse positions: (B, 3), finite."""
        x = jnp.asarray(coarse, r.dtype)
        if x.shape != (r.shape[0], 3) or not bool(jnp.all(jnp.isfinite(x))):
            raise ValueError(f"coarse: expected finite positions of shape ({r.shape[0]}, 3)")
        return x


def window_box(scene: Any) -> tuple[Array, Array]:
    """The box a safeguard window is clipped to: the UE region and 0.25 m around it."""
    return jnp.asarray(scene.ue_low) - 0.25, jnp.asarray(scene.ue_high) + 0.25


def coarse_stage(offline: Any, kind: str, estimator: Any) -> CellStage | WindowStage:
    """The coarse stage of a trained estimator of ``offline`` (``offline.estimators[kind]``):
    a cell classifier's cells and screen, or a regression network's window.

    Raises:
        ValueError: not a trained network of the package.
    """
    if isinstance(estimator, CellClassifier):
        tab = offline.cells
        check_aligned_table(CellTable(tab.cells, offline.table, tab.per_edge), offline.screen)
        return CellStage(Network.of(estimator), tab.cells, tab.per_edge)
    if isinstance(estimator, HIEstimator):
        clf = estimator.classifier
        coarse = Hyperbolas(
            Network.of(clf),
            jnp.asarray(clf.ap_positions[...]),
            estimator.starts,
            estimator.low,
            estimator.high,
            float(clf.wavelength),
            int(clf.config.reference),
        )
    elif isinstance(estimator, nnx.Module):
        coarse = Regressor(Network.of(estimator))
    else:
        raise ValueError(
            f"offline.estimators[{kind!r}] must be a trained network (a cell classifier, POPT, "
            f"the MLP) or an HIEstimator, got {type(estimator).__name__}"
        )
    scene = offline.screen.scene
    lam = float(scene.wavelength)
    low, high = window_box(scene)
    radius = min(float(offline.radii[kind]), float(jnp.max(high - low)))
    whole = window_covers_table(scene, offline.radii[kind], offline.table)
    offsets = jnp.asarray(window_offsets(radius, lam / 4), low.dtype)
    return WindowStage(coarse, offsets, low, high, bool(whole))


def check_cell_table(classifier: CellClassifier, table: Any) -> None:
    """``ValueError`` unless ``table`` is the cell table of ``classifier``'s cells."""
    grid, tabled = classifier.cells, getattr(table, "cells", None)
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
