import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import gp
from dmimo_jax.learning import load_dataset, synthesize, write_dataset
from dmimo_jax.metrics import modeling_score

SCENE = dj.paper_scene()
LAM = float(SCENE.wavelength)
TRUTH = dj.TwoRayModel(SCENE)


def _data(seed, num, scene=SCENE):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    x = dj.sample_positions(k1, num, scene)
    cpo = dj.random_cpos(k2, num)
    model = dj.TwoRayModel(scene)
    r = dj.simulate_phases_batch(k3, model, x, cpo)
    return x, r, jax.vmap(model.variance)(x), cpo


def _modeling_rmse(model, scene, seed=999, num=200):
    """Modeling RMSE (rad) with the CPO of each test snapshot compressed (eq. 15)."""
    x, r, _, _ = _data(seed, num, scene)
    return float(modeling_score(model, x, r).rmse)


def test_features_match_the_geometry():
    x = jnp.array([6.5, 5.0, 2.0])
    f = gp.features(x, SCENE)
    ap = np.asarray(SCENE.ap_positions)
    d1 = np.linalg.norm(ap - np.asarray(x), axis=1)
    d2 = np.linalg.norm(ap * [1, 1, -1] - np.asarray(x), axis=1)
    np.testing.assert_allclose(np.asarray(f[:, 0]), d2 - d1, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(f[:, 1]), np.arccos((2.0 + ap[:, 2]) / d2), atol=1e-12)
    # finite gradients straight below an AP (horizontal distance 0)
    below = jnp.asarray(SCENE.ap_positions[0]).at[2].set(1.0)
    assert bool(jnp.all(jnp.isfinite(jax.jacfwd(gp.features)(below, SCENE))))


def test_kernel_matches_eq_22_elementwise():
    params = gp.GPParams.from_natural(0.3, 0.7, 2.5, 0.4)
    kernel = gp.build_kernel(params, LAM)
    s = jax.random.uniform(jax.random.key(0), (40, 2)) * jnp.array([[3.0, 1.4]])
    got = np.asarray(kernel(s, s))
    dd = np.asarray(s[:, None, 0] - s[None, :, 0])
    dg = np.asarray(s[:, None, 1] - s[None, :, 1])
    omega0 = 2 * np.pi / LAM
    want = (
        0.3
        * np.exp(-2 / 0.7 * np.sin(omega0 * dd / 2) ** 2)
        * np.exp(-(dd**2) / (2 * 2.5))
        * np.exp(-(dg**2) / (2 * 0.4))
    )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    # periodic in Delta d with period lambda (up to the slow decay of k_se)
    a, b = jnp.array([1.0, 0.3]), jnp.array([1.0 + LAM, 0.3])
    assert float(kernel.evaluate(a, b)) == pytest.approx(0.3 * np.exp(-(LAM**2) / 5.0), rel=1e-10)


def test_kernel_factors_multiply_to_the_kernel_and_tabulate_eq_25a():
    params = gp.GPParams.from_natural(0.3, 0.7, 2.5, 0.4)
    k_dd, k_gamma = gp.kernel_factors(params, LAM)
    s = jax.random.uniform(jax.random.key(1), (40, 2)) * jnp.array([[3.0, 1.4]])
    t = jax.random.uniform(jax.random.key(2), (30, 2)) * jnp.array([[3.0, 1.4]])
    np.testing.assert_allclose(
        np.asarray(k_dd(s[:, 0], t[:, 0]) * k_gamma(s[:, 1], t[:, 1])),
        np.asarray(gp.build_kernel(params, LAM)(s, t)),
        rtol=1e-14,
    )
    # the mean table (an outer product of the factors per row) holds eq. (25a) at its nodes
    x, r, nv, cpo = _data(2, 6)
    model = gp.GPPhaseModel.from_data(params, cpo, x, r, nv, SCENE)
    table = gp.TabulatedGPModel.from_model(model, dd_step=0.05, num_gamma=9, variance=False)
    dd = np.arange(table.values.shape[0]) * float(table.step[0])
    gamma = np.arange(9) * float(table.step[1])
    f = jnp.asarray(np.stack(np.meshgrid(dd, gamma, indexing="ij"), -1).reshape(-1, 2))
    want = gp.build_kernel(params, LAM)(f, model.cond_kernel.X) @ model.alpha
    np.testing.assert_allclose(
        np.asarray(table.values).reshape(-1), np.asarray(want), rtol=1e-9, atol=1e-12
    )


