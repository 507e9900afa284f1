"""The exact MLE as one XLA program: certified table EGS (eq. 18) + refinement (eq. 17) + the
cost gate's dense recheck, with the rare rows on a fixed capacity.

:func:`exact_mle` is the checked call, :func:`mle_program` the traced core: the baseline the
learned :class:`~dmimo_jax.pipeline.Locator` is compared with runs as one program too, so
it is as fair on a GPU (no host round trip between the screen, its certificate's
fallbacks and the refinement) as on a CPU.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import as_snapshot_batch, check_int, check_scalar, check_table_aps
from dmimo_jax.estimators.grid import PhasorTable
from dmimo_jax.estimators.mle import check_num_steps, refine_batch_unchecked
from dmimo_jax.estimators.rows import capacity_for, on_rows
from dmimo_jax.estimators.search import egs_scan, egs_table_search
from dmimo_jax.estimators.window import gate_recheck, window_offsets
from dmimo_jax.physics import PhaseModel, as_phase_model


class MLEResult(NamedTuple):
    """Output of :func:`exact_mle` (leading batch axis B)."""

    x: Array
    """(B, 3) refined maximum-likelihood position, m."""
    cost: Array
    """(B,) its ML cost (eq. 17)."""
    cpo: Array
    """(B,) CPO estimate at x."""
    coarse: Array
    """(B, 3) the EGS arg-min (eq. 18) on the table's grid."""
    screened: Array
    """(B,) bool: the table screen certified the arg-min (no full scan)."""
    rejected: Array
    """(B,) bool: the answer fails the cost gate (or is not finite)."""
    overflow: Array
    """(B,) bool: a certificate fallback did not fit the capacity."""


def mle_program(
    r: Array,
    model: PhaseModel,
    table: PhasorTable,
    offsets: Array,
    low: Array,
    high: Array,
    capacity: int,
    num_candidates: int = 64,
    widen: int = 16,
    num_steps: int = 25,
    gate: float | None = 100.0,
    recheck_fraction: float = 0.05,
) -> MLEResult:
    """:func:`exact_mle`'s traced core, unchecked (``capacity`` and the settings static).

    ``offsets``, ``low``, ``high``: the gate's dense window
    (:func:`~dmimo_jax.estimators.window.dense_recheck`)."""
    k = min(num_candidates, table.grid.size)
    res = egs_table_search(r, model, table, k)
    lost = jnp.zeros(r.shape[0], bool)
    if widen > 1:  # certificate failed: a wider screen for those snapshots
        wide = min(widen * k, table.grid.size)
        res, lost = on_rows(
            ~res.screened, capacity, lambda ri: egs_table_search(ri, model, table, wide), res, r
        )

    def scan(ri: Array) -> tuple:  # still uncertified: the exact table-free scan
        chunk = int(np.clip(2**23 // (ri.shape[0] * model.num_aps), 64, 8192))
        out = egs_scan(ri, model, table.grid, min(chunk, table.grid.size), table.mesh)
        return out._replace(screened=jnp.zeros(ri.shape[0], bool))

    res, lost_scan = on_rows(~res.screened & ~lost, capacity, scan, res, r)
    fine = refine_batch_unchecked(res.x, r, model, num_steps)
    if gate is None:
        rejected = ~jnp.isfinite(fine.cost)
    else:
        fine, rejected = gate_recheck(r, model, fine, gate, offsets, low, high, recheck_fraction)
    return MLEResult(fine.x, fine.cost, fine.cpo, res.x, res.screened, rejected, lost | lost_scan)


_mle_program = jax.jit(mle_program, static_argnums=(6, 7, 8, 9, 10, 11))


def exact_mle(
    r: ArrayLike,
    model: PhaseModel,
    table: PhasorTable,
    *,
    num_candidates: int = 64,
    widen: int = 16,
    num_steps: int = 25,
    gate: float | None = 100.0,
    recheck_fraction: float = 0.05,
    capacity: float = 1 / 16,
) -> MLEResult:
    """The exact MLE of (M,) or (B, M) snapshots as one program: :func:`egs` on ``table``
    (certified screen, the wider screen and the table-free scan where the certificate
    fails), :func:`refine_batch` (``num_steps``), and the cost gate's dense recheck
    (:func:`recheck_costly`'s rule: at most ``recheck_fraction`` of the batch). The
    certificate's fallbacks run on ``ceil(capacity * B)`` rows (at least 8) per program;
    rows beyond it are run again here.

    Args:
        r: wrapped phases.
        model: the PhaseModel ``table`` was built from.
        table: its :class:`PhasorTable` (the search grid).

    Raises:
        ValueError: bad snapshots or settings, or a table of another AP count.
    """
    model = as_phase_model(model)
    single = np.ndim(r) == 1
    r = as_snapshot_batch("r", r, model.num_aps, table.grid.low.dtype)
    check_table_aps(table, model)
    check_int("num_candidates", num_candidates, minimum=1)
    check_int("widen", widen, minimum=1)
    check_num_steps(num_steps)
    if gate is not None:
        check_scalar("gate", gate, positive=True)
    for name, v in (("recheck_fraction", recheck_fraction), ("capacity", capacity)):
        check_scalar(name, v)
        if not 0 <= v <= 1:
            raise ValueError(f"{name} must be a fraction of the batch in [0, 1], got {v}")
    lam = float(model.scene.wavelength)
    low = jnp.asarray(model.scene.ue_low) - 0.25
    high = jnp.asarray(model.scene.ue_high) + 0.25
    radius = min(lam / 4, float(jnp.max(high - low)))
    offsets = jnp.asarray(window_offsets(radius, lam / 16), r.dtype)
    settings = (num_candidates, widen, num_steps, gate, recheck_fraction)
    batch = r.shape[0]
    if batch == 0:
        raise ValueError("r must hold at least one snapshot")
    cap = capacity_for(batch, capacity)
    out = _mle_program(r, model, table, offsets, low, high, cap, *settings)
    rows = np.flatnonzero(np.asarray(out.overflow))
    if rows.size:  # every rare row fits a program of its own size
        again = _mle_program(r[rows], model, table, offsets, low, high, rows.size, *settings)
        out = jax.tree.map(lambda a, b: a.at[rows].set(b), out, again)
    return jax.tree.map(lambda a: a[0], out) if single else out
