import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import dmimo_jax as dj
from tests.helpers import assert_allclose

SCENE = dj.paper_scene()
X0 = jnp.array([6.5, 5.0, 2.0])


def test_snapshot_shape_range_and_determinism():
    key = jax.random.key(0)
    xs = dj.sample_positions(jax.random.key(1), 256, SCENE)
    cpos = dj.random_cpos(jax.random.key(2), 256)
    r1 = dj.simulate_phases_batch(key, SCENE, xs, cpos)
    r2 = dj.simulate_phases_batch(key, SCENE, xs, cpos)
    assert r1.shape == (256, 17) and r1.dtype == jnp.float64
    np.testing.assert_array_equal(np.asarray(r1), np.asarray(r2))
    assert float(r1.min()) >= -np.pi and float(r1.max()) < np.pi
    # batch == single-snapshot calls with split keys
    keys = jax.random.split(key, 256)
    single = dj.simulate_phases(keys[7], SCENE, xs[7], cpos[7])
    # same noise draw; vmapped float ops may differ by an ulp of the ~170 rad phase
    np.testing.assert_allclose(np.asarray(single), np.asarray(r1[7]), rtol=0, atol=1e-13)
    r3 = dj.simulate_phases_batch(jax.random.key(9), SCENE, xs, cpos)
    assert not np.allclose(np.asarray(r1), np.asarray(r3))


def test_noise_free_limit_is_wrapped_phase_plus_cpo():
    loud = dj.paper_scene(power_dbm=200.0)  # sigma ~ 1e-15 rad
    r = dj.simulate_phases(jax.random.key(0), loud, X0, 3.0)
    expected = dj.wrap(dj.physics.unwrapped_phase(X0, loud) + 3.0)
    np.testing.assert_allclose(np.asarray(dj.angle_diff(r, expected)), 0.0, atol=1e-12)


def _normalized_residuals(r, cpo):
    theta = dj.physics.unwrapped_phase(X0, SCENE)
    sigma = jnp.sqrt(dj.physics.phase_noise_var(X0, SCENE))
    return np.asarray(dj.wrap(r - theta[None, :] - cpo[:, None]) / sigma[None, :])


def test_gaussian_phase_and_complex_signal_agree_in_distribution():
    """Eq. (8) with eq. (9) noise matches -angle(y) of eq. (6) at the paper's SNR."""
    n = 20_000
    xs = jnp.broadcast_to(X0, (n, 3))
    cpo = dj.random_cpos(jax.random.key(3), n)
    r_gauss = dj.simulate_phases_batch(jax.random.key(4), SCENE, xs, cpo)
    r_exact = dj.measure.simulate_phases_exact_batch(jax.random.key(5), SCENE, xs, cpo)
    z_g = _normalized_residuals(r_gauss, cpo)
    z_e = _normalized_residuals(r_exact, cpo)
    for z in (z_g, z_e):
        assert abs(z.mean()) < 0.01
        np.testing.assert_allclose(z.std(axis=0), 1.0, atol=0.03)
    # pooled over APs: two-sample KS cannot tell them apart
    assert stats.ks_2samp(z_g.ravel(), z_e.ravel()).pvalue > 1e-3
    # and each is standard normal
    assert stats.kstest(z_e.ravel(), "norm").pvalue > 1e-3


def test_exact_route_detects_wrong_noise_scale():
    """The distribution test above has power: a 10% wrong sigma is rejected."""
    n = 20_000
    xs = jnp.broadcast_to(X0, (n, 3))
    cpo = dj.random_cpos(jax.random.key(3), n)
    r_exact = dj.measure.simulate_phases_exact_batch(jax.random.key(5), SCENE, xs, cpo)
    z = _normalized_residuals(r_exact, cpo) * 1.1
    assert stats.kstest(z.ravel(), "norm").pvalue < 1e-6


def test_received_signal_power():
    y = dj.measure.received_signal(jax.random.key(0), dj.paper_scene(power_dbm=200.0), X0, 0.7)
    alpha = dj.physics.effective_amplitude(X0, SCENE)
    assert_allclose(np.abs(np.asarray(y)), np.sqrt(1e17) * np.asarray(alpha), rtol=1e-9)


class HalfVarianceModel:
    """A user-defined PhaseModel: two-ray mean, quarter variance (duck typing)."""

    def __init__(self, scene):
        self.scene = scene
        self.inner = dj.TwoRayModel(scene)
        self.num_aps = scene.num_aps

    def mean(self, x):
        return self.inner.mean(x)

    def variance(self, x):
        return 0.25 * self.inner.variance(x)


