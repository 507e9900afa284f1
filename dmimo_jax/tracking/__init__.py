"""Moving UEs (beyond the paper; its Sec. VII names them future work): motion models,
snapshots along a path, a tracking filter on the carrier phases and its posterior bound.

- :mod:`~dmimo_jax.tracking.motion`: :class:`ConstantVelocity`, :class:`RandomWalk`,
  :func:`simulate_trajectory`, :func:`simulate_track_phases`, :func:`fold`.
- :mod:`~dmimo_jax.tracking.filter`: :class:`Tracker` (iterated EKF with profiled CPOs, a
  windowed lock test), :mod:`~dmimo_jax.tracking.reacquire` (the lattice re-acquisition) and
  :mod:`~dmimo_jax.tracking.run` (:func:`run_tracker`: many UEs over time).
- :mod:`~dmimo_jax.tracking.paths`: :func:`most_likely_path`, the Viterbi choice of one
  candidate position per snapshot along a trajectory (e.g. among the lobes of
  :func:`dmimo_jax.estimators.coherent_peaks`).
- :mod:`~dmimo_jax.tracking.bound`: :func:`pcrb`, the posterior Cramér-Rao bound of the
  state, from the same position FIM as :func:`dmimo_jax.peb`.
"""

from dmimo_jax.tracking.bound import pcrb, pcrb_position_rmse
from dmimo_jax.tracking.filter import TrackerSettings, TrackOutput, TrackState
from dmimo_jax.tracking.motion import (
    ConstantVelocity,
    RandomWalk,
    Trajectory,
    fold,
    simulate_track_phases,
    simulate_trajectory,
)
from dmimo_jax.tracking.paths import PathResult, most_likely_path
from dmimo_jax.tracking.run import medoid_start, run_tracker

# isort: split
# At the top of the package (their home is `dmimo_jax`, e.g. `dj.Tracker`): kept here so the
# older paths keep working; they are not in this module's __all__.
from dmimo_jax.tracking.filter import Tracker  # noqa: F401

__all__ = [
    "TrackerSettings",
    "ConstantVelocity",
    "RandomWalk",
    "Trajectory",
    "fold",
    "simulate_trajectory",
    "simulate_track_phases",
    "TrackState",
    "TrackOutput",
    "run_tracker",
    "medoid_start",
    "PathResult",
    "most_likely_path",
    "pcrb",
    "pcrb_position_rmse",
]