def test_log_marginal_likelihood_is_tinygp_gaussian_with_known_noise():
    x, r, nv, cpo = _data(1, 3)
    params = gp.GPParams.from_natural(0.05, 1.0, 2.0, 0.3)
    f = jax.vmap(gp.features, in_axes=(0, None))(x, SCENE).reshape(-1, 2)
    k = np.asarray(gp.build_kernel(params, LAM)(f, f)) + np.diag(np.asarray(nv).reshape(-1))
    y = np.asarray(gp.residuals(x, r, cpo, SCENE)).reshape(-1)
    sign, logdet = np.linalg.slogdet(k)
    want = -0.5 * (y @ np.linalg.solve(k, y) + logdet + y.size * np.log(2 * np.pi))
    got = float(gp.log_marginal_likelihood(params, cpo, x, r, nv, SCENE))
    assert sign > 0 and got == pytest.approx(want, rel=1e-9)


def test_prediction_at_a_training_input_returns_the_training_residual():
    x, r, _, cpo = _data(2, 6)
    tiny = jnp.full(r.shape, 1e-12)
    params = gp.GPParams.from_natural(0.05, 1.0, 2.0, 0.3)
    model = gp.GPPhaseModel.from_data(params, cpo, x, r, tiny, SCENE)
    mean, var = model.perturbation(x[3])
    np.testing.assert_allclose(
        np.asarray(mean), np.asarray(gp.residuals(x, r, cpo, SCENE)[3]), atol=1e-6
    )
    assert float(jnp.max(var)) < 1e-8


def test_profiled_cpos_maximize_the_likelihood():
    x, r, nv, _ = _data(3, 8)
    params = gp.GPParams.from_natural(0.05, 1.0, 2.0, 0.3)
    cpo = gp.profile_cpos(params, gp.initial_cpos(x, r, SCENE), x, r, nv, SCENE)
    grad = jax.grad(gp.log_marginal_likelihood, argnums=1)(params, cpo, x, r, nv, SCENE)
    assert float(jnp.max(jnp.abs(grad))) < 1e-6 * float(jnp.max(1 / nv))  # eq. (23b) = 0
    base = float(gp.log_marginal_likelihood(params, cpo, x, r, nv, SCENE))
    for delta in (1e-3, -1e-3):
        assert float(gp.log_marginal_likelihood(params, cpo + delta, x, r, nv, SCENE)) < base


@pytest.mark.slow
def test_fitted_gp_on_noise_free_data_beats_a_zero_mean_gp():
    loud = dj.paper_scene(power_dbm=40.0)  # sigma ~ 1.6e-7 rad: practically noise-free
    x, r, nv, _ = _data(4, 20, loud)
    fit = gp.fit(x, r, nv, loud)
    model = gp.GPPhaseModel.from_fit(fit, x, r, nv, loud)
    # a zero-mean GP (the LoS phase alone): conditioned on two zero residuals
    r_los = dj.wrap(jax.vmap(gp.los_phase, in_axes=(0, None))(x[:2], loud) + fit.cpo[:2, None])
    zero = gp.GPPhaseModel.from_data(fit.params, fit.cpo[:2], x[:2], r_los, nv[:2], loud)
    assert float(jnp.max(jnp.abs(zero.perturbation(x[5])[0]))) < 1e-9
    e_gp, e_zero = _modeling_rmse(model, loud), _modeling_rmse(zero, loud)
    assert e_gp < e_zero / 20, (e_gp, e_zero)
    assert np.all(np.diff(np.asarray(fit.history)) > -1e-6 * abs(float(fit.history[-1])))


