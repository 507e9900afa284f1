import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import estimators as est

SCENE = dj.paper_scene()
MODEL = dj.TwoRayModel(SCENE)
X0 = jnp.array([6.5, 5.0, 2.0])


def _circ_err(a, b):
    return np.abs(np.asarray(dj.wrap(jnp.asarray(a) - jnp.asarray(b))))


def test_wrap_correction_eq16_cases():
    mean = jnp.zeros(5)
    # majority near +pi, minority near -pi: minority moved up by 2 pi
    r = jnp.array([3.0, 3.1, 3.05, -3.1, -3.12])
    e = np.asarray(dj.likelihood.wrap_corrected_residuals(r, mean))
    np.testing.assert_allclose(e, [3.0, 3.1, 3.05, -3.1 + 2 * np.pi, -3.12 + 2 * np.pi])
    # majority near -pi: the +pi side moves down
    e = np.asarray(dj.likelihood.wrap_corrected_residuals(-r, mean))
    np.testing.assert_allclose(e, -np.array([3.0, 3.1, 3.05, -3.1 + 2 * np.pi, -3.12 + 2 * np.pi]))
    # nothing near the boundary: untouched
    r = jnp.array([0.1, -0.2, 0.3, 1.0, -1.2])
    np.testing.assert_allclose(
        np.asarray(dj.likelihood.wrap_corrected_residuals(r, mean)), np.asarray(r)
    )


def test_cpo_estimate_exact_when_straddling_pi():
    theta = dj.physics.unwrapped_phase(X0, SCENE)
    var = dj.physics.phase_noise_var(X0, SCENE)
    noise = 0.05 * jax.random.normal(jax.random.key(0), (17,))
    for phi in (np.pi - 0.02, -np.pi + 0.01, np.pi):
        r = dj.wrap(theta + phi + noise)
        # the residuals straddle +-pi: the estimate is the weighted mean of phi + noise
        expected = phi + jnp.sum(noise / var) / jnp.sum(1 / var)
        assert _circ_err(dj.likelihood.cpo_estimate(r, theta, var), expected) < 1e-12
        assert _circ_err(dj.likelihood.cpo_estimate(r, theta), phi + jnp.mean(noise)) < 1e-12


def test_cpo_estimate_invariant_to_constant_shift():
    theta = dj.physics.unwrapped_phase(X0, SCENE)
    var = dj.physics.phase_noise_var(X0, SCENE)
    r = dj.simulate_phases(jax.random.key(1), SCENE, X0, 0.3)
    base = dj.likelihood.cpo_estimate(r, theta, var)
    for c in np.linspace(-3 * np.pi, 3 * np.pi, 97):
        shifted = dj.likelihood.cpo_estimate(dj.wrap(r + c), theta, var)
        assert _circ_err(shifted, base + c) < 1e-10, c


@pytest.mark.parametrize("cpo", [0.0, np.pi / 2, np.pi - 1e-3, -np.pi])
def test_costs_zero_at_truth_without_noise(cpo):
    loud = dj.paper_scene(power_dbm=200.0)  # noise ~ 1e-15 rad
    for x in dj.sample_positions(jax.random.key(2), 10, SCENE):
        r = dj.simulate_phases(jax.random.key(3), loud, x, cpo)
        assert float(dj.likelihood.ls_cost(x, r, SCENE)) < 1e-20
        # ML cost scales residuals by 1/sigma^2 (~1e7 at -10 dBm): still ~0
        assert float(dj.likelihood.ml_cost(x, r, SCENE)) < 1e-10
        # and clearly positive a quarter wavelength away
        assert float(dj.likelihood.ls_cost(x + jnp.array([0.09, 0.0, 0.0]), r, SCENE)) > 1e-2


def test_ml_cost_is_chi_square_at_truth():
    n = 2000
    xs = jnp.broadcast_to(X0, (n, 3))
    r = dj.simulate_phases_batch(jax.random.key(4), SCENE, xs, jnp.full(n, 1.0))
    costs = np.asarray(jax.vmap(dj.likelihood.ml_cost, (0, 0, None))(xs, r, MODEL))
    # M residuals, one CPO compressed: chi-square with M - 1 = 16 degrees of freedom
    assert costs.mean() == pytest.approx(16.0, rel=0.05)


def test_refine_converges_from_5cm_without_noise():
    loud = dj.paper_scene(power_dbm=200.0)
    n = 128
    xs = dj.sample_positions(jax.random.key(5), n, SCENE)
    cpos = dj.random_cpos(jax.random.key(6), n)
    r = dj.simulate_phases_batch(jax.random.key(7), loud, xs, cpos)
    d = jax.random.normal(jax.random.key(8), (n, 3))
    starts = xs + 0.05 * d / jnp.linalg.norm(d, axis=1, keepdims=True)
    out = est.refine_batch(starts, r, SCENE)
    err = np.linalg.norm(np.asarray(out.x - xs), axis=1)
    assert err.max() < 1e-6
    assert np.all(_circ_err(out.cpo, cpos) < 1e-6)


def test_refine_attains_peb_at_paper_point():
    """From the true position, the refined ML estimate's RMSE matches the PEB (efficiency)."""
    n = 400
    xs = jnp.broadcast_to(X0, (n, 3))
    r = dj.simulate_phases_batch(jax.random.key(9), SCENE, xs, jnp.full(n, np.pi / 2))
    out = est.refine_batch(xs, r, SCENE)
    rmse = float(np.sqrt(np.mean(np.sum(np.asarray(out.x - xs) ** 2, axis=1))))
    assert rmse == pytest.approx(float(dj.peb(X0, SCENE)), rel=0.12)


