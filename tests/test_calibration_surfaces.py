"""dmimo_jax.calibration.surfaces: the ground and a room's surfaces from labeled snapshots."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import calibration

L = 12


# noise-free phases with the noise's variance: calibrate's chi-square check says so
def overstated():
    return pytest.warns(UserWarning, match="noise_var overstates the noise")


def _labeled(scene_or_model, *, noise=True, seed=0, num=L):
    model = dj.as_phase_model(scene_or_model)
    k_x, k_cpo, k_n = jax.random.split(jax.random.key(seed), 3)
    x = dj.sample_positions(k_x, num, model.scene)
    cpo = dj.random_cpos(k_cpo, num)
    var = jax.vmap(model.variance)(x)
    if noise:
        r = dj.simulate_phases_batch(k_n, model, x, cpo)
    else:
        r = dj.wrap(jax.vmap(model.mean)(x) + cpo[:, None])
    return x, r, var


@pytest.mark.parametrize("polarization", ["TE", "TM"])
def test_noise_free_calibration_recovers_eps_from_every_itu_start(polarization):
    scene = dj.paper_scene(-20.0, "concrete", convention="itu", polarization=polarization)
    x, r, var = _labeled(scene, noise=False)
    for start in calibration.CALIBRATION_STARTS:
        with overstated():
            fit = calibration.fit_material(x, r, var, scene, polarization=polarization,
                                           starts=[start])  # fmt: skip
        rel = abs(complex(fit.eps_r) / complex(scene.eps_r) - 1)
        assert rel < 1e-6, (start, complex(fit.eps_r))


@pytest.mark.parametrize("material", ["wood", "glass"])
def test_polarization_is_selected_by_likelihood(material):
    for pol in ("TE", "TM"):
        scene = dj.paper_scene(-20.0, material, convention="itu", polarization=pol)
        fit = calibration.fit_material(*_labeled(scene, seed=1), scene)
        assert fit.polarization == pol
        ll_te, ll_tm = np.asarray(fit.log_likelihood_by_polarization)
        assert (ll_te > ll_tm) == (pol == "TE")
        # the estimate is within a few standard errors of the truth (Re and Im)
        err = complex(fit.eps_r) - complex(scene.eps_r)
        assert abs(err.real) < 5 * float(fit.stderr_real) + 1e-9
        assert abs(err.imag) < 5 * float(fit.stderr_imag) + 1e-9
        assert fit.cpo.shape == (L,) and np.isfinite(float(fit.log_likelihood))


def test_calibrated_mle_equals_matched_mle():
    scene = dj.paper_scene(-10.0, convention="itu")
    x, r, var = _labeled(scene, noise=False, seed=2)
    with overstated():
        fit = calibration.fit_material(x, r, var, scene, polarization="TE")
    assert isinstance(fit.model, dj.TwoRayModel)
    xt, rt, _ = _labeled(scene, seed=3, num=6)
    matched = dj.refine_batch(xt + 0.003, rt, dj.TwoRayModel(scene)).x
    calibrated = dj.refine_batch(xt + 0.003, rt, fit.model).x
    assert float(jnp.max(jnp.abs(matched - calibrated))) < 1e-8


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_room_surfaces_calibrated_jointly():
    scene = dj.paper_scene(-10.0, convention="itu")
    truth = dj.room_model(
        scene,
        ceiling="plasterboard",
        walls={"x0": "concrete", "x1": "wood", "y0": "glass", "y1": "brick"},
    )
    x, r, var = _labeled(truth, noise=False, seed=4, num=20)
    placeholder = dj.room_model(scene, ceiling=3.0, walls=3.0, floor=3.0)
    with overstated():
        fit = calibration.fit_surfaces(x, r, var, placeholder, polarization="TE")
    # the ceiling reflects nothing back to ceiling-mounted APs (first order): not fitted
    assert fit.surfaces == ("floor", "wall_x0", "wall_x1", "wall_y0", "wall_y1")
    true_eps = {rf.name: complex(rf.eps_r) for rf in truth.reflectors}
    for name, eps in zip(fit.surfaces, np.asarray(fit.eps_r), strict=True):
        assert abs(eps / true_eps[name] - 1) < 1e-5, name
    with pytest.raises(ValueError, match="mounted on 'ceiling'"):
        calibration.fit_surfaces(x, r, var, placeholder, surfaces=["ceiling"])


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_material_posterior_covers_the_truth():
    scene = dj.paper_scene(-20.0, "wood", convention="itu")
    x, r, var = _labeled(scene, seed=5)
    post = calibration.material_posterior(
        x, r, var, scene, key=jax.random.key(0), num_warmup=150, num_samples=300
    )
    low, high = (np.asarray(v) for v in post.interval(0.99))
    truth = np.array([scene.eps_r.real, scene.eps_r.imag])
    assert np.all(low <= truth) and np.all(truth <= high)
    assert not np.any(np.asarray(post.diverging))


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_bad_input_raises_clear_errors():
    scene = dj.paper_scene(-20.0, convention="itu")
    x, r, var = _labeled(scene, num=4)
    # one label identifies the permittivity (M - 1 phase differences, two unknowns): fitted,
    # not refused by the GP's L >= 2 rule; none is refused
    one = calibration.fit_material(x[:1], r[:1], var[:1], scene.replace(eps_r=3.0 + 0j))
    assert abs(complex(one.eps_r) - complex(scene.eps_r)) < 10 * float(
        one.stderr_real + one.stderr_imag
    )
    with pytest.raises(ValueError, match="at least L = 1"):
        calibration.fit_material(x[:0], r[:0], var[:0], scene)
    with pytest.raises(ValueError, match="r must be finite"):
        calibration.fit_material(x, r.at[0, 0].set(jnp.nan), var, scene)
    with pytest.raises(ValueError, match="noise_var must have shape"):
        calibration.fit_material(x, r, var[:3], scene)
    with pytest.raises(ValueError, match="polarization"):
        calibration.fit_material(x, r, var, scene, polarization="circular")
    with pytest.raises(ValueError, match="perfect-conductor"):
        calibration.fit_material(x, r, var, dj.paper_scene(-20.0, "metal"))
    with pytest.raises(ValueError, match="perfect conductor"):
        calibration.fit_material(x, r, var, scene, starts=["metal"])
    room = dj.room_model(scene, walls="concrete")
    with pytest.raises(ValueError, match="no reflector named"):
        calibration.fit_surfaces(x, r, var, room, surfaces=["skylight"])
