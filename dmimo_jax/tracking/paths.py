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

Snapshots whose position is known (labeled ones taken along the same trajectory) enter as
*anchors*: a step of the path with that one position and no emission term, so that the
walk must pass through them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_scalar


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
    anchors: ArrayLike | None = None,
    anchor_times: ArrayLike | None = None,
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
        anchors: optional (A, 3) known positions the path passes through (module
            docstring), taken at ``anchor_times`` (A,), each different from every time in
            ``times`` and from the other anchors' (any order).

    Returns:
        :class:`PathResult` for the N snapshots (the anchors are not in ``x`` or
        ``index``; their transitions are in ``log_prob``).

    Raises:
        ValueError: shapes that do not match, non-finite positions or times, times not
            strictly increasing, a NaN or ``+inf`` score, a snapshot without a finite score,
            parameters out of range, anchors without times (or the reverse), anchors that
            are not finite or share a time with a snapshot or another anchor.
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
    emission = np.where(finite, score_weight * np.where(finite, s, 0.0), -np.inf)
    x, emission, t, rows = _with_anchors(x, emission, t, anchors, anchor_times)
    dt = np.diff(t, prepend=t[0])
    log_jump = np.log(jump_probability / area)
    index, log_prob = _viterbi(
        jnp.asarray(x),
        jnp.asarray(emission),
        jnp.asarray(dt),
        step_std**2,
        np.log1p(-jump_probability),
        log_jump,
    )
    index = index[rows]
    chosen = jnp.take_along_axis(jnp.asarray(x[rows]), index[:, None, None], 1)[:, 0]
    return PathResult(chosen, index, log_prob)


def _with_anchors(
    x: np.ndarray, emission: np.ndarray, t: np.ndarray, anchors: Any, anchor_times: Any
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The snapshots and the anchors in one time order: each anchor a step whose only
    finite candidate (emission 0) is its position; and the rows of the N snapshots."""
    n = len(t)
    if anchors is None and anchor_times is None:
        return x, emission, t, np.arange(n)
    if anchors is None or anchor_times is None:
        raise ValueError("anchors and anchor_times go together: give both or neither")
    a = np.asarray(anchors, float)
    ta = np.asarray(anchor_times, float)
    if a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"anchors must have shape (A, 3), got {a.shape}")
    if ta.shape != a.shape[:1]:
        raise ValueError(f"anchor_times must have shape ({a.shape[0]},), got {ta.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(ta))):
        raise ValueError("anchors and anchor_times must be finite")
    k = x.shape[1]
    all_t = np.concatenate([t, ta])
    order = np.argsort(all_t, kind="stable")
    if np.any(np.diff(all_t[order]) <= 0):
        raise ValueError("anchor_times must differ from times and from each other")
    ax = np.repeat(a[:, None, :], k, axis=1)
    ae = np.full((len(a), k), -np.inf)
    ae[:, 0] = 0.0
    rows = np.argsort(order)[:n]  # where each snapshot lands in the merged order
    return (
        np.concatenate([x, ax])[order],
        np.concatenate([emission, ae])[order],
        all_t[order],
        rows,
    )


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