def test_refine_batch_matches_single():
    r = dj.simulate_phases(jax.random.key(10), SCENE, X0, 0.5)
    start = X0 + jnp.array([0.02, 0.01, -0.03])
    one = est.refine(start, r, SCENE)
    many = est.refine_batch(start[None, :], r[None, :], SCENE)
    np.testing.assert_allclose(np.asarray(many.x[0]), np.asarray(one.x), atol=1e-12)


@pytest.mark.parametrize(
    "x0, r, match",
    [
        (X0, jnp.zeros(16), r"r must have shape \(17,\)"),
        (X0, jnp.zeros(17).at[3].set(jnp.nan), "r must be finite"),
        (jnp.array([1.0, 1.0, jnp.nan]), jnp.zeros(17), "x0 must be finite"),
        (jnp.array([1.0, 1.0, -1.0]), jnp.zeros(17), "above the ground"),
    ],
)
def test_refine_bad_input(x0, r, match):
    with pytest.raises(ValueError, match=match):
        est.refine(x0, r, SCENE)


def test_refine_batch_bad_rows():
    with pytest.raises(ValueError, match="rows to match"):
        est.refine_batch(jnp.ones((3, 3)), jnp.zeros((2, 17)), SCENE)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_recheck_costly_searches_again_only_the_answers_whose_cost_is_wrong():
    scene = dj.paper_scene()
    truth = dj.TwoRayModel(scene)
    test = dj.measure.labeled_snapshots(jax.random.key(3), truth, 4)
    right = dj.refine_batch(test.x, test.r, truth)
    # two answers started 30 cm off: refined into wrong lobes 0.3 and 0.9 m from the truth
    starts = test.x.at[1:3, 0].add(0.3)
    wrong = dj.refine_batch(starts, test.r, truth)
    assert float(wrong.cost[1]) > 100 * 13 and float(wrong.cost[2]) > 100 * 13
    window = dict(radius=1.0, spacing=float(scene.wavelength) / 4)  # wide enough for both
    # half the answers fail: the model, not the search (default max_fraction 5%): untouched
    same, failed = dj.estimators.recheck_costly(test.r, truth, wrong, **window)
    np.testing.assert_array_equal(failed, [False, True, True, False])
    assert same is wrong
    out, rechecked = dj.estimators.recheck_costly(test.r, truth, wrong, max_fraction=1.0, **window)
    np.testing.assert_array_equal(rechecked, [False, True, True, False])
    np.testing.assert_allclose(out.x, right.x, atol=1e-7)  # the truth's lobe found again
    np.testing.assert_array_equal(out.x[0], wrong.x[0])  # a right answer is left alone
    assert out.cpo.shape == (4,) and float(out.cost[1]) < 100 * 13
    with pytest.raises(ValueError, match="gate"):
        dj.estimators.recheck_costly(test.r, truth, wrong, gate=0.0)
    with pytest.raises(ValueError, match="result"):
        dj.estimators.recheck_costly(test.r[:3], truth, wrong)
    with pytest.raises(ValueError, match="max_fraction"):
        dj.estimators.recheck_costly(test.r, truth, wrong, max_fraction=1.5)
    # chunks of one answer: the same answers
    one, _ = dj.estimators.recheck_costly(test.r, truth, wrong, max_fraction=1.0, chunk=1, **window)
    np.testing.assert_allclose(one.x, out.x, atol=1e-9)


@pytest.mark.parametrize("batch", [2, 12])  # 8 lanes: all starts at once; 48: one per pass
def test_best_start_then_refine_equals_multistart_then_refine(batch):
    """The one-call-site loop of the Locator's first answer gives refine_multistart's best
    and refine_batch's fine answer from it, in both lane layouts, and under a second model
    for the fine pass; a start whose cost is NaN never wins."""
    from dmimo_jax.estimators.mle import WIDE_LANES, best_start_then_refine

    assert (batch * 4 <= WIDE_LANES) == (batch == 2)
    key = jax.random.key(5)
    x = dj.sample_positions(key, batch, SCENE)
    r = jax.vmap(lambda k, xi: dj.simulate_phases(k, SCENE, xi, 0.4))(
        jax.random.split(key, batch), x
    )
    starts = x[:, None, :] + 0.04 * jax.random.normal(jax.random.key(6), (batch, 4, 3))
    starts = starts.at[0, 0].set(jnp.nan)  # row 0's first start fails
    other = dj.TwoRayModel(SCENE.replace(eps_r=1.3 * SCENE.eps_r))
    for fine_model in (None, other):
        screened, fine = jax.jit(best_start_then_refine, static_argnums=(3, 4))(
            starts, r, MODEL, 2, 3, fine_model
        )
        best = est.mle.refine_multistart_unchecked(starts, r, MODEL, 2)
        want = est.mle.refine_batch_unchecked(best.x, r, fine_model or MODEL, 3)
        assert np.all(np.isfinite(np.asarray(screened)))
        np.testing.assert_allclose(screened, best.x, rtol=0, atol=1e-12)
        np.testing.assert_allclose(fine.x, want.x, rtol=0, atol=1e-9)
        np.testing.assert_allclose(fine.cost, want.cost, rtol=1e-9)
        np.testing.assert_array_equal(fine.num_accepted, want.num_accepted)
    # a different fine model moves the fine answer (the second model is really used)
    assert (
        float(jnp.max(jnp.abs(fine.x - est.mle.refine_batch_unchecked(best.x, r, MODEL, 3).x)))
        > 1e-6
    )