@pytest.fixture(scope="module")
def fitted_l50():
    """The GP fitted on L = 50 snapshots (concrete ground, -10 dBm), shared by two tests."""
    x, r, nv, _ = _data(50, 50)
    return gp.GPPhaseModel.from_fit(gp.fit(x, r, nv, SCENE), x, r, nv, SCENE)


@pytest.mark.slow
def test_quality_goals_concrete_at_minus_10_dbm(fitted_l50):
    # L = 50: the GP within 2x the theoretical model's modeling RMSE
    model = fitted_l50
    e_gp, e_theory = _modeling_rmse(model, SCENE), _modeling_rmse(TRUTH, SCENE)
    assert e_gp <= 2 * e_theory, (np.degrees(e_gp), np.degrees(e_theory))
    # L = 5: below one degree
    x, r, nv, _ = _data(5, 5)
    fit5 = gp.fit(x, r, nv, SCENE)
    assert np.degrees(_modeling_rmse(gp.GPPhaseModel.from_fit(fit5, x, r, nv, SCENE), SCENE)) < 1.0


def test_gp_phase_model_plugs_into_simulation_and_refinement(fitted_l50):
    model = fitted_l50
    x0 = jnp.array([6.5, 5.0, 2.0])
    r0 = dj.simulate_phases(jax.random.key(7), TRUTH, x0, 0.4)
    res = dj.estimators.refine(x0 + jnp.array([0.02, -0.01, 0.015]), r0, model)
    assert float(jnp.linalg.norm(res.x - x0)) < 2e-3  # mm-level with a learned model
    var = model.variance(x0)
    assert bool(jnp.all(var >= gp.los_noise_var(x0, SCENE)))


@pytest.mark.parametrize(
    "x, r, nv, match",
    [
        (jnp.ones((1, 3)), jnp.zeros((1, 17)), jnp.ones((1, 17)), "L = 2"),
        (jnp.ones((3, 3)), jnp.zeros((3, 16)), jnp.ones((3, 17)), r"r must have shape \(3, 17\)"),
        (jnp.ones((3, 3)), jnp.zeros((3, 17)), jnp.ones((2, 17)), "noise_var must have shape"),
        (
            jnp.ones((3, 3)),
            jnp.zeros((3, 17)).at[0, 0].set(jnp.nan),
            jnp.ones((3, 17)),
            "r must be finite",
        ),
        (
            jnp.ones((3, 3)),
            jnp.zeros((3, 17)),
            jnp.ones((3, 17)).at[1, 1].set(jnp.inf),
            "noise_var must be finite",
        ),
        (jnp.ones((3, 3)), jnp.zeros((3, 17)), -jnp.ones((3, 17)), "positive"),
        (jnp.ones((3, 3)).at[0, 2].set(jnp.nan), jnp.zeros((3, 17)), jnp.ones((3, 17)), "x"),
    ],
)
def test_fit_bad_input(x, r, nv, match):
    with pytest.raises(ValueError, match=match):
        gp.fit(x, r, nv, SCENE)


