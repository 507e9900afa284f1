r"""The posterior Cramér-Rao bound (PCRB) of a tracked UE's state (beyond the paper).

Tichavský, Muravchik and Nehorai (1998) give the recursion of the Bayesian information
:math:`\mathbf J_k` of the state. For linear-Gaussian motion
(:mod:`~dmimo_jax.tracking.motion`) it is

.. math::
    \mathbf J_{k+1} = (\mathbf F\mathbf J_k^{-1}\mathbf F^\top + \mathbf Q)^{-1}
        + \mathbf S^\top\,\mathbb E[\mathbf J(\mathbf x_{k+1})]\,\mathbf S,

the form of the recursion that stays defined when :math:`\mathbf Q` is singular (the
constant-velocity model's is rank 3), with :math:`\mathbf J(\mathbf x)` the position FIM of
eq. (14): :func:`dmimo_jax.bounds.position_fim`, the same core as
:func:`dmimo_jax.peb`. The expectation is taken along the given (true) trajectory, the
usual conditional form of the bound for a known path (of the free state; a bounce at the
region's faces is a fold, :mod:`~dmimo_jax.tracking.motion`); the update is computed in
information form (:func:`~dmimo_jax.tracking.kalman.information_update`: a flat prior loses no
precision), :math:`\mathbf P_k = \mathbf J_k^{-1}`.

A static UE with a random walk of vanishing diffusion gets
:math:`\mathbf P_k \to \mathbf J(\mathbf x)^{-1}/k`: the bound tends to
:math:`\mathrm{PEB}/\sqrt k`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_covariance, check_finite, check_num_aps, check_positions
from dmimo_jax.bounds import position_fim
from dmimo_jax.physics import PhaseModel, as_phase_model, check_in_domain
from dmimo_jax.scene import Scene
from dmimo_jax.tracking.kalman import information_update, predict_covariance
from dmimo_jax.tracking.motion import MotionModel, check_dt, check_motion


def pcrb(
    model: PhaseModel | Scene,
    motion: MotionModel,
    positions: ArrayLike,
    dt: float,
    prior_cov: ArrayLike,
    valid: ArrayLike | None = None,
) -> Array:
    """PCRB of the state after each snapshot along one path, (T, S, S).

    Args:
        model: the world's PhaseModel (or a Scene: its two-ray model).
        motion: the motion model the path follows.
        positions: (T, 3) true positions at the snapshot times, m: the free path
            (:attr:`~dmimo_jax.tracking.Trajectory.free_positions`) for the exact bound of
            a bouncing UE; its positions in the region give the bound without the signs
            the bounces put on cross terms (the trace per snapshot is the same).
        dt: snapshot interval, s.
        prior_cov: (S, S) covariance of the prior, one interval before ``positions[0]``
            (as :class:`~dmimo_jax.tracking.Tracker` states it at ``init``).
        valid: (T,) bool, a snapshot was received (default all); without one the bound
            only predicts.

    Returns:
        (T, S, S) lower bounds on the state error covariance (position block ``[:3, :3]``).
    """
    model = as_phase_model(model)
    check_num_aps(model.num_aps)
    check_motion(motion)
    check_dt(dt)
    check_positions("positions", positions, batched=True)
    if np.shape(positions)[0] == 0:
        raise ValueError("positions must hold at least one position (got shape (0, 3))")
    check_in_domain("positions", positions, model)
    positions = jnp.asarray(positions)
    s = motion.state_dim
    prior_cov = jnp.asarray(prior_cov, positions.dtype)
    if prior_cov.shape != (s, s):
        raise ValueError(f"prior_cov must have shape ({s}, {s}), got {prior_cov.shape}")
    check_finite("prior_cov", prior_cov)
    check_covariance("prior_cov", prior_cov)
    t = positions.shape[0]
    valid = jnp.ones((t,), bool) if valid is None else jnp.asarray(valid, bool)
    if valid.shape != (t,):
        raise ValueError(f"valid must have shape ({t},), got {valid.shape}")
    return _pcrb(model, motion, positions, jnp.asarray(dt, positions.dtype), prior_cov, valid)


@jax.jit
def _pcrb(model, motion, positions, dt, prior_cov, valid):
    folded, parity = motion.fold(positions)
    info = jax.vmap(position_fim, in_axes=(0, None))(folded, model)  # eq. (14)
    info = info * parity[:, :, None] * parity[:, None, :]  # the fold's Jacobian
    f, q = motion.transition(dt), motion.process_noise(dt)

    def body(cov, inputs):
        j, ok = inputs
        cov = predict_covariance(cov, f, q)
        updated = information_update(cov, j)
        cov = jnp.where(ok, updated, cov)
        return cov, cov

    _, covs = jax.lax.scan(body, prior_cov, (info, valid))
    return covs


def pcrb_position_rmse(bounds: ArrayLike) -> Array:
    """Position RMSE bound :math:`\\sqrt{\\mathrm{tr}\\,\\mathbf P_{[:3,:3]}}` of PCRB
    matrices (..., S, S), m: comparable to :func:`dmimo_jax.peb`."""
    bounds = jnp.asarray(bounds)
    return jnp.sqrt(jnp.trace(bounds[..., :3, :3], axis1=-2, axis2=-1))
