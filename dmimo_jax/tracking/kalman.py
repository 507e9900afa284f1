r"""The Kalman algebra the tracking filter and its posterior bound share.

The carrier phases see the state only through its position: a snapshot brings the
position information :math:`\mathbf J(\mathbf x) = \mathbf H^\top\mathbf J(\boldsymbol\theta)\mathbf H`
of eq. (14) (the CPO removed by the EFIM of eq. 13b), a (3, 3) matrix that may be
singular. With :math:`\mathbf A = \mathbf S\mathbf P^-\mathbf S^\top` the predicted
position covariance (:math:`\mathbf S = [\mathbf I_3\ \mathbf 0]`), the information
update :math:`\mathbf P = ((\mathbf P^-)^{-1} + \mathbf S^\top\mathbf J\mathbf S)^{-1}`
is, by the Woodbury identity, without inverting :math:`\mathbf J` or :math:`\mathbf P^-`,

.. math::
    \mathbf G = \mathbf P^-\mathbf S^\top(\mathbf I + \mathbf J\mathbf A)^{-1},\qquad
    \mathbf P = \mathbf P^- - \mathbf G\mathbf J\mathbf S\mathbf P^-,

and a position gradient :math:`\mathbf g` moves the mean by :math:`\mathbf G\mathbf g`.
All functions are for one state; unchecked and traceable.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import Array


def predict_covariance(cov: Array, transition: Array, noise: Array) -> Array:
    r""":math:`\mathbf P^- = \mathbf F\mathbf P\mathbf F^\top + \mathbf Q` (S, S)."""
    return transition @ cov @ transition.T + noise


def position_update(cov_pred: Array, info: Array) -> tuple[Array, Array]:
    """Gain ``G`` (S, 3) and posterior covariance (S, S) after position information
    ``info`` (3, 3) (module docstring); the covariance is symmetrized."""
    cross = cov_pred[:, :3]
    a = cov_pred[:3, :3]
    eye = jnp.eye(3, dtype=cov_pred.dtype)
    # G^T = (I + J A)^{-T} S P^- = (I + A J)^{-1} S P^-  (A, J symmetric)
    gain = jnp.linalg.solve(eye + a @ info, cross.T).T
    cov = cov_pred - gain @ info @ cross.T
    return gain, (cov + cov.T) / 2


def information_update(cov_pred: Array, info: Array) -> Array:
    r"""Posterior covariance :math:`((\mathbf P^-)^{-1} + \mathbf S^\top\mathbf J\mathbf S)^{-1}`
    (S, S) in information form: the sum of informations, no difference of covariances, so a
    flat prior (:math:`\mathbf P^-` of 1e6 m^2 against a posterior of 1e-9 m^2) loses no
    precision, where the Woodbury form's :math:`\mathbf P^- - \mathbf G\mathbf J\mathbf
    S\mathbf P^-` cancels ~15 digits. Symmetrized."""
    eye = jnp.eye(cov_pred.shape[0], dtype=cov_pred.dtype)
    prior_info = jnp.linalg.solve(cov_pred, eye)
    total = (prior_info + prior_info.T) / 2
    total = total.at[:3, :3].add(info)
    cov = jnp.linalg.solve(total, eye)
    return (cov + cov.T) / 2
