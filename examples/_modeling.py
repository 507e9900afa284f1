"""Shared by the GP modeling examples: draw measurements, fit the GP, score both models."""

from __future__ import annotations

import jax

import dmimo_jax as dj
from dmimo_jax import gp
from dmimo_jax.metrics import modeling_score


def measurements(key, scene, num):
    """``num`` snapshots of the true two-ray channel: positions, phases, their variances."""
    k_x, k_cpo, k_noise = jax.random.split(key, 3)
    truth = dj.TwoRayModel(scene)
    x = dj.sample_positions(k_x, num, scene)
    cpo = dj.random_cpos(k_cpo, num)
    r = dj.simulate_phases_batch(k_noise, truth, x, cpo)
    return x, r, jax.vmap(truth.variance)(x), cpo


def fit_and_score(scene, num_train: int, num_test: int, seed: int) -> dict:
    """Fit the GP on ``num_train`` locations; RMSE/NLPD of theory and GP on independent test UEs."""
    key_train, key_test = jax.random.split(jax.random.key(seed))
    x, r, nv, _ = measurements(key_train, scene, num_train)
    fit = gp.fit(x, r, nv, scene)
    model = gp.GPPhaseModel.from_fit(fit, x, r, nv, scene)
    xt, rt, _, _ = measurements(key_test, scene, num_test)
    theory = modeling_score(dj.TwoRayModel(scene), xt, rt)
    learned = modeling_score(model, xt, rt)
    return dict(
        theory_rmse_deg=theory.rmse_deg,
        theory_nlpd=float(theory.nlpd),
        gp_rmse_deg=learned.rmse_deg,
        gp_nlpd=float(learned.nlpd),
        fit_seconds=fit.seconds,
        log_likelihood=float(fit.log_likelihood),
        hyperparameters=fit.params.natural(),
        model=model,
        train=(x, r, nv),
    )
