"""dmimo_jax.calibration.staging and calibrate_many: the staged fit of many deployments at
once gives each the calibration its own calibrate call gives it, and refuses deployments it
cannot stack."""

import jax
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax.calibration import Surfaces, calibrate, calibrate_many, check_calibratable
from dmimo_jax.receivers import ReceiverModel, ideal_receivers

SCENE = dj.paper_scene(-10.0, convention="itu")
MODEL = dj.TwoRayModel(SCENE)
M = SCENE.num_aps
L = 24
# positions, offsets from their closed form, the ground from two material starts
FIT = ("ap_positions", "ap_phase_offsets", Surfaces(starts=("concrete", "wood")))


def _worlds(num, seed=0):
    """(x, r, noise_var) stacked over ``num`` two-ray worlds: phase centres 5 mm off, random
    offsets, the ground 10% off concrete; noisy phases at L labeled spots each."""
    rng = np.random.default_rng(seed)
    xs, rs, nvs = [], [], []
    for i in range(num):
        truth = dj.TwoRayModel(
            SCENE.replace(
                ap_positions=np.asarray(SCENE.ap_positions) + rng.normal(0, 5e-3, (M, 3)),
                ap_phase_offsets=rng.uniform(-np.pi, np.pi, M),
                eps_r=1.1 * SCENE.eps_r,
            )
        )
        x = dj.sample_positions(jax.random.key(seed + i), L, SCENE)
        nv = jax.vmap(truth.variance)(x)
        r = dj.simulate_phases_batch(
            jax.random.key(100 + i), truth, x, dj.random_cpos(jax.random.key(200 + i), L)
        )
        xs.append(x)
        rs.append(r)
        nvs.append(nv)
    return np.stack(xs), np.stack(rs), np.stack(nvs)


def test_many_deployments_at_once_equal_a_loop_of_calibrate_calls():
    x, r, nv = _worlds(3)
    many = calibrate_many(MODEL, x, r, nv, fit=FIT, num_steps=10, warn=False)
    assert len(many) == 3
    for i, got in enumerate(many):
        want = calibrate(MODEL, x[i], r[i], nv[i], fit=FIT, num_steps=10, warn=False)
        assert got.status == want.status and got.dof == want.dof
        # the batched products round differently and a fit stops where its rounds stall:
        # phase centres to 1e-9 m, every value within 1e-5 of its own standard error
        # (measured: 5e-11 m, 1.6e-9 rad, 1.5e-6 standard errors at most)
        np.testing.assert_allclose(
            got.values["ap_positions"], want.values["ap_positions"], rtol=0, atol=1e-9
        )
        for name in want.values:
            diff = np.abs(np.asarray(got.values[name]) - np.asarray(want.values[name]))
            assert np.all(diff <= 1e-5 * np.abs(np.asarray(want.stderr[name])) + 1e-15), name
            np.testing.assert_allclose(got.stderr[name], want.stderr[name], rtol=1e-5)
        np.testing.assert_allclose(got.reduced_chi2, want.reduced_chi2, rtol=1e-9)
        np.testing.assert_allclose(got.cpo, want.cpo, rtol=0, atol=1e-8)
    # the same values a list of the same nominal model gives
    again = calibrate_many([MODEL] * 3, x, r, nv, fit=FIT, num_steps=10, warn=False)
    np.testing.assert_array_equal(again[1].values["ap_positions"], many[1].values["ap_positions"])


@pytest.mark.parametrize(
    "case, match",
    [
        ("unbatched", r"\(N, L, 3\)"),
        ("mismatched", r"\(N, L, M\)"),
        ("count", "N = 2"),
        ("kinds", "one kind"),
        ("polarizations", "share their structure"),
        ("receiver model", "CalibratableModel"),
    ],
)
def test_deployments_that_cannot_be_fitted_at_once_are_refused(case, match):
    x, r, nv = _worlds(2)
    model = MODEL
    if case == "unbatched":
        x, r, nv = x[0], r[0], nv[0]
    elif case == "mismatched":
        r = r[:, :-1]
    elif case == "count":
        model = [MODEL] * 3
    elif case == "kinds":
        model = [MODEL, dj.room_model(SCENE)]
    elif case == "polarizations":
        model = [MODEL, MODEL.with_scene(SCENE.replace(polarization="TM"))]
    elif case == "receiver model":
        model = ReceiverModel(MODEL, ideal_receivers(M))
    with pytest.raises(ValueError, match=match):
        calibrate_many(model, x, r, nv, fit="ap_phase_offsets", warn=False)


def test_a_receiver_model_is_not_a_calibratable_model():
    check_calibratable(MODEL)
    with pytest.raises(ValueError, match="got ReceiverModel"):
        check_calibratable(ReceiverModel(MODEL, ideal_receivers(M)))