def test_synthetic_data_is_wrapped_uniform_reproducible_and_chunk_free(tmp_path):
    a = synthesize(jax.random.key(0), TRUTH, 4000)
    assert float(jnp.min(a.r)) >= -np.pi and float(jnp.max(a.r)) < np.pi
    # CPO uniform on [-pi, pi): Kolmogorov-Smirnov distance against the uniform CDF
    cpo = np.sort(np.asarray(a.cpo))
    ks = np.max(np.abs((cpo + np.pi) / (2 * np.pi) - (np.arange(cpo.size) + 0.5) / cpo.size))
    assert ks < 1.36 / np.sqrt(cpo.size)  # 5% level
    lo, hi = np.asarray(SCENE.ue_low), np.asarray(SCENE.ue_high)
    assert np.all((np.asarray(a.x) >= lo) & (np.asarray(a.x) <= hi))
    # the phases are the model's: CPO-compressed residuals ~ noise
    mean = jax.vmap(TRUTH.mean)(a.x)
    e = dj.wrap(a.r - mean - a.cpo[:, None])
    assert float(jnp.std(e)) < 5 * float(jnp.sqrt(jnp.mean(jax.vmap(TRUTH.variance)(a.x))))
    # same key, same data; a sub-range is the same samples
    b = synthesize(jax.random.key(0), TRUTH, 100, start=1000)
    np.testing.assert_array_equal(np.asarray(b.r), np.asarray(a.r[1000:1100]))
    # on disk, in chunks of any size, and resumed after an interruption
    p1 = write_dataset(
        tmp_path / "a", jax.random.key(0), TRUTH, 1000, chunk_size=1000, progress=False
    )
    p2 = write_dataset(tmp_path / "b", jax.random.key(0), TRUTH, 1000, chunk_size=7, progress=False)
    d1, d2 = load_dataset(p1), load_dataset(p2)
    np.testing.assert_array_equal(d1.r, d2.r)
    np.testing.assert_array_equal(d1.x, np.asarray(a.x[:1000]))
    c = synthesize(jax.random.key(1), TRUTH, 10)
    assert not np.allclose(np.asarray(c.r), np.asarray(a.r[:10]))
    with pytest.raises(ValueError, match="different dataset"):
        write_dataset(tmp_path / "a", jax.random.key(1), TRUTH, 1000, progress=False)


def test_write_dataset_resumes(tmp_path, monkeypatch):
    from dmimo_jax.learning import data as data_mod

    calls = {"n": 0}
    real = data_mod.synthesize

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(data_mod, "synthesize", flaky)
    with pytest.raises(KeyboardInterrupt):
        write_dataset(tmp_path / "d", jax.random.key(2), TRUTH, 50, chunk_size=10, progress=False)
    with pytest.raises(ValueError, match="incomplete"):
        load_dataset(tmp_path / "d")
    monkeypatch.setattr(data_mod, "synthesize", real)
    write_dataset(tmp_path / "d", jax.random.key(2), TRUTH, 50, chunk_size=10, progress=False)
    np.testing.assert_array_equal(
        load_dataset(tmp_path / "d").r, np.asarray(real(jax.random.key(2), TRUTH, 50).r)
    )


def test_modeling_score_matches_the_formulas():
    x, r, _, cpo = _data(11, 50)
    mean, var = jax.vmap(TRUTH.mean)(x), jax.vmap(TRUTH.variance)(x)
    e = np.asarray(dj.wrap(r - mean - cpo[:, None]))
    known = modeling_score(TRUTH, x, r, cpo)
    assert float(known.rmse) == pytest.approx(np.sqrt(np.mean(e**2)), rel=1e-12)
    want = 0.5 * np.mean(e**2 / np.asarray(var) + np.log(2 * np.pi * np.asarray(var)))
    assert float(known.nlpd) == pytest.approx(want, rel=1e-12)
    # the true model is calibrated: e^2 / sigma^2 averages to ~1 (here 850 draws)
    assert np.mean(e**2 / np.asarray(var)) == pytest.approx(1.0, abs=0.15)
    # compressing the CPO can only lower the residuals
    assert float(modeling_score(TRUTH, x, r).rmse) <= float(known.rmse) + 1e-12


