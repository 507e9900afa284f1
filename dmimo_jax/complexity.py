r"""FLOP counts: the paper's formulas (Sec. V) and what XLA reports for the compiled code.

XLA's ``cost_analysis`` counts a loop body once, so the searches are compiled here as a
single chunk (nothing is allocated: inputs are ``jax.ShapeDtypeStruct``) to count the
whole grid. ``None`` means XLA reported no count.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from dmimo_jax.estimators import grid as _grid
from dmimo_jax.estimators import search as _search
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.scene import Scene

__all__ = [
    "EGS_FLOPS_PER_POINT_AP",
    "MLP_FLOPS_PAPER",
    "egs_flops_paper",
    "egs_flops_xla",
    "hi_flops_paper",
    "mlp_flops",
    "network_flops_xla",
    "popt_flops",
]

EGS_FLOPS_PER_POINT_AP = 57
"""The paper's B: FLOPs per grid point and AP of the EGS (predict the phase, estimate the
CPO, the cost)."""


def egs_flops_paper(num_aps: int, volume: float, spacing: float) -> float:
    r""":math:`\mathcal F_{\mathrm{EGS}} \approx B M V/\delta^3` per snapshot, B = 57 (Sec. V-B)."""
    return EGS_FLOPS_PER_POINT_AP * num_aps * volume / spacing**3


def egs_flops_xla(
    model: PhaseModel | Scene,
    grid: _grid.Grid,
    *,
    batch: int = 1,
    method: str = "table",
    num_candidates: int = 64,
) -> float | None:
    """XLA's FLOP count per snapshot for one :func:`~dmimo_jax.estimators.egs` over ``grid``.

    Args:
        model: PhaseModel or Scene.
        grid: the search grid.
        batch: snapshots per call (the table-free model phases are shared across a batch).
        method: ``"table"`` (phasor table screen + re-rank) or ``"plain"`` (table-free).
        num_candidates: re-ranked points per snapshot (``"table"``).
    """
    model = as_phase_model(model)
    r = jax.ShapeDtypeStruct((batch, model.num_aps), grid.low.dtype)
    if method == "plain":
        lowered = _search.egs_scan.lower(r, model, grid, grid.size, None)
    elif method == "table":
        data = jax.ShapeDtypeStruct((grid.size, 2 * model.num_aps), jnp.float32)
        table = _grid.PhasorTable(data, grid, grid.size, 1, None)
        lowered = _search.egs_table_search.lower(r, model, table, min(num_candidates, grid.size))
    else:
        raise ValueError(f"method must be 'table' or 'plain', got {method!r}")
    cost = lowered.compile().cost_analysis()
    if isinstance(cost, list):  # older jax: one dict per computation
        cost = cost[0] if cost else None
    flops = None if not cost else cost.get("flops")
    return None if flops is None or flops <= 0 else float(flops) / batch


MLP_FLOPS_PAPER = 1.38e6
"""FLOPs of the paper's benchmark MLP per snapshot (Sec. V-C)."""


def popt_flops(num_aps: int, config: Any) -> float:
    r"""Eq. (29): :math:`2 N_{\mathrm{enc}} D_{\mathrm{emb}}(2M^2 + 4 M D_{\mathrm{emb}} + 2 M D_{\mathrm{ff}})`.

    The encoder only (the paper neglects preprocessing and the head): 81.1 M at M = 17
    and the paper's configuration.
    """
    m, d = num_aps, config.d_emb
    return 2.0 * config.n_enc * d * (2 * m**2 + 4 * m * d + 2 * m * config.d_ff)


def mlp_flops(widths: Any) -> float:
    """Dense layers ``widths[0] -> widths[1] -> ...``: 2 a b per layer (biases, activations
    neglected, as in Sec. V)."""
    w = list(widths)
    return float(sum(2 * a * b for a, b in zip(w[:-1], w[1:], strict=False)))


def hi_flops_paper(num_aps: int, num_classes: int) -> float:
    r""":math:`\mathcal F_{\mathrm{HI}} \approx 7.5\cdot10^4 M + 256 Q + 1.92\cdot10^5` (Sec. V-C)."""
    return 7.5e4 * num_aps + 256 * num_classes + 1.92e5


def network_flops_xla(apply: Any, state: Any, num_aps: int, *, batch: int = 1) -> float | None:
    """XLA's FLOP count per snapshot of ``apply(state, r)`` for a (batch, M) float32 input."""
    r = jax.ShapeDtypeStruct((batch, num_aps), jnp.float32)
    cost = jax.jit(apply).lower(state, r).compile().cost_analysis()
    if isinstance(cost, list):
        cost = cost[0] if cost else None
    flops = None if not cost else cost.get("flops")
    return None if flops is None or flops <= 0 else float(flops) / batch
