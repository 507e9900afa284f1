"""The one online object: :class:`Locator`, a pytree whose call is one XLA program.

``dj.Locator.from_offline(offline, kind)`` holds a trained coarse stage (the cell classifier, POPT, the
MLP or HI), the screen's and the fine stage's models and the lookup tables, as pytree
leaves; its settings are static. :meth:`Locator.program` is the traced core: coarse stage,
the candidate screen in two tiers (or the safeguard window), the fine stage and the cost
gate, a loop of rescues (:mod:`~dmimo_jax.pipeline.rescues`: exclude faulty APs, search the
whole region, a dense recheck) on a fixed capacity of rows, whose outcome is one
:class:`~dmimo_jax.pipeline.rescues.Status` per row. ``Locator.__call__`` is the thin checked
shell around it: it validates concrete snapshots, pads the batch to one of :data:`BUCKETS`
(seven programs serve any batch), runs the program, and re-runs the rows that did not fit
the capacity through the same program (no new compile); traced (under ``jax.jit``,
``jax.vmap``) it skips the checks and reports those rows as ``overflow`` instead.

So ``jax.jit(loc)``, ``jax.vmap(loc)`` over snapshots, :func:`~dmimo_jax.pipeline.export.sharded`
and :func:`~dmimo_jax.pipeline.export.export_locator` run the same program (called from the
host, compiled with :data:`~dmimo_jax.pipeline.batches.PROGRAM_COMPILER_OPTIONS`).
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import as_snapshot_batch, check_finite, check_phases, is_concrete
from dmimo_jax.estimators import PhasorTable
from dmimo_jax.estimators.mle import RefineResult, best_start_then_refine, refine_batch_unchecked
from dmimo_jax.estimators.rows import MIN_CAPACITY, capacity_for, passes_gate
from dmimo_jax.estimators.window import window_offsets
from dmimo_jax.learning.cells import CellClassifier
from dmimo_jax.phase import wrap
from dmimo_jax.physics import PhaseModel
from dmimo_jax.pipeline.batches import (
    BUCKETS,
    bucket_for,
    padded_parts,
    program_jit,
    run_in_buckets,
)
from dmimo_jax.pipeline.gate import run_gate
from dmimo_jax.pipeline.heal import HealReport, heal
from dmimo_jax.pipeline.online import CandidateScreen
from dmimo_jax.pipeline.rescues import (
    DEFAULT_RESCUES,
    Answer,
    LocatorResult,
    RegionSearch,
    Status,
    final_status,
    initial_state,
)
from dmimo_jax.pipeline.settings import LocatorSettings, checked_settings
from dmimo_jax.pipeline.stages import (
    CellStage,
    WindowScreen,
    WindowStage,
    check_cell_table,
    coarse_stage,
    window_box,
)
from dmimo_jax.pytree import pytree_dataclass, static_field

# ----------------------------------------------------------------------------- the Locator


@pytree_dataclass
class Locator:
    """The online stage of one trained coarse estimator: coarse -> screen -> fine -> gate.

    The one online stage of the package (``dj.Locator.from_offline(offline, kind)``), over
    any coarse stage that :func:`~dmimo_jax.pipeline.run_offline` trained, as a pytree: its
    fields are its constructor's arguments (the trained stage, the models, the tables, the
    healed phase corrections and the region are leaves; one static :class:`LocatorSettings`),
    copies are ``dataclasses.replace`` (:meth:`replace` checks changed settings). Its
    call is one XLA program (:meth:`program`), so ``jax.jit(loc)``, ``jax.vmap(loc)`` over
    single snapshots and ``loc(r)`` give the same answers. Each stage is also a method, so a
    benchmark can time them one at a time (``coarse``, ``screen``, ``fine_stage``: their
    composition is ``loc(r)`` wherever the cost gate does not trip; for POPT, MLP and HI also
    :func:`~dmimo_jax.pipeline.locate` with the same settings).

    Args (of :meth:`from_offline`):
        offline: the :class:`~dmimo_jax.pipeline.Offline` of :func:`~dmimo_jax.pipeline.run_offline`.
        kind: ``"cells"``, ``"popt"``, ``"mlp"`` or ``"hi"`` (one of ``offline.estimators``;
            default: the kind ``offline`` trained; of several, ``"cells"`` if it is one, else
            the first: ``Locator.from_offline(run_offline(...))`` works with both defaults).
        num_cells: the classifier's candidate cells screened at most (cells,
            :func:`~dmimo_jax.pipeline.cell_screen`, as the next three).
        first_cells: the cells of the screen's first tier.
        first_mass: the probability mass the first tier must hold, else the second runs.
        min_mass: below it, the row is unsure and re-screened over the whole region.
        num_starts: refinement starts of the screen (default 4 for cells, 8 for a window).
        screen_steps: LM steps of each start (default 2 for cells, 15 for a window).
        fine_steps: LM steps of the fine stage (default 3 for cells, 15 for a window).
        fine: ``"screen"`` (default: the screen's model; for the GP its tables of eq. 27, no
            kernel online) or ``"model"`` (``offline.model``: the exact GP).
        cost_gate: the likelihood check: an answer whose ML cost (eq. 17, about chi-square
            with M - 4 degrees of freedom at the right position) exceeds
            ``cost_gate * (M - 4)`` (or is not finite) is in a wrong cell or lobe, and is
            re-screened over the whole region; one still above it is searched again in a
            dense window around it (:func:`~dmimo_jax.estimators.recheck_costly`'s search)
            when at most ``recheck_fraction`` of the batch (at least one row) is; an answer
            that still fails is ``rejected``. ``None`` turns it off. The default 100 sits
            far above the chi-square (and above the paper GP's worst right answer,
            docs/deployment.md) and far below a wrong answer's cost.
        capacity: the fraction of a batch (at least 16 rows, or the whole batch when it is
            smaller: a batch of up to 16 never needs a second program) that each rare
            step (the whole-region fallback, the gate's re-screen) handles in one program (0: one row); rows beyond it are re-run by the call
            (``overflow`` under tracing).
        recheck_fraction: see ``cost_gate``.
        max_excluded: faulty APs (an offset jump, random or stale phases, a body in the
            LoS) an answer that fails the cost gate may leave out, one at a time, before
            it is re-screened (:func:`~dmimo_jax.estimators.faults.exclude_faults`: the
            AP of largest residual from a robust CPO, re-fitted without it, the gate at
            ``cost_gate * (M - k - 4)``); the result's ``excluded`` names them. Never more
            than ``max_excluded`` in all. The more APs may be left out, the likelier that
            some subset of pure noise fits a position: a value whose bound
            (:func:`~dmimo_jax.bounds.noise_fit_probability` summed over 0 ..
            ``max_excluded``) exceeds ``fit_risk`` is refused (with 17 APs at -10 dBm:
            at most 7; with four APs left any phases fit). Default: 3, or the most the
            bound allows where that is fewer. 0 turns fault exclusion off. An answer under
            the gate is never touched, so without faults the answers are those of
            ``max_excluded=0``.
        fit_risk: the chance accepted that phases with no relation to the model (noise on
            every AP) pass the cost gate (see ``max_excluded``); an answer whose exclusions
            exceed it is ``unverified``.
        rescues: the cost gate's rescues, in order
            (:data:`~dmimo_jax.pipeline.rescues.DEFAULT_RESCUES`: exclude faulty APs, search
            the whole region, a dense recheck); a new rescue is an object with ``status``,
            ``takes``, ``capacity`` and ``run`` (:class:`~dmimo_jax.pipeline.rescues.Rescue`).

    Raises:
        ValueError: an ``offline`` that is not :func:`run_offline`'s, a ``kind`` it did not
            train, or bad settings.
    """

    stage: CellStage | WindowStage
    screen_model: PhaseModel
    fine_model: PhaseModel
    table: PhasorTable
    recheck_offsets: Array
    phase_corrections: Array
    region_low: Array
    region_high: Array
    settings: LocatorSettings = static_field()

    def __post_init__(self) -> None:
        if not isinstance(self.settings, LocatorSettings):
            raise ValueError(
                f"settings must be a LocatorSettings, got {type(self.settings).__name__} (build "
                "a Locator with Locator.from_offline(offline, kind, ...))"
            )

    @classmethod
    def from_offline(
        cls,
        offline: Any,
        kind: str | None = None,
        *,
        num_cells: int = 16,
        first_cells: int | None = None,
        first_mass: float = 0.999,
        min_mass: float = 0.5,
        num_starts: int | None = None,
        screen_steps: int | None = None,
        fine_steps: int | None = None,
        fine: str = "screen",
        cost_gate: float | None = 100.0,
        capacity: float = 1 / 16,
        recheck_fraction: float = 0.05,
        max_excluded: int | None = None,
        rescues: tuple = DEFAULT_RESCUES,
        fit_risk: float = 1e-3,
    ) -> Locator:
        """The Locator of one coarse stage that ``offline`` trained (the arguments: see the
        class docstring); its settings checked (``ValueError``)."""
        estimators = getattr(offline, "estimators", None)
        if estimators is None:
            raise ValueError(f"offline must be run_offline's result, got {type(offline).__name__}")
        if kind is None:  # the one trained, "cells" among several, else the first trained
            kind = "cells" if "cells" in estimators or not estimators else next(iter(estimators))
        if kind not in estimators:
            raise ValueError(
                f"kind={kind!r} was not trained in this offline stage (it has "
                f"{sorted(estimators)}): pass it in run_offline(kinds=...)"
            )
        if fine not in ("screen", "model"):
            raise ValueError(f"fine must be 'screen' or 'model', got {fine!r}")
        estimator = estimators[kind]
        if isinstance(estimator, CellClassifier):
            check_cell_table(estimator, offline.cells)
        stage = coarse_stage(offline, kind, estimator)
        scene = offline.screen.scene
        lam = float(scene.wavelength)
        low, high = window_box(scene)
        recheck_radius = min(lam / 4, float(jnp.max(high - low)))
        fields = dict(
            stage=stage,
            screen_model=offline.screen,
            fine_model=offline.screen if fine == "screen" else offline.model,
            table=offline.table,
            recheck_offsets=jnp.asarray(window_offsets(recheck_radius, lam / 16), low.dtype),
            region_low=low,
            region_high=high,
            phase_corrections=jnp.zeros(offline.screen.num_aps, low.dtype),
        )
        mesh = offline.table.mesh
        if mesh is not None:  # the table is sharded over several devices: the rest replicated
            from jax.sharding import NamedSharding, PartitionSpec

            everywhere = NamedSharding(mesh, PartitionSpec())
            for name in fields:
                if name != "table":
                    fields[name] = jax.device_put(fields[name], everywhere)
        settings = dict(
            kind=kind,
            num_cells=num_cells,
            first_cells=first_cells,
            first_mass=first_mass,
            min_mass=min_mass,
            num_starts=num_starts,
            screen_steps=screen_steps,
            fine_steps=fine_steps,
            fine=fine,
            cost_gate=cost_gate,
            capacity=capacity,
            recheck_fraction=recheck_fraction,
            max_excluded=max_excluded,
            rescues=rescues,
            fit_risk=fit_risk,
        )
        raw = cls(**fields, settings=LocatorSettings(**settings))  # checked against it next
        return dataclasses.replace(raw, settings=checked_settings(raw, settings))

    def replace(self, **changes: Any) -> Locator:
        """A Locator with the same trained stage and tables and some settings changed
        (``fine`` included); checked like the constructor's."""
        derived = {"kind", "noise_fit"}
        unknown = (set(changes) - set(LocatorSettings._fields)) | (derived & set(changes))
        if unknown:
            raise ValueError(f"replace: not a setting of a Locator: {sorted(unknown)}")
        if "fine" in changes and changes["fine"] != self.settings.fine:
            raise ValueError(
                "replace: fine= changes the model; build a new Locator.from_offline(offline, ...)"
            )
        settings = {**self.settings._asdict(), **changes}
        if "cost_gate" in changes:  # the noise-fit bound is the gate's
            settings["noise_fit"] = ()
        return self._with(settings=checked_settings(self, settings))

    def with_table(self, table: PhasorTable) -> Locator:
        """The same Locator over another copy of its phasor table (e.g. on other devices).

        Raises:
            ValueError: ``table`` not a PhasorTable of this Locator's APs and grid points.
        """
        if not isinstance(table, PhasorTable):
            raise ValueError(f"table must be a PhasorTable, got {type(table).__name__}")
        own = self.table
        if table.num_aps != self.num_aps or table.grid.shape != own.grid.shape:
            raise ValueError(
                f"table must tabulate this Locator's {self.num_aps} APs on its grid of "
                f"{own.grid.shape} points, got {table.num_aps} APs on {table.grid.shape}"
            )
        return self._with(table=table)

    def _with(self, **fields: Any) -> Locator:
        """This Locator with some of its fields (leaves or settings) replaced
        (``dataclasses.replace``: the settings are not checked again)."""
        return dataclasses.replace(self, **fields)

    def corrected(self, r: Array) -> Array:
        """Snapshots ``r`` (..., M) with the healed phase offsets (:meth:`heal`) subtracted;
        an AP whose correction is 0 is left untouched, bit for bit. Traced."""
        c = self.phase_corrections.astype(r.dtype).reshape((1,) * (r.ndim - 1) + (-1,))
        return jnp.where(c == 0, r, wrap(r - c))

    @property
    def estimator(self) -> Any:
        """The trained coarse network (a fresh module of the Locator's weights)."""
        stage = self.stage
        net = stage.network if isinstance(stage, CellStage) else stage.estimator.network
        return net.module

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.screen_model.num_aps

    # ------------------------------------------------------------------ the traced core

    def capacity_for(self, batch: int) -> int:
        """The rows a rare step handles in one program for a batch of ``batch`` rows: at
        least ``MIN_CAPACITY`` (which says why) unless ``capacity`` is 0."""
        minimum = MIN_CAPACITY if self.settings.capacity else 1
        return capacity_for(batch, self.settings.capacity, minimum)

    def program(self, r: Array, capacity: int, count: Array | None = None) -> LocatorResult:
        """The traced core: ``r`` (B, M) checked snapshots in the working float dtype, the
        rescues on ``capacity`` rows (static); ``count`` (traced) the real rows of a padded
        batch (the rows past it take no rescue and no capacity). One program: no host in
        the loop."""
        if r.shape[0] == 0:  # an empty batch: the empty result (jit, vmap and call alike)
            return self._empty(r.dtype)
        r = self.corrected(r)  # healed offsets (:meth:`heal`); 0: untouched
        coarse = self.stage.coarse(self, r)
        starts, unsure = self.stage.starts(self, r, coarse)
        return self.from_starts(r, self.stage.position(coarse), starts, unsure, capacity, count)

    def from_starts(
        self,
        r: Array,
        position: Array,
        starts: Array,
        unsure: Array,
        capacity: int,
        count: Array | None = None,
    ) -> LocatorResult:
        """:meth:`program` after its screen: ``r`` (B, M) the corrected snapshots,
        ``position`` (B, 3) the coarse stage's, ``starts`` (B, num_starts, 3) and ``unsure``
        (B,) the screen's (``self.stage.starts``); the first answer, then the cost gate.
        Traced. A tiled building screens the rows of every tile in one search
        (:mod:`~dmimo_jax.pipeline.tiled_screen`) and runs each tile's rest here."""
        screened, fine = self.first_answer(r, starts)
        count = jnp.int32(r.shape[0]) if count is None else count
        answer = Answer(screened, fine, jnp.zeros(r.shape, bool))
        state = run_gate(self, r, initial_state(self, answer, unsure, count), capacity)
        a, status = state.answer, final_status(self, state)
        fine = a.fine
        return LocatorResult(fine.x, position, a.screened, fine.cost, fine.cpo, a.excluded,
                             status, unsure)  # fmt: skip

    def first_answer(self, r: Array, starts: Array) -> tuple[Array, RefineResult]:
        """The screen's refinement of ``starts`` (B, num_starts, 3) under
        :attr:`screen_model`, then the fine stage from each row's best under
        :attr:`fine_model` (:func:`~dmimo_jax.estimators.mle.best_start_then_refine`):
        ``(screened, fine)``. Traced."""
        s = self.settings
        fine = None if s.fine == "screen" else self.fine_model
        return best_start_then_refine(
            starts, r, self.screen_model, s.screen_steps, s.fine_steps, fine
        )

    def refine(self, r: Array, screened: Array) -> RefineResult:
        """The fine stage, traced: ``fine_steps`` LM steps under :attr:`fine_model`."""
        return refine_batch_unchecked(
            screened.astype(r.dtype), r, self.fine_model, self.settings.fine_steps
        )

    @property
    def excluding(self) -> bool:
        """Whether fault exclusion is on (``max_excluded`` > 0 and a cost gate)."""
        return bool(self.settings.max_excluded) and self.settings.cost_gate is not None

    def passes(self, cost: Array, excluded: Array) -> Array:
        """(B,) whether costs pass the gate of the APs left: ``cost_gate * (M - k - 4)`` for
        k excluded (``cost_gate * (M - 4)`` with none); NaN fails; without a cost gate,
        every finite cost passes."""
        if self.settings.cost_gate is None:
            return jnp.isfinite(cost)
        return passes_gate(cost, self.settings.cost_gate, self.num_aps, excluded)

    # ------------------------------------------------------------------ healing

    def heal(
        self,
        r: ArrayLike,
        out: LocatorResult,
        *,
        min_count: int = 10,
        min_coherence: float = 0.9,
    ) -> tuple[Locator, HealReport]:
        """Repair the faults that persist in the answers ``out`` of snapshots ``r``: offset
        jumps corrected before the program, dead APs reported
        (:func:`~dmimo_jax.pipeline.heal.heal`)."""
        return heal(self, r, out, min_count=min_count, min_coherence=min_coherence)

    # ------------------------------------------------------------------ the checked shell

    def _snapshots(self, r: ArrayLike) -> Array:
        """The one check of the Locator's input: (B, M) float (the stages' cores trust it)."""
        r = as_snapshot_batch("r", r, self.num_aps)
        return r.astype(jnp.result_type(float))

    def __call__(self, r: ArrayLike) -> LocatorResult:
        """All stages on (M,) or (B, M) wrapped phases, then the cost gate, as one program.

        One (M,) snapshot gives a result without the batch axis. Concrete snapshots are
        checked (``ValueError`` for a wrong shape, NaN or complex values) and rows that did
        not fit the capacity are run again (``overflow`` is then all False); traced ones
        (``jax.jit(loc)``, ``jax.vmap(loc)``) are trusted, and ``overflow`` reports them.
        """
        single = np.ndim(r) == 1
        if is_concrete(r):
            rb = self._host_snapshots(r) if not isinstance(r, jax.Array) else self._snapshots(r)
            if rb.shape[0] == 0:
                return self._empty(rb.dtype)
            out = self._bucketed(rb)
            if is_concrete(out.status):  # traced under a vmap over Locators: reported only
                out = self._rerun_overflow(rb, out)
            return _first_row(out) if single else out
        if np.shape(r)[-1:] != (self.num_aps,) or np.ndim(r) not in (1, 2):
            raise ValueError(
                f"r must have shape ({self.num_aps},) or (B, {self.num_aps}), got {np.shape(r)}"
            )
        rb = jnp.asarray(r).astype(jnp.result_type(float))
        if single:  # jax.vmap(loc) of batches: one batched program (_locate_one)
            return _locate_one(self, rb)
        return _program(self, rb, self.capacity_for(rb.shape[0]))

    def _host_snapshots(self, r: Any) -> np.ndarray:
        """:meth:`_snapshots` for input on the host (NumPy, lists): checked the same way and
        kept there as (B, M) NumPy, so padding and splitting cost no device dispatch."""
        check_phases("r", r, self.num_aps)
        return np.asarray(r, jnp.result_type(float)).reshape(-1, self.num_aps)

    def _bucketed(self, r: Array | np.ndarray) -> LocatorResult:
        """The program on concrete rows ``r`` (B, M) in :func:`padded_parts` (the padding
        takes no rescue and is dropped): batches of 1 to 4,096 rows run one of
        ``len(BUCKETS)`` programs, each compiled once."""

        def run(padded: Array | np.ndarray, n: int) -> LocatorResult:
            return _program(self, padded, self.capacity_for(padded.shape[0]), np.int32(n))

        return run_in_buckets(run, r)

    def _rerun_overflow(self, r: Array | np.ndarray, out: LocatorResult) -> LocatorResult:
        """The rows of ``r`` that overflowed the capacity, run again through the program the
        batch ran (its first part's bucket: no new compile), at most its capacity of them at
        a time, the rest of the bucket padding: each then fits every rescue."""
        rows = np.flatnonzero(np.asarray(out.status) == Status.OVERFLOW)  # on the host
        if rows.size == 0:
            return out
        size = bucket_for(min(r.shape[0], BUCKETS[-1]))
        capacity = self.capacity_for(size)
        for start in range(0, rows.size, capacity):
            chunk = rows[start : start + capacity]
            _, padded = next(padded_parts(r[chunk], (size,)))  # one part: chunk <= size
            again = _program(self, padded, capacity, np.int32(chunk.size))
            out = jax.tree.map(lambda a, b, c=chunk: a.at[c].set(b[: c.size]), out, again)
        return out

    def _empty(self, dtype: Any) -> LocatorResult:
        z3, z, f = jnp.zeros((0, 3), dtype), jnp.zeros((0,), dtype), jnp.zeros((0,), bool)
        out = jnp.zeros((0, self.num_aps), bool)
        return LocatorResult(z3, z3, z3, z, z, out, jnp.zeros((0,), jnp.int32), f)

    # ------------------------------------------------------------------ stage by stage

    def coarse(self, r: ArrayLike) -> Any:
        """Stage 1: ``(cells, probs)`` (B, K) for the classifier, else positions (B, 3)."""
        return _coarse(self, self._snapshots(r))

    def screen(self, r: ArrayLike, coarse: Any) -> CandidateScreen | WindowScreen:
        """Stage 2, the safeguard: the candidate screen (cells) or the window (regression);
        every rare row fitted."""
        r = self._snapshots(r)
        coarse = self.stage.check_coarse(self, r, coarse)
        return _screen(self, r, coarse, max(r.shape[0], 1))[0]

    def fine_stage(self, r: ArrayLike, screened: ArrayLike) -> RefineResult:
        """Stage 3: ``fine_steps`` Levenberg-Marquardt steps under :attr:`fine_model`."""
        r = self._snapshots(r)
        return _refine(self, r, _checked_positions("screened", screened, r))

    def coarse_position(self, coarse: Any) -> Array:
        """The coarse stage's position (B, 3): the most likely cell's centre for cells."""
        return self.stage.position(coarse)

    def whole_region(self, r: ArrayLike) -> Answer:
        """The whole-region search (:class:`~dmimo_jax.pipeline.rescues.RegionSearch`) of
        every row: its :class:`~dmimo_jax.pipeline.rescues.Answer` (``screened``, ``fine``
        and the APs it left out when fault exclusion is on)."""
        return _region(self, self._snapshots(r))

    def certify(
        self, r: ArrayLike, screened: Array, fine: RefineResult
    ) -> tuple[Array, RefineResult, np.ndarray]:
        """The cost gate's rescues on answers ``(screened, fine)`` (every row fitted;
        ``screened`` finite, ``ValueError`` otherwise; a non-finite ``fine`` fails the gate).
        Returns ``(screened, fine, rescued)``: the rows the rescues ran on replaced, and the
        (B,) mask of those a rescue brought under the gate."""
        r = self._snapshots(r)
        screened = _checked_positions("screened", screened, r)
        if not isinstance(fine, RefineResult) or np.shape(fine.x) != (r.shape[0], 3):
            raise ValueError(  # a NaN in fine is an answer that fails the gate: it is rescued
                f"fine must be fine_stage's RefineResult for the {r.shape[0]} snapshots r"
            )
        out = _certify(self, r, screened, fine, max(r.shape[0], 1))
        return out.screened, out.fine, np.asarray(out.rescued)

    @staticmethod
    def compiled_programs() -> int:
        """The programs the Locator's jitted core holds in this process (every Locator,
        batch bucket and capacity it was called with; JAX's in-memory caches; -1 where this
        JAX does not report it): what a benchmark counts to check the buckets' bound."""
        return _program.cache_size()


def _checked_positions(name: str, x: ArrayLike, r: Array) -> Array:
    """``x`` as (B, 3) positions of ``r``'s dtype for the (B, M) snapshots ``r``:
    ``ValueError`` naming ``name`` for another shape or a NaN (no silent NaN answer)."""
    x = jnp.asarray(x, r.dtype)
    if x.shape != (r.shape[0], 3):
        raise ValueError(f"{name} must have shape ({r.shape[0]}, 3), got {x.shape}")
    check_finite(name, x)
    return x


_program = program_jit(Locator.program, static_argnums=2)  # plain inside a trace
_first_row = jax.jit(partial(jax.tree.map, lambda a: a[0]))  # one dispatch for every leaf


def _locate_one_plain(loc: Locator, r: Array) -> LocatorResult:
    return jax.tree.map(lambda a: a[0], _program(loc, r[None], loc.capacity_for(1)))


@jax.custom_batching.custom_vmap
def _locate_one(loc: Locator, r: Array) -> LocatorResult:
    """One traced (M,) snapshot. Under ``jax.vmap`` over snapshots it is the batched program
    (:meth:`Locator.program` on the (B, M) batch, its capacity that of B rows): vmapped
    naively, every ``lax.cond`` of the rare steps would become a select and run them for
    every snapshot. Vmapped over Locators (batched leaves), the plain rule."""
    return _locate_one_plain(loc, r)


@_locate_one.def_vmap
def _locate_one_vmap(
    axis_size: int, in_batched: list, loc: Locator, r: Array
) -> tuple[LocatorResult, LocatorResult]:
    loc_batched, r_batched = in_batched
    if r_batched and not any(jax.tree.leaves(loc_batched)):
        out = _program(loc, r, loc.capacity_for(axis_size))
    else:
        axes = jax.tree.map(lambda b: 0 if b else None, loc_batched)
        out = jax.vmap(_locate_one_plain, in_axes=(axes, 0 if r_batched else None))(loc, r)
    return out, jax.tree.map(lambda _: True, out)


_coarse = jax.jit(lambda loc, r: loc.stage.coarse(loc, r))
_screen = jax.jit(lambda loc, r, c, cap: loc.stage.screen(loc, r, c, cap), static_argnums=3)
_refine = jax.jit(Locator.refine)


@jax.jit
def _region(loc: Locator, r: Array) -> Answer:
    b = r.shape[0]
    blank = RefineResult(jnp.zeros((b, 3), r.dtype), jnp.zeros(b, r.dtype),
                         jnp.full(b, jnp.inf, r.dtype), jnp.zeros(b, jnp.int32))  # fmt: skip
    return RegionSearch().run(loc, r, Answer(blank.x, blank, jnp.zeros(r.shape, bool)))


class _Certified(NamedTuple):
    screened: Array
    fine: RefineResult
    rescued: Array


@partial(jax.jit, static_argnums=4)
def _certify(loc: Locator, r: Array, screened: Array, fine: RefineResult, capacity: int):
    answer = Answer(screened, fine, jnp.zeros(r.shape, bool))
    start = initial_state(loc, answer, jnp.zeros(r.shape[0], bool), jnp.int32(r.shape[0]))
    state = run_gate(loc, r, start, capacity)
    rescued = (state.status > Status.LOCATED) & (state.status != Status.OVERFLOW)
    return _Certified(state.answer.screened, state.answer.fine, rescued)