@pytest.mark.slow
@pytest.mark.optimized
def test_nuts_posterior_runs_and_brackets_the_point_estimate():
    x, r, nv, _ = _data(21, 4)
    fit = gp.fit(x, r, nv, SCENE)
    post = gp.fit_nuts(
        x, r, nv, SCENE, key=jax.random.key(0), init=fit, num_warmup=30, num_samples=30,
        max_tree_depth=6,
    )  # fmt: skip
    assert post.cpo.shape == (30, 4) and all(v.shape == (30,) for v in post.params)
    assert all(bool(jnp.all(jnp.isfinite(v))) for v in post.params)
    mix = gp.GPMixtureModel.from_posterior(post, x, r, nv, SCENE, num_draws=5)
    x0 = jnp.array([6.5, 5.0, 2.0])
    m = gp.GPPhaseModel.from_fit(fit, x, r, nv, SCENE)
    assert mix.mean(x0).shape == (17,) and bool(jnp.all(mix.variance(x0) > 0))
    # the mixture's variance includes the spread of the draws' means: never below the draws' average
    each = jax.vmap(lambda mm: mm.variance(x0))(mix.stacked)
    assert bool(jnp.all(mix.variance(x0) >= jnp.mean(each, axis=0) - 1e-15))
    # the draws sit around the point estimate (in log space, within the prior scale)
    for v, p in zip(post.params, fit.params, strict=True):
        assert abs(float(jnp.median(v)) - float(p)) < 2.0
    assert float(jnp.max(jnp.abs(mix.mean(x0) - m.mean(x0)))) < 0.5


@pytest.mark.parametrize("cubic", [True, False])
def test_interpolation_derivatives_are_the_interpolants_own(cubic):
    """The table interpolation's derivatives (written out, not derived node by node): its
    Jacobian in the query point equals central differences of its values, reverse mode
    equals forward mode, it is linear in the table (its gradient there is the weights), and
    the cubic one's Hessian equals differences of its Jacobian; outside the table (clamped)
    the derivative along that axis is zero."""
    rng = np.random.default_rng(3)
    values = jnp.asarray(rng.normal(size=(20, 12)))
    lower, step = jnp.array([-0.3, 0.2]), jnp.array([0.05, 0.1])
    f = jnp.asarray(rng.uniform([-0.25, 0.25], [0.6, 1.2], size=(40, 2)))
    interp = lambda v, q: gp.interpolate(v, lower, step, q, cubic=cubic)  # noqa: E731
    jac = jax.vmap(jax.jacfwd(lambda q: interp(values, q)))(f)
    h = 1e-6
    for axis in range(2):
        e = jnp.zeros((1, 2)).at[0, axis].set(h)
        diff = (interp(values, f + e) - interp(values, f - e)) / (2 * h)
        np.testing.assert_allclose(jac[:, axis], diff, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(jax.vmap(jax.jacrev(lambda q: interp(values, q)))(f), jac,
                               rtol=1e-13, atol=1e-13)  # fmt: skip
    other = jnp.asarray(rng.normal(size=values.shape))
    grad = jax.grad(lambda v: interp(v, f[0]))(values)
    np.testing.assert_allclose(jnp.vdot(grad, other), interp(other, f[0]), rtol=1e-13)
    tangent = jax.jvp(lambda v: interp(v, f[:5]), (values,), (other,))[1]
    np.testing.assert_allclose(tangent, interp(other, f[:5]), rtol=1e-13, atol=1e-14)
    if cubic:
        hess = jax.vmap(jax.hessian(lambda q: interp(values, q)))(f)
        for axis in range(2):
            e = jnp.zeros((1, 2)).at[0, axis].set(h)
            grad_at = jax.vmap(jax.grad(lambda q: interp(values, q)))
            diff = (grad_at(f + e) - grad_at(f - e)) / (2 * h)
            np.testing.assert_allclose(hess[:, axis], diff, rtol=1e-5, atol=1e-4)
    outside = jnp.array([[-1.0, 0.5], [0.3, 9.0]])  # below the first axis, above the second
    jac_out = jax.vmap(jax.jacfwd(lambda q: interp(values, q)))(outside)
    assert jac_out[0, 0] == 0.0 and jac_out[1, 1] == 0.0
    assert jac_out[0, 1] != 0.0 and jac_out[1, 0] != 0.0
