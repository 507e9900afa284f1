r"""Re-acquisition of a track (beyond the paper): the likelihood of one snapshot is a comb of
maxima about :math:`\lambda/2` apart, which the filter resolves only while its prior is
narrower than that. When it is not (:func:`needs_reacquisition`: at the start, after an
outage, or when the lock test fails), the next ``window`` snapshots are scored jointly on a
lattice of half-width ``reacquire_radius`` around the track (:func:`lattice_costs`, the
positions of older snapshots moved back along the estimated velocity), and the filter
restarts at the best lattice point (:func:`reacquire`): ``window`` snapshots resolve the
lobes where one cannot.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
from jax import Array

from dmimo_jax.estimators.search import egs_table_search
from dmimo_jax.likelihood import compressed_residuals
from dmimo_jax.pytree import map_in_chunks

if TYPE_CHECKING:
    from dmimo_jax.tracking.filter import Tracker, TrackState


def needs_reacquisition(tracker: Tracker, state: TrackState) -> Array:
    """() bool: the lock test failed, or a window of snapshots arrived since the prior
    stopped resolving the comb."""
    return state.lost | (state.pending & (state.since_pending >= tracker.settings.window))


def window_costs(
    tracker: Tracker,
    state: TrackState,
    positions: Array,
    velocity: Array,
    newest: int | None = None,
) -> Array:
    r"""Joint ML cost (eq. 17) of the buffered snapshots for candidate current positions
    (G, 3) of the free path: each older snapshot is scored at the candidate moved back
    along ``velocity`` (3,) by its age, folded into the region; the weights :math:`1/\sigma_m^2`
    are the model's at the track. (G,).

    ``newest``: score only the newest ``newest`` snapshots of the buffer (static; default
    all). Every snapshot's term is >= 0, so such a cost is a lower bound of the whole
    window's (the screen of :func:`reacquire`)."""
    rows = slice(None) if newest is None else slice(tracker.settings.window - newest, None)
    age, r, valid = state.recent_age[rows], state.recent_r[rows], state.recent_valid[rows]
    var = tracker.model.variance(tracker.motion.fold(state.mean[:3])[0])
    past = positions[:, None, :] - age[None, :, None] * velocity[None, None, :]
    past, _ = tracker.motion.fold(past)  # the free path folded into the region
    theta = jax.vmap(jax.vmap(tracker.model.mean))(past)  # (G, K, M)
    res = compressed_residuals(r[None], theta, jnp.broadcast_to(var, theta.shape))
    cost = jnp.sum(res**2 / var[None, None, :], axis=-1)  # (G, K)
    return jnp.sum(jnp.where(valid[None, :], cost, 0.0), axis=-1)


def lattice_costs(
    tracker: Tracker,
    state: TrackState,
    candidates: Array,
    velocities: Array,
    prior: Array,
    newest: int | None = None,
) -> Array:
    """(V, G) :func:`window_costs` of every candidate (G, 3) for every velocity (V, 3), plus
    ``prior`` (G,); ``newest`` as in :func:`window_costs` (the screen's lower bounds). The
    candidates are scored at most ``tracker.settings.lattice_chunk`` at a time (a loop over
    chunks: the memory of one chunk, whatever the lattice's size), in chunks of one size
    (:func:`~dmimo_jax.pytree.map_in_chunks`: one loop body, no second copy of the scoring
    for a remainder)."""

    def cost(p: Array) -> Array:  # (3,) -> (V,)
        return jax.vmap(lambda v: window_costs(tracker, state, p[None], v, newest)[0])(velocities)

    return map_in_chunks(cost, candidates, tracker.settings.lattice_chunk).T + prior[None, :]


def lattice_argmin(
    tracker: Tracker, state: TrackState, candidates: Array, velocities: Array, prior: Array
) -> tuple[Array, Array]:
    r"""The (velocity, candidate) pair of least window cost plus ``prior`` (G,) over
    ``candidates`` (G, 3) and ``velocities`` (V, 3): ``(which velocity, which candidate)``.

    A certified screen, exact like the EGS of eq. (18): every pair is first scored on the
    newest ``tracker.settings.screen_snapshots`` snapshots (a lower bound of its whole cost); the
    ``tracker.settings.screen_size`` lowest bounds are scored on the whole window. If the best of
    those costs no more than the least bound left out, no pair left out can beat it and it
    is the argmin; otherwise (a ``lax.cond``: under ``jax.vmap`` both branches run) every
    pair is scored on the whole window.
    """
    num = candidates.shape[0]
    args = (tracker, state, candidates, velocities, prior)
    bound = lattice_costs(*args, tracker.settings.screen_snapshots).reshape(-1)
    size = min(tracker.settings.screen_size, bound.shape[0])
    neg_bound, kept = jax.lax.top_k(-bound, size)
    which, point = kept // num, kept % num
    full = jax.vmap(lambda p, v: window_costs(tracker, state, p[None], v)[0])(
        candidates[point], velocities[which]
    )
    full = full + prior[point]
    screened = kept[jnp.argmin(full)]
    # the least bound left out: the size-th lowest (none when nothing was left out)
    left_out = -neg_bound[-1] if size < bound.shape[0] else jnp.inf

    def whole_lattice() -> Array:
        return jnp.argmin(lattice_costs(*args).reshape(-1)).astype(screened.dtype)

    flat = jax.lax.cond(jnp.min(full) <= left_out, lambda: screened, whole_lattice)
    return flat // num, flat % num