def test_any_phase_model_can_simulate():
    n = 4000
    xs = jnp.broadcast_to(X0, (n, 3))
    cpo = jnp.zeros(n)
    r = dj.simulate_phases_batch(jax.random.key(1), HalfVarianceModel(SCENE), xs, cpo)
    z = _normalized_residuals(r, cpo)
    np.testing.assert_allclose(z.std(axis=0), 0.5, atol=0.03)


@pytest.mark.parametrize(
    "xs, cpos, match",
    [
        (jnp.ones((4, 3)), jnp.zeros(3), r"cpos must have shape \(4,\)"),
        (jnp.ones((4, 3)), jnp.array([0.0, 1.0, np.nan, 0.0]), "cpos must be finite"),
        (jnp.ones((4, 2)), jnp.zeros(4), r"shape \(N, 3\)"),
        (jnp.array([[1.0, 1.0, np.nan]]), jnp.zeros(1), "finite"),
        (jnp.array([[1.0, 1.0, -0.5]]), jnp.zeros(1), "above the ground"),
    ],
)
def test_batch_validation(xs, cpos, match):
    with pytest.raises(ValueError, match=match):
        dj.simulate_phases_batch(jax.random.key(0), SCENE, xs, cpos)


def test_an_ap_with_no_signal_measures_a_uniform_phase_never_nan():
    sc = dj.paper_scene(-10.0, convention="itu")
    b = np.tile([0.0, 0.0, -1.0], (sc.num_aps, 1))
    b[0] = [0.0, 0.0, 1.0]  # AP 0 faces up: no field below it
    model = dj.TwoRayModel(sc.replace(antenna=dj.CosinePattern(1.0, boresight=b)))
    ap0 = np.asarray(sc.ap_positions[0])
    x = jnp.tile(jnp.asarray([ap0[0], ap0[1], 1.0]), (4000, 1))
    r = np.asarray(dj.simulate_phases_batch(jax.random.key(1), model, x, jnp.zeros(4000)))
    assert np.all(np.isfinite(r))
    assert stats.kstest(r[:, 0], stats.uniform(-np.pi, 2 * np.pi).cdf).pvalue > 1e-3
    # the other APs keep the stream of eq. (8): their phases as with AP 0 facing down too
    down = dj.TwoRayModel(sc.replace(antenna=dj.CosinePattern(1.0)))
    same = dj.simulate_phases_batch(jax.random.key(1), down, x[:5], jnp.zeros(5))
    np.testing.assert_array_equal(r[:5, 1:], np.asarray(same)[:, 1:])


def test_labeled_snapshots_are_the_three_draws_of_one_key():
    scene = dj.paper_scene()
    truth = dj.TwoRayModel(scene)
    k_x, k_cpo, k_noise = jax.random.split(jax.random.key(7), 3)
    x = dj.sample_positions(k_x, 6, scene)
    cpo = dj.random_cpos(k_cpo, 6)
    r = dj.simulate_phases_batch(k_noise, truth, x, cpo)
    got = dj.measure.labeled_snapshots(jax.random.key(7), scene, 6)
    np.testing.assert_array_equal(got.x, x)
    np.testing.assert_array_equal(got.cpo, cpo)
    np.testing.assert_array_equal(got.r, r)
    np.testing.assert_allclose(got.variance, jax.vmap(truth.variance)(x), rtol=1e-14)
    # a given position and CPO replace their draws; the noise draw is the same key's
    fixed = dj.measure.labeled_snapshots(jax.random.key(7), truth, 6, x=x[0], cpo=0.5)
    np.testing.assert_array_equal(fixed.x, jnp.broadcast_to(x[0], (6, 3)))
    expected = dj.simulate_phases_batch(k_noise, truth, fixed.x, jnp.full(6, 0.5))
    np.testing.assert_array_equal(fixed.r, expected)
    with pytest.raises(ValueError, match="num"):
        dj.measure.labeled_snapshots(jax.random.key(0), scene, 0)
    with pytest.raises(ValueError, match="x: expected shape"):
        dj.measure.labeled_snapshots(jax.random.key(0), scene, 4, x=jnp.zeros((3, 3)))
    with pytest.raises(ValueError, match="cpo"):
        dj.measure.labeled_snapshots(jax.random.key(0), scene, 4, cpo=jnp.zeros(3))
