r"""Self-training the residual field on unlabeled trajectories (beyond the paper).

:func:`~dmimo_jax.calibration.fit_residual_field` learns what the physics misses from the L
labeled snapshots alone; on measured data its error field decorrelates within about half a
wavelength, so 50 random labels in a 1.25 m patch leave most of the patch unlearned and the
search lands on a wrong lobe of the array's likelihood for 15-30% of the snapshots
(docs/real_data_measurements.md). A deployment also sees unlabeled snapshots, and a moving UE's
snapshots come in time order. Self-training uses both: locate the unlabeled snapshots under
the current model, keep as pseudo-labels those whose estimate a neighbour in time confirms,
condition the field on labels and pseudo-labels, and repeat.

A snapshot :math:`i` (time index :math:`t_i`, estimate :math:`\hat{\mathbf x}_i`) is kept
when some :math:`j` with

.. math:: |t_i - t_j| \le \Delta t_{\max}, \qquad
          \|\hat{\mathbf x}_i - \hat{\mathbf x}_j\|_{xy} < s_{\max}, \qquad
          \Big|\tfrac1M \sum_m e^{j(r_{im} - r_{jm})}\Big| \le c_{\max}

(:func:`confirmed_by_neighbours`; :math:`j` the snapshot just before or just after :math:`i`).
Two snapshots of a UE that moved between them see different phases, and a wrong lobe under
one is rarely a wrong lobe at the same place under the other; the last condition drops pairs
that did not move (a still UE's copies agree whatever their lobe). The search is
:func:`~dmimo_jax.estimators.coherent_search` (expected phasors, amplitude weights), the
field :func:`~dmimo_jax.calibration.fit_residual_field` with its defaults; the physical
model (e.g. LoS + offsets fitted on the labels) stays fixed.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import numpy as np
from jax.typing import ArrayLike
from tqdm.auto import tqdm

from dmimo_jax._checks import check_int, check_phases, check_positions, check_scalar
from dmimo_jax.calibration.residual import (
    RESIDUAL_LENGTH_SCALE,
    RESIDUAL_NOISE,
    ResidualFieldModel,
    fit_residual_field,
)
from dmimo_jax.estimators import Grid, coherent_search
from dmimo_jax.physics import PhaseModel, as_phase_model


class SelfTraining(NamedTuple):
    """The result of :func:`self_train_field`.

    Attributes:
        model: the field conditioned on the labels and the last round's pseudo-labels.
        x_unlabeled: (N, 3) the unlabeled snapshots' positions under the last round's model
            (the search the pseudo-labels were drawn from, one round behind ``model``).
        pseudo_labels: (N,) bool, the snapshots ``model`` was conditioned on.
        num_pseudo_labels: (rounds,) how many were kept in each round.
    """

    model: ResidualFieldModel
    x_unlabeled: np.ndarray
    pseudo_labels: np.ndarray
    num_pseudo_labels: np.ndarray


def confirmed_by_neighbours(
    x: ArrayLike,
    r: ArrayLike,
    time_index: ArrayLike,
    *,
    max_step: float = 0.15,
    max_gap: int = 3,
    max_coherence: float = 0.9,
) -> np.ndarray:
    r"""(N,) bool: the estimates a neighbour in time confirms (module docstring's three
    conditions, horizontal distance), for snapshots in time order.

    Args:
        x: (N, 3) estimated positions, m.
        r: (N, M) their phases, rad.
        time_index: (N,) strictly increasing integer times (e.g. cycle numbers).
        max_step: :math:`s_{\max}`, m.
        max_gap: :math:`\Delta t_{\max}`, in units of ``time_index``.
        max_coherence: :math:`c_{\max}` in (0, 1]; 1 keeps still pairs too.

    Raises:
        ValueError: shapes that disagree, non-finite values, ``time_index`` not strictly
            increasing integers, settings out of range.
    """
    x, r = np.asarray(x, float), np.asarray(r, float)
    check_positions("x", x, batched=True)
    check_phases("r", r, r.shape[-1] if r.ndim else 0, batched=True)
    if r.shape[0] != x.shape[0]:
        raise ValueError(f"r must hold the N = {x.shape[0]} snapshots of x, got {r.shape[0]}")
    t = _check_times(time_index, x.shape[0])
    _check_neighbour_settings(max_step, max_gap, max_coherence)
    if x.shape[0] == 0:
        return np.zeros(0, bool)
    return _confirmed(x, r, t, max_step, max_gap, max_coherence)


def _check_neighbour_settings(max_step, max_gap, max_coherence) -> None:
    check_scalar("max_step", max_step, positive=True)
    check_int("max_gap", max_gap, minimum=1)
    check_scalar("max_coherence", max_coherence, positive=True)
    if max_coherence > 1:
        raise ValueError(f"max_coherence must be in (0, 1], got {max_coherence}")


def _confirmed(x, r, t, max_step, max_gap, max_coherence) -> np.ndarray:
    """:func:`confirmed_by_neighbours` without its checks."""
    step = np.linalg.norm(np.diff(x[:, :2], axis=0), axis=1)
    coherence = np.abs(np.mean(np.exp(1j * (r[1:] - r[:-1])), axis=1))
    good = (np.diff(t) <= max_gap) & (step < max_step) & (coherence <= max_coherence)
    return np.r_[False, good] | np.r_[good, False]


def self_train_field(
    model: PhaseModel,
    grid: Grid,
    x: ArrayLike,
    r: ArrayLike,
    r_unlabeled: ArrayLike,
    time_index: ArrayLike,
    *,
    amplitudes: ArrayLike | None = None,
    rounds: int = 6,
    max_step: float = 0.15,
    max_gap: int = 3,
    max_coherence: float = 0.9,
    length_scale: float = RESIDUAL_LENGTH_SCALE,
    noise: float = RESIDUAL_NOISE,
    progress: bool = False,
) -> SelfTraining:
    """Condition the residual field on the labels and on confirmed pseudo-labels, ``rounds``
    times (module docstring).

    Args:
        model: the physical PhaseModel (fixed; its field is relearned every round).
        grid: where the unlabeled snapshots are searched (``estimators.make_grid``).
        x: (L, 3) labeled positions, m.
        r: (L, M) their phases.
        r_unlabeled: (N, M) the unlabeled snapshots' phases, in time order.
        time_index: (N,) their strictly increasing integer times.
        amplitudes: (N, M) the unlabeled snapshots' amplitude weights, or None (equal).
        rounds: search-and-refit rounds, >= 1.
        max_step: :func:`confirmed_by_neighbours`.
        max_gap: see ``max_step``.
        max_coherence: see ``max_step``.
        length_scale: :func:`fit_residual_field`.
        noise: see ``length_scale``.
        progress: a tqdm bar over the rounds (in a terminal only).

    Raises:
        ValueError: bad shapes or values (as :func:`fit_residual_field`,
            :func:`confirmed_by_neighbours` and ``coherent_search``), ``rounds`` < 1.
    """
    model = as_phase_model(model)
    check_phases("r_unlabeled", r_unlabeled, model.num_aps, batched=True)
    r_unlabeled = np.asarray(r_unlabeled, float)
    if r_unlabeled.shape[0] == 0:
        raise ValueError(
            "r_unlabeled must hold at least one snapshot (self-training relearns the field "
            "from them); use fit_residual_field for the labeled snapshots alone"
        )
    t = _check_times(time_index, r_unlabeled.shape[0])
    check_int("rounds", rounds, minimum=1)
    _check_neighbour_settings(max_step, max_gap, max_coherence)
    x, r = np.asarray(x, float), np.asarray(r, float)
    settings = {"length_scale": length_scale, "noise": noise}
    labels = np.ones(len(x), bool)
    r_all = np.concatenate([r, r_unlabeled])
    # every round's field holds all L + N snapshots, the unconfirmed masked out: one shape,
    # so the fit and the search compile once, not once per round
    x_all = np.concatenate([x, np.repeat(x[:1], len(r_unlabeled), 0)])
    keep = np.zeros(len(r_unlabeled), bool)
    counts = []
    for _ in tqdm(range(rounds), desc="self-training", disable=None if progress else True):
        field = fit_residual_field(model, x_all, r_all, mask=np.r_[labels, keep], **settings)
        xe = np.asarray(coherent_search(field, grid, r_unlabeled, amplitudes).x)
        keep = _confirmed(xe, r_unlabeled, t, max_step, max_gap, max_coherence)
        counts.append(int(keep.sum()))
        x_all = np.concatenate([x, xe])
    # the last round's field, holding the conditioned snapshots only
    field = fit_residual_field(
        model, np.concatenate([x, xe[keep]]), np.concatenate([r, r_unlabeled[keep]]), **settings
    )
    return SelfTraining(jax.block_until_ready(field), xe, keep, np.asarray(counts))


def _check_times(time_index: ArrayLike, n: int) -> np.ndarray:
    t = np.asarray(time_index)
    if t.shape != (n,) or not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"time_index must be ({n},) integers, got {t.shape} {t.dtype}")
    if np.any(np.diff(t) <= 0):
        raise ValueError("time_index must be strictly increasing (snapshots in time order)")
    return t