def _velocity(mean: Array) -> Array:
    return mean[3:6] if mean.shape[0] == 6 else jnp.zeros(3, mean.dtype)


def reacquire(tracker: Tracker, state: TrackState) -> TrackState:
    """Re-acquire the track if one is due (:func:`needs_reacquisition`): the best point of
    the lattice around the prior (module docstring) by the window's ML cost plus the
    prior's. If the filter already sits within one lattice spacing of it, the filter's
    state is kept; otherwise the track restarts there with a position variance of
    ``spacing**2 / 12`` per axis (the lattice's quantization), the velocity that scored best
    and no position-velocity correlation. The lattice is searched by :func:`lattice_argmin`."""
    due = needs_reacquisition(tracker, state)
    # a pending acquisition weighs the prediction since the prior stopped resolving the
    # comb; a lost track's own prior sits on the wrong maximum and is dropped
    lost = state.lost
    center = jnp.where(lost, state.mean[:3], state.prior_mean[:3])
    if tracker.table is not None:
        # re-acquisitions that keep failing: the lattice sits on a wrong maximum far from
        # the UE; re-centre it on the medoid of the window's global table searches
        far = state.failures >= tracker.settings.global_after
        center = jax.lax.cond(far, partial(global_center, tracker), lambda s: center, state)
        lost = lost | far
    # two velocities to move the older snapshots with: the filter's (it has seen the
    # window, and the maxima of the comb move with the UE) and the prior's (the filter may
    # have been dragged by a wrong maximum); the window decides
    velocities = jnp.stack([_velocity(state.mean), _velocity(state.prior_mean)])
    precision = jnp.where(lost, 0.0, jnp.linalg.inv(state.prior_cov[:3, :3]))
    prior = jnp.einsum("gi,ij,gj->g", tracker.offsets, precision, tracker.offsets)
    candidates = center[None, :] + tracker.offsets
    which, point = lattice_argmin(tracker, state, candidates, velocities, prior)
    best, velocity = candidates[point], velocities[which]
    keep = jnp.max(jnp.abs(state.mean[:3] - best)) <= tracker.settings.reacquire_spacing
    pos_var = tracker.settings.reacquire_spacing**2 / 12
    cov = state.cov.at[:3, :].set(0.0).at[:, :3].set(0.0)
    cov = cov.at[jnp.arange(3), jnp.arange(3)].set(pos_var)
    mean = state.mean.at[:3].set(best).at[3:6].set(velocity[: state.mean.shape[0] - 3])
    restarted = state._replace(
        mean=jnp.where(keep, state.mean, mean),
        cov=jnp.where(keep, state.cov, cov),
        prior_mean=jnp.where(keep, state.mean, mean),
        prior_cov=jnp.where(keep, state.cov, cov),
        nis_valid=jnp.zeros_like(state.nis_valid),
        pending=jnp.asarray(False),
        since_pending=jnp.zeros_like(state.since_pending),
        lost=jnp.asarray(False),
        reacquired=~keep,
        num_reacquisitions=state.num_reacquisitions + (~keep).astype(jnp.int32),
        locked=jnp.asarray(False),
        failures=state.failures + 1,
    )
    return jax.tree.map(lambda new, old: jnp.where(due, new, old), restarted, state)


def global_center(tracker: Tracker, state: TrackState) -> Array:
    """(3,) the medoid of the window's single-snapshot table searches over the whole table
    (:func:`~dmimo_jax.estimators.search.egs_table_search`, no prior): a few snapshots in the main
    lobe out of the window put it there, wherever the track was."""
    est = egs_table_search(state.recent_r, tracker.model, tracker.table, 16).x  # (K, 3)
    return medoid(est, state.recent_valid)


def medoid(x: Array, valid: Array) -> Array:
    """The estimate (..., K, 3) with the least summed distance to the other valid ones,
    among the ``valid`` (..., K) ones: (..., 3). Traceable."""
    d = jnp.linalg.norm(x[..., :, None, :] - x[..., None, :, :], axis=-1)
    d = jnp.where(valid[..., None, :], d, 0.0).sum(axis=-1)
    pick = jnp.argmin(jnp.where(valid, d, jnp.inf), axis=-1)
    return jnp.take_along_axis(x, pick[..., None, None], axis=-2)[..., 0, :]
