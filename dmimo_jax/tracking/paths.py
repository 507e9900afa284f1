r"""The most likely path through per-snapshot candidates (beyond the paper).

A snapshot that leaves its position ambiguous among a few lobes (the local maxima of a grid
search, :func:`dmimo_jax.estimators.coherent_peaks`) is often settled by its neighbours in
time: a moving UE's consecutive positions are close, a wrong lobe at one snapshot is rarely
the same wrong lobe at the next. This is a hidden Markov model over the candidate index
:math:`k_i` of snapshot :math:`i` (time :math:`t_i`), solved exactly by the Viterbi
recursion:

.. math:: \log p(k_i \mid k_{i-1}) = \log\Big[(1-\varepsilon)\,
          \mathcal N_2\big(\mathbf x_{i,k_i} - \mathbf x_{i-1,k_{i-1}};\,
          \mathbf 0,\, \sigma^2 (t_i - t_{i-1})\,\mathbf I_2\big) + \frac{\varepsilon}{A}\Big],
          \qquad \log p(\text{snapshot } i \mid k_i) = \kappa\, s_{i,k_i},

a random walk of diffusion :math:`\sigma^2` per unit time in the horizontal plane, with
probability :math:`\varepsilon` of a jump anywhere in an area :math:`A` (a UE that was not
seen for a while, a snapshot that is an outlier), and an emission that trusts the candidate's
score :math:`s` (e.g. the coherence in [0, 1]) with weight :math:`\kappa`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_scalar

__all__ = ["PathResult", "most_likely_path"]


class PathResult(NamedTuple):
    """The chosen candidate per snapshot: positions (N, 3), indices (N,) into K, and the
    path's joint log-probability (the module docstring's sum, no constant dropped)."""

    x: Array
    index: Array
    log_prob: Array


def most_likely_path(
    candidates: ArrayLike,
    scores: ArrayLike,
    times: ArrayLike,
    *,
    step_std: float,
    jump_probability: float,
    area: float,
    score_weight: float,
) -> PathResult:
    r"""The jointly most probable choice of one candidate per snapshot (module docstring).

    Args:
        candidates: (N, K, 3) candidate positions per snapshot, in time order, m.
        scores: (N, K) their scores (finite, or ``-inf`` for a missing candidate: never
            chosen).
        times: (N,) strictly increasing snapshot times (any unit: ``step_std`` is per
            square root of it).
        step_std: :math:`\sigma`, horizontal step standard deviation per square root of a
            time unit, m.
        jump_probability: :math:`\varepsilon` in (0, 1).
        area: :math:`A`, the area a jump lands in, m^2 (e.g. the search area's).
        score_weight: :math:`\kappa` >= 0 (0: the path that moves least).

    Returns:
        :class:`PathResult`.

    Raises:
        ValueError: shapes that do not match, non-finite positions or times, times not
            strictly increasing, a NaN or ``+inf`` score, a snapshot without a finite score,
            parameters out of range.
    """
    x = np.asarray(candidates, float)
    s = np.asarray(scores, float)
    t = np.asarray(times, float)
    if x.ndim != 3 or x.shape[2] != 3 or x.shape[0] < 1:
        raise ValueError(f"candidates must have shape (N, K, 3), got {x.shape}")
    if s.shape != x.shape[:2]:
        raise ValueError(f"scores must have shape {x.shape[:2]} (N, K), got {s.shape}")
    if t.shape != x.shape[:1]:
        raise ValueError(f"times must have shape ({x.shape[0]},), got {t.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("candidates must be finite")
    if np.any(np.isnan(s)) or np.any(s == np.inf) or not np.all(np.any(np.isfinite(s), axis=1)):
        raise ValueError("scores must be finite or -inf, with a finite score in every snapshot")
    if not np.all(np.isfinite(t)) or np.any(np.diff(t) <= 0):
        raise ValueError("times must be finite and strictly increasing")
    check_scalar("step_std", step_std, positive=True)
    check_scalar("area", area, positive=True)
    check_scalar("score_weight", score_weight)
    if score_weight < 0:
        raise ValueError(f"score_weight must be >= 0, got {score_weight}")
    if not 0.0 < jump_probability < 1.0:
        raise ValueError(f"jump_probability must be in (0, 1), got {jump_probability}")
    finite = np.isfinite(s)  # a missing candidate stays -inf whatever the weight (0 x -inf)
    dt = np.diff(t, prepend=t[0])
    log_jump = np.log(jump_probability / area)
    index, log_prob = _viterbi(
        jnp.asarray(x),
        jnp.asarray(np.where(finite, score_weight * np.where(finite, s, 0.0), -np.inf)),
        jnp.asarray(dt),
        step_std**2,
        np.log1p(-jump_probability),
        log_jump,
    )
    chosen = jnp.take_along_axis(jnp.asarray(x), index[:, None, None], 1)[:, 0]
    return PathResult(chosen, index, log_prob)


@jax.jit
def _viterbi(x: Array, emission: Array, dt: Array, var: Array, log_stay: Array, log_jump: Array):
    def transition(prev: Array, cur: Array, step: Array) -> Array:  # (K_cur, K_prev)
        d2 = jnp.sum((cur[:, None, :2] - prev[None, :, :2]) ** 2, axis=-1)
        v = var * step
        walk = log_stay - d2 / (2 * v) - jnp.log(2 * jnp.pi * v)
        return jnp.logaddexp(walk, log_jump)

    def forward(carry, inputs):
        best, prev = carry
        cur, em, step = inputs
        total = best[None, :] + transition(prev, cur, step)
        back = jnp.argmax(total, axis=1)
        return (jnp.max(total, axis=1) + em, cur), back

    (last, _), back = jax.lax.scan(forward, (emission[0], x[0]), (x[1:], emission[1:], dt[1:]))

    def backward(k, pointers):
        return pointers[k], k

    k_last = jnp.argmax(last)
    k_first, path = jax.lax.scan(backward, k_last, back, reverse=True)
    return jnp.concatenate([k_first[None], path]), jnp.max(last)
