r"""Evaluation metrics of Sec. VI-B: localization RMSE, modeling RMSE, NLPD, ECDF."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_finite, check_phases, check_positions
from dmimo_jax.likelihood import compressed_residuals
from dmimo_jax.phase import wrap
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.pytree import jit_or_eager
from dmimo_jax.scene import Scene

__all__ = ["localization_rmse", "ModelingScore", "modeling_score", "ecdf"]


def localization_rmse(x_true: ArrayLike, x_hat: ArrayLike) -> Array:
    r""":math:`\sqrt{\frac1{N_T}\sum_n\|\mathbf x_n - \hat{\mathbf x}_n\|^2}` over (N, 3) positions, m."""
    check_positions("x_true", x_true, batched=True)
    check_positions("x_hat", x_hat, batched=True)
    x_true, x_hat = jnp.asarray(x_true), jnp.asarray(x_hat)
    if x_true.shape != x_hat.shape:
        raise ValueError(
            f"x_true and x_hat must have the same shape, got {x_true.shape}, {x_hat.shape}"
        )
    return jnp.sqrt(jnp.mean(jnp.sum((x_true - x_hat) ** 2, axis=-1)))


class ModelingScore(NamedTuple):
    """A phase model's score on held-out snapshots: RMSE and negative log predictive density."""

    rmse: Array
    """The wrapped phase error's RMSE, rad."""
    nlpd: Array
    """The negative log predictive density, nats per observation."""

    @property
    def rmse_deg(self) -> float:
        """The RMSE in degrees."""
        return float(jnp.degrees(self.rmse))


def modeling_score(
    model: PhaseModel | Scene, x: ArrayLike, r: ArrayLike, cpo: ArrayLike | None = None
) -> ModelingScore:
    r"""Modeling RMSE and NLPD of a PhaseModel on test snapshots (Sec. VI-B).

    :math:`e_{m,n} = \mathrm{wrap}(r_{m,n} - \mu_{m,n})`,
    :math:`\mathrm{RMSE} = \sqrt{\frac{1}{N_T M}\sum e^2}`,
    :math:`\mathrm{NLPD} = \frac{1}{2N_TM}\sum(e^2/\sigma^2 + \log 2\pi\sigma^2)` with the
    model's predictive mean :math:`\mu` and variance :math:`\sigma^2`.

    Args:
        model: PhaseModel or Scene.
        x: (N, 3) test positions.
        r: (N, M) measured wrapped phases.
        cpo: (N,) CPOs to add to the mean. ``None`` (default) compresses each snapshot's
            CPO by eq. (15) with the model's variance, as the estimators do: a model learned
            with unknown CPOs (the GP) is only defined up to a constant phase.
    """
    model = as_phase_model(model)
    check_positions("x", x, batched=True)
    check_phases("r", r, model.num_aps, batched=True)
    return _score(model, jnp.asarray(x), jnp.asarray(r), None if cpo is None else jnp.asarray(cpo))


def _modeling_score(model: PhaseModel, x: Array, r: Array, cpo: Array | None) -> ModelingScore:
    mean, var = jax.vmap(model.mean)(x), jax.vmap(model.variance)(x)
    if cpo is None:
        e = compressed_residuals(r, mean, var)
    else:
        e = wrap(r - mean - cpo[:, None])
    rmse = jnp.sqrt(jnp.mean(e**2))
    nlpd = 0.5 * jnp.mean(e**2 / var + jnp.log(2 * jnp.pi * var))
    return ModelingScore(rmse, nlpd)


_score = jit_or_eager(_modeling_score)  # one compiled program per model and shape


def ecdf(values: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF: sorted values and their probabilities (i + 1) / n.

    Raises:
        ValueError: a NaN or infinite value (a failed answer's error: count it apart, it
            has no place in the distribution of the others).
    """
    check_finite("values", values)
    v = np.sort(np.asarray(values).ravel())
    return v, np.arange(1, v.size + 1) / v.size
