"""Complex snapshots with receiver impairments (dmimo_jax.receivers) and their calibration."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import dmimo_jax as dj
from dmimo_jax import receivers as rx
from dmimo_jax.calibration import Positions, Unlabeled, calibrate, receivers_closed_form

SCENE = dj.paper_scene(-10.0, convention="itu")
MODEL = dj.TwoRayModel(SCENE)
X = jnp.asarray([4.0, 5.0, 1.5])


def test_ideal_receivers_are_the_phase_only_model():
    """arg h of ideal receivers is the model's phase + CPO (to 1e-12), |h| is sqrt(P) alpha."""
    h = rx.expected_snapshot(MODEL, X, rx.ideal_receivers(17), jnp.exp(0.7j))
    np.testing.assert_array_less(np.abs(dj.wrap(jnp.angle(h) - MODEL.mean(X) - 0.7)), 1e-12)
    alpha = jnp.sqrt(SCENE.tx_power) * dj.physics.effective_amplitude(X, SCENE)
    np.testing.assert_allclose(np.abs(h), alpha, rtol=1e-12)


def test_snapshots_against_an_independent_computation():
    """h = s G e^{j(2 pi d1 / lambda - arg(1 + rho))} sqrt(P) lambda |1 + rho| / (4 pi d1) + b
    in plain NumPy, and the noise: CN(0, sigma_w^2)."""
    recv = rx.random_receivers(jax.random.key(0), MODEL)
    xs = np.asarray(dj.sample_positions(jax.random.key(1), 5, SCENE))
    s = np.exp(1j * np.linspace(0, 2, 5)) * 0.8
    ap, lam = np.asarray(SCENE.ap_positions), float(SCENE.wavelength)
    d1 = np.linalg.norm(xs[:, None] - ap[None], axis=-1)
    image = ap * np.array([1, 1, -1.0])
    d2 = np.linalg.norm(xs[:, None] - image[None], axis=-1)
    cos_g = (xs[:, None, 2] + ap[None, :, 2]) / d2
    eps = complex(SCENE.eps_r)
    root = np.sqrt(eps - (1 - cos_g**2))
    gamma = (cos_g - root) / (cos_g + root)  # TE
    rho = gamma * d1 / d2 * np.exp(-1j * 2 * np.pi / lam * (d2 - d1))
    c = np.sqrt(float(SCENE.tx_power)) * lam / (4 * np.pi * d1) * np.abs(1 + rho)
    c = c * np.exp(1j * (2 * np.pi * d1 / lam - np.angle(1 + rho)))
    expect = s[:, None] * np.asarray(recv.gains) * c + np.asarray(recv.constants)
    got = jax.vmap(lambda x, sn: rx.expected_snapshot(MODEL, x, recv, sn))(jnp.asarray(xs), s)
    np.testing.assert_allclose(np.asarray(got), expect, rtol=1e-9)
    many = jnp.tile(jnp.asarray(xs[:1]), (4000, 1))
    h = rx.simulate_snapshots(jax.random.key(2), MODEL, many, recv, jnp.full(4000, s[0]))
    w = (np.asarray(h) - expect[0]).ravel() / np.sqrt(float(SCENE.noise_power) / 2)
    for part in (w.real, w.imag):
        assert stats.kstest(part, "norm").pvalue > 1e-3


def test_complex_fim_equals_finite_differences_and_adds_the_amplitude():
    recv = rx.random_receivers(jax.random.key(0), MODEL)
    s0 = 1.3 * np.exp(0.4j)

    def nu(eta):
        return (eta[3] + 1j * eta[4]) * recv.gains * rx.channel(MODEL, eta[:3])

    eta = np.r_[np.asarray(X), s0.real, s0.imag]
    d = np.zeros((17, 5), complex)
    for i in range(5):
        step = np.zeros(5)
        step[i] = 1e-6
        d[:, i] = (
            np.asarray(nu(jnp.asarray(eta + step))) - np.asarray(nu(jnp.asarray(eta - step)))
        ) / 2e-6
    full = 2 / float(SCENE.noise_power) * np.real(d.conj().T @ d)
    expect = full[:3, :3] - full[:3, 3:] @ np.linalg.solve(full[3:, 3:], full[3:, :3])
    got = np.asarray(dj.bounds.complex_fim(X, MODEL, recv, s0))
    np.testing.assert_allclose(got, expect, rtol=1e-6, atol=1e-6 * np.abs(expect).max())
    # ideal receivers: the phases' information plus the amplitudes', so the PEB is lower
    ideal = float(dj.bounds.complex_peb(X, MODEL, rx.ideal_receivers(17)))
    assert ideal < float(dj.peb(X, MODEL))
    # a known additive constant costs nothing
    with_b = rx.Receivers(np.ones(17), recv.constants)
    assert float(dj.bounds.complex_peb(X, MODEL, with_b)) == pytest.approx(ideal, rel=1e-12)


def _world(seed=3):
    real = dj.perturb_deployment(
        jax.random.key(seed), SCENE, position_std=1e-2, random_offsets=False
    )
    truth = dj.TwoRayModel(real)
    recv = rx.random_receivers(jax.random.key(seed + 1), truth)
    x = dj.sample_positions(jax.random.key(0), 50, SCENE)
    s = 1.3 * jnp.exp(1j * dj.random_cpos(jax.random.key(1), 50))
    return real, truth, recv, x, s


FIT = ("ap_positions", "receiver_gains", "receiver_constants")


@pytest.mark.slow
def test_gains_constants_and_phase_centres_from_noise_free_snapshots():
    real, truth, recv, x, s = _world()
    h = jax.vmap(lambda xx, ss: rx.expected_snapshot(truth, xx, recv, ss))(x, s)
    nv = jnp.full(h.shape, float(SCENE.noise_power))
    cal = calibrate(MODEL, x, h, nv, fit=FIT, warn=False)
    np.testing.assert_allclose(cal.values["ap_positions"], real.ap_positions, atol=1e-6)
    gains = np.asarray(recv.gains) / complex(recv.gains[0])  # the gauge: G_0 = 1
    np.testing.assert_allclose(cal.values["receiver_gains"], gains, atol=1e-6)
    np.testing.assert_allclose(cal.values["receiver_constants"], recv.constants, atol=1e-9)
    assert cal.receivers is not None and float(cal.reduced_chi2) < 1e-6


@pytest.mark.slow
def test_complex_calibration_with_noise_is_honest():
    real, truth, recv, x, s = _world(5)
    h = rx.simulate_snapshots(jax.random.key(6), truth, x, recv, s)
    nv = jnp.full(h.shape, float(SCENE.noise_power))
    cal = calibrate(MODEL, x, h, nv, fit=FIT)
    assert cal.status == "converged"
    z = (np.asarray(cal.values["ap_positions"]) - np.asarray(real.ap_positions)) / np.asarray(
        cal.stderr["ap_positions"]
    )
    assert 0.7 < np.sqrt(np.mean(z**2)) < 1.3 and np.abs(z).max() < 5


@pytest.mark.slow
def test_complex_unlabeled_snapshots_noise_free_and_a_wrong_lobe_left_out():
    """Complex snapshots at unknown positions (starts 1 mm off) calibrate G, b and the phase
    centres with 15 labels to 1e-6, their positions come back; one more start half a metre
    off (another lobe) fails the cost screen; each used snapshot adds 2M - 5 dof."""
    real, truth, recv, x, s = _world()
    n_l, n_u = 15, 30

    def snapshots(xs, ss):
        return jax.vmap(lambda xx, sx: rx.expected_snapshot(truth, xx, recv, sx))(xs, ss)

    x_u = np.vstack([np.asarray(x[n_l : n_l + n_u]), np.asarray(x[n_l : n_l + 1])])
    h_u = snapshots(jnp.asarray(x_u), jnp.append(s[n_l : n_l + n_u], s[0]))
    x0 = x_u + np.random.default_rng(4).normal(0, 1e-3, x_u.shape)
    x0[n_u, 0] += 0.5
    nv = float(SCENE.noise_power)
    unlabeled = Unlabeled(h_u, np.full(h_u.shape, nv), x0)
    h = snapshots(x[:n_l], s[:n_l])
    cal = calibrate(
        MODEL, x[:n_l], h, jnp.full(h.shape, nv), fit=FIT, unlabeled=unlabeled, warn=False
    )
    np.testing.assert_array_equal(cal.unlabeled_used, np.arange(n_u + 1) < n_u)
    np.testing.assert_allclose(cal.values["ap_positions"], real.ap_positions, atol=1e-6)
    gains = np.asarray(recv.gains) / complex(recv.gains[0])
    np.testing.assert_allclose(cal.values["receiver_gains"], gains, atol=1e-6)
    np.testing.assert_allclose(cal.values["receiver_constants"], recv.constants, atol=1e-9)
    np.testing.assert_allclose(cal.unlabeled_x[:n_u], x_u[:n_u], atol=1e-6)
    m = SCENE.num_aps
    params = 3 * m + 2 * (m - 1) + 2 * m
    assert cal.dof == 2 * (n_l * m - n_l) - params + n_u * (2 * m - 5)
    assert float(cal.reduced_chi2) < 1e-6
    with pytest.raises(ValueError, match="unlabeled.r must be of the labeled snapshots' kind"):
        calibrate(
            MODEL,
            x[:n_l],
            h,
            jnp.full(h.shape, nv),
            fit=FIT,
            unlabeled=Unlabeled(np.angle(h_u), np.full(h_u.shape, nv), x0),
        )


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_per_ap_normal_equations_equal_autodiffs():
    """The calibration's normal equations by column compression (7 tangents for 17 APs'
    gains, constants and phase centres, a prior, unequal variances) are those of jax.jacfwd's
    Jacobian; a group that moves every AP (phase offsets) or phase data gets no structure."""
    from dmimo_jax.calibration import groups as grp
    from dmimo_jax.calibration import offsets_closed_form, solver

    real, truth, recv, x, s = _world()
    h = rx.simulate_snapshots(jax.random.key(6), truth, x[:20], recv, s[:20])
    model = rx.ReceiverModel(MODEL, recv)
    on = grp.Deployment(model, x[:20], h, None)
    groups = (
        grp.Positions(prior=0.05, start=np.asarray(real.ap_positions)).build(on),
        grp.ReceiverGains().build(on),
        grp.ReceiverConstants().build(on),
    )
    u0 = jnp.concatenate([g.u0 for g in groups])
    u = u0 + 1e-3 * jax.random.normal(jax.random.key(9), u0.shape)
    nv = float(SCENE.noise_power) * jnp.broadcast_to(jnp.linspace(0.5, 2.0, 17), h.shape)
    structure = solver.per_ap_structure(model, groups)
    assert structure[0].shape == (7, u.shape[0])
    d = grp.Deployment(model, x[:20], h, nv)
    jac = jax.jacfwd(lambda v: solver.residuals(v, d, groups))(u)
    e = solver.residuals(u, d, groups)
    # the labeled residuals in plain NumPy: the snapshot factor weighted by the variances
    m = solver.apply_groups(model, groups, u)
    v = np.asarray(jax.vmap(m.channel)(x[:20]))
    y = np.asarray(h) - np.asarray(m.receivers.constants)[None, :]
    var = np.asarray(nv)
    s_ml = np.sum(np.conj(v) * y / var, axis=1) / np.sum(np.abs(v) ** 2 / var, axis=1)
    z = (y - s_ml[:, None] * v) / np.sqrt(var / 2)
    expect_e = np.stack([z.real, z.imag], axis=-1).reshape(-1)
    np.testing.assert_allclose(np.asarray(e[: expect_e.size]), expect_e, rtol=1e-9, atol=1e-12)
    ata, atg = solver.per_ap_normal(u, d, groups, structure)
    expect_a, expect_g = jac.T @ jac, jac.T @ e
    np.testing.assert_allclose(
        ata, expect_a, rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(expect_a)))
    )
    np.testing.assert_allclose(
        atg, expect_g, rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(expect_g)))
    )
    offsets = grp.Offsets().at(offsets_closed_form(MODEL, x[:20], jnp.angle(h)))
    assert solver.per_ap_structure(model, (*groups, offsets)) is None
    assert solver.per_ap_structure(MODEL, groups[:1]) is None


@pytest.mark.slow
def test_position_start_reaches_the_same_map_estimate():
    """Started from the true phase centres (1 cm from the listed ones) instead of the listed
    ones, the MAP fit under a 5 mm survey prior ends where the default start does: the prior
    stays centred on the listed positions."""
    real, truth, recv, x, s = _world(5)
    h = rx.simulate_snapshots(jax.random.key(6), truth, x, recv, s)
    nv = jnp.full(h.shape, float(SCENE.noise_power))
    rest = tuple(f for f in FIT if f != "ap_positions")
    default = calibrate(MODEL, x, h, nv, fit=(Positions(prior=5e-3), *rest), warn=False)
    started = calibrate(
        MODEL, x, h, nv, fit=(Positions(prior=5e-3, start=real.ap_positions), *rest), warn=False
    )
    assert default.status == started.status == "converged"
    atol = 1e-8
    np.testing.assert_allclose(
        started.values["ap_positions"], default.values["ap_positions"], atol=atol
    )
    # the check has power: a prior centred on the start (here the truth) ends farther off
    # than the tolerance (measured: 4.5e-7 m, 45x it)
    centred_on_start = calibrate(
        dj.TwoRayModel(real), x, h, nv, fit=(Positions(prior=5e-3), *rest), warn=False
    )
    moved = np.asarray(centred_on_start.values["ap_positions"]) - default.values["ap_positions"]
    assert np.max(np.abs(moved)) > 10 * atol


def test_complex_calibration_refuses_mixed_requests():
    real, truth, recv, x, s = _world()
    h = jax.vmap(lambda xx, ss: rx.expected_snapshot(truth, xx, recv, ss))(x, s)
    nv = jnp.full(h.shape, float(SCENE.noise_power))
    with pytest.raises(ValueError, match="receiver_gains"):
        calibrate(MODEL, x, h, nv, fit=("ap_phase_offsets",))
    with pytest.raises(ValueError, match="need complex snapshots"):
        calibrate(MODEL, x, jnp.angle(h), nv, fit=("receiver_gains",))
    with pytest.raises(ValueError, match="h complex of shape"):
        receivers_closed_form(MODEL, x, jnp.angle(h))
    with pytest.raises(ValueError, match="gains and constants must both have shape"):
        rx.Receivers(np.ones(17), np.zeros(16))
    with pytest.raises(ValueError, match="gains must be non-zero"):
        rx.Receivers(np.zeros(17))


def _weighted_model():
    recv = rx.random_receivers(jax.random.key(3), MODEL)
    return rx.ReceiverModel(MODEL, recv)


def test_whiten_gives_the_weighted_least_squares_residuals():
    """The profiled residuals of the whitened pair are Sigma^{-1/2}(h - b - s v) with the
    weighted snapshot factor s = v^H Sigma^-1 (h - b) / v^H Sigma^-1 v (plain NumPy)."""
    model = _weighted_model()
    rng = np.random.default_rng(0)
    var = rng.uniform(0.2, 5.0, 17)
    h = np.asarray(rx.expected_snapshot(MODEL, X, model.receivers, 0.9j))
    h = h + 0.3 * np.abs(h).mean() * (rng.normal(size=17) + 1j * rng.normal(size=17))
    wm, hw = rx.whiten(model, h, var)
    res, s_hat = rx.profiled_residuals(hw, wm.channel(X), wm.receivers.constants)
    v, y = np.asarray(model.channel(X)), h - np.asarray(model.receivers.constants)
    s_gls = np.sum(np.conj(v) * y / var) / np.sum(np.abs(v) ** 2 / var)
    np.testing.assert_allclose(complex(s_hat), s_gls, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(res), (y - s_gls * v) / np.sqrt(var), rtol=1e-10)
    # the weighted factor directly (calibrate's likelihood): the same, residuals unwhitened
    res_w, s_w = rx.profiled_residuals(h, v, model.receivers.constants, var)
    np.testing.assert_allclose(complex(s_w), s_gls, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(res_w), y - s_gls * v, rtol=1e-10)
    assert abs(complex(rx.profiled_residuals(h, v, model.receivers.constants)[1]) - s_gls) > 1e-3
    # equal variances: the same snapshot factor and residuals up to the common scale
    wm, hw = rx.whiten(model, h, np.full(17, 4.0))
    res4, s4 = rx.profiled_residuals(hw, wm.channel(X), wm.receivers.constants)
    res1, s1 = rx.profiled_residuals(h, model.channel(X), model.receivers.constants)
    np.testing.assert_allclose(complex(s4), complex(s1), rtol=1e-12)
    np.testing.assert_allclose(2 * np.asarray(res4), np.asarray(res1), rtol=1e-10, atol=1e-18)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_whitened_search_is_more_accurate_under_unequal_noise():
    """Half the receivers 100x noisier (in variance): the whitened complex search's RMSE is
    below the unweighted one's, and equal variances change no position."""
    model = _weighted_model()
    key = jax.random.key(4)
    xs = np.asarray(X) + np.asarray(jax.random.uniform(key, (64, 3), minval=-0.02, maxval=0.02))
    xs[:, 2] = float(X[2])
    h0 = jax.vmap(lambda x: rx.expected_snapshot(MODEL, x, model.receivers, 1.0))(jnp.asarray(xs))
    pilot = float(np.median(np.abs(np.asarray(h0))))
    var = np.where(np.arange(17) % 2 == 0, 1.0, 100.0) * (0.03 * pilot) ** 2
    rng = np.random.default_rng(1)
    w = (rng.normal(size=(64, 17)) + 1j * rng.normal(size=(64, 17))) * np.sqrt(var / 2)
    h = np.asarray(h0) + w
    half = np.array([0.1, 0.1, 0.0025])
    grid = dj.estimators.make_grid(np.asarray(X) - half, np.asarray(X) + half, 0.005)
    plain = np.asarray(dj.estimators.complex_search(model, grid, h).x)
    wm, hw = rx.whiten(model, h, var)
    weighted = np.asarray(dj.estimators.complex_search(wm, grid, hw).x)
    rmse = [np.sqrt(np.mean(np.sum((e - xs)[:, :2] ** 2, axis=1))) for e in (plain, weighted)]
    assert rmse[1] < 0.8 * rmse[0], rmse
    wm, hw = rx.whiten(model, h, np.full(17, 3.0))
    same = np.asarray(dj.estimators.complex_search(wm, grid, hw).x)
    np.testing.assert_allclose(same, plain, atol=1e-9)


@pytest.mark.parametrize(
    "h, var, match",
    [
        (np.ones(17), np.ones(17), "complex"),
        (np.ones(16, complex), np.ones(17), "shape"),
        (np.ones(17, complex), np.ones(16), "noise_var"),
        (np.ones(17, complex), np.r_[0.0, np.ones(16)], "positive"),
        (np.ones(17, complex), np.r_[np.nan, np.ones(16)], "noise_var"),
    ],
)
def test_whiten_rejects_bad_input(h, var, match):
    with pytest.raises(ValueError, match=match):
        rx.whiten(_weighted_model(), h, var)
    with pytest.raises(ValueError, match="ReceiverModel"):
        rx.whiten(MODEL, np.ones(17, complex), np.ones(17))


def _unequal_noise_snapshots(seed=5, spread=9.0):
    """_world's snapshots with complex noise whose variance is the scene's on the even
    receivers and ``spread`` times it on the odd ones."""
    real, truth, recv, x, s = _world(seed)
    h0 = np.asarray(jax.vmap(lambda xx, ss: rx.expected_snapshot(truth, xx, recv, ss))(x, s))
    var = float(SCENE.noise_power) * np.where(np.arange(17) % 2 == 0, 1.0, spread)
    rng = np.random.default_rng(seed)
    w = (rng.normal(size=h0.shape) + 1j * rng.normal(size=h0.shape)) * np.sqrt(var / 2)
    return real, np.asarray(x), h0 + w, var


@pytest.mark.slow
def test_calibrate_receivers_measures_each_receivers_variance_and_the_phase_centres():
    """Receivers 9x noisier on odd APs: the recipe's variances find the ratio and the scale,
    and the phase centres end nearer the truth than the listed positions (1 cm off).

    Measured on noise draws 5, 6, 8, 9: odd / even 9.69, 8.66, 9.80, 10.02; the quiet
    receivers' mean 0.91-1.00 of their truth, the noisy ones' 0.96-1.04; each receiver within
    0.60-1.32 of its truth; phase centres to 1e-5-3e-5 m (median). With the snapshot factor
    fitted unweighted (as before the maximum-likelihood one) the noisy receivers' noise
    reached the quiet ones' residuals: their mean came out 1.12 and 1.16 (draws 5, 6), the
    ratio 7.2-7.9."""
    real, x, h, var = _unequal_noise_snapshots()
    out = dj.calibration.calibrate_receivers(MODEL, x, h)
    assert out.calibration.status == "converged"
    ratio = np.asarray(out.noise_var) / var
    assert np.all((ratio > 0.55) & (ratio < 1.45)), ratio  # each receiver's, within its spread
    assert 0.85 < np.exp(np.mean(np.log(ratio))) < 1.15
    assert 0.88 < np.mean(ratio[0::2]) < 1.08  # the quiet ones: no leak from the noisy
    assert 0.88 < np.mean(ratio[1::2]) < 1.12
    odd, even = np.asarray(out.noise_var)[1::2], np.asarray(out.noise_var)[0::2]
    assert 8.0 < np.mean(odd) / np.mean(even) < 11.0
    fitted = np.asarray(out.calibration.values["ap_positions"])
    listed = np.linalg.norm(np.asarray(SCENE.ap_positions) - real.ap_positions, axis=1)
    error = np.linalg.norm(fitted - real.ap_positions, axis=1)
    assert np.median(error) < 0.3 * np.median(listed), (error, listed)
    assert isinstance(out.model, rx.ReceiverModel)
    np.testing.assert_allclose(out.model.scene.ap_positions, fitted)


@pytest.mark.slow
def test_calibrate_receivers_counts_a_spot_once():
    """Snapshot 0 repeated 20 times (a still rover's copies): the receivers fitted equal
    those of the snapshots without copies, where a fit that counts every copy moves."""
    _, x, h, _ = _unequal_noise_snapshots(7)
    xc, hc = np.r_[np.repeat(x[:1], 20, 0), x], np.r_[np.repeat(h[:1], 20, 0), h]
    once = dj.calibration.calibrate_receivers(MODEL, x, h, phase_centres=False)
    copies = dj.calibration.calibrate_receivers(MODEL, xc, hc, phase_centres=False)
    tol = 1e-8 * np.max(np.abs(once.calibration.values["receiver_constants"]))
    for group in ("receiver_gains", "receiver_constants"):
        np.testing.assert_allclose(
            copies.calibration.values[group], once.calibration.values[group], rtol=1e-7, atol=tol
        )
    # the variances differ by one common factor (the chi-square's degrees of freedom)
    scale = np.asarray(copies.noise_var) / np.asarray(once.noise_var)
    np.testing.assert_allclose(scale, scale[0], rtol=1e-6)

    # the check has power: counting every copy moves the fit far beyond the tolerance
    def plain(xs, hs):
        cal = calibrate(MODEL, xs, hs, np.ones(hs.shape), fit=FIT[1:], warn=False)
        return np.asarray(cal.values["receiver_constants"])

    assert np.max(np.abs(plain(xc, hc) - plain(x, h))) > 1e3 * tol


def test_calibrate_receivers_and_spot_counts_reject_bad_input():
    x = np.asarray(dj.sample_positions(jax.random.key(0), 4, SCENE))
    h = np.ones((4, 17), complex)
    with pytest.raises(ValueError, match="h must be complex"):
        dj.calibration.calibrate_receivers(MODEL, x, np.ones((4, 17)))
    with pytest.raises(ValueError, match="position_prior"):
        dj.calibration.calibrate_receivers(MODEL, x, h, position_prior=0.0)
    with pytest.raises(ValueError, match="spot_radius"):
        dj.calibration.calibrate_receivers(MODEL, x, h, spot_radius=0.0)
    for wrong in (np.ones((5, 17), complex), np.ones(17, complex), np.ones((4, 16), complex)):
        with pytest.raises(ValueError, match=r"h must have shape \(4, 17\)"):
            dj.calibration.calibrate_receivers(MODEL, x, wrong)
    with pytest.raises(ValueError, match="radius"):
        dj.calibration.spot_counts(x, radius=-1.0)
    with pytest.raises(ValueError, match="x"):
        dj.calibration.spot_counts(x[:, :2])
    np.testing.assert_array_equal(dj.calibration.spot_counts(np.r_[x, x[:1]]), [2, 1, 1, 1, 2])


def test_receiver_models_and_their_arguments_are_refused_by_name():
    """Each case once accepted silently (a broadcast error later, gains applied twice, a NaN,
    plausible values from a negative variance or a dropped imaginary part)."""
    recv = rx.random_receivers(jax.random.key(0), MODEL)
    with pytest.raises(ValueError, match="receivers are for 16 APs, the model has 17"):
        rx.ReceiverModel(MODEL, rx.Receivers(recv.gains[:16], recv.constants[:16]))
    for bad in ("two-ray", (MODEL,)):
        with pytest.raises(ValueError, match="model must be a Scene or a PhaseModel"):
            rx.ReceiverModel(bad, recv)
    model = rx.ReceiverModel(MODEL, recv)
    with pytest.raises(ValueError, match="already a ReceiverModel"):
        rx.ReceiverModel(model, recv)
    for name in ("gain_db_std", "constant_ratio"):
        with pytest.raises(ValueError, match=f"{name} must be >= 0"):
            rx.random_receivers(jax.random.key(0), MODEL, **{name: -1.0})
        with pytest.raises(ValueError, match=f"{name} must be finite"):
            rx.random_receivers(jax.random.key(0), MODEL, **{name: float("nan")})
    xs = dj.sample_positions(jax.random.key(1), 3, SCENE)
    with pytest.raises(ValueError, match="gains would apply twice"):
        rx.simulate_snapshots(jax.random.key(2), model, xs, recv, jnp.ones(3))
    h = rx.simulate_snapshots(jax.random.key(2), MODEL, xs, recv, jnp.ones(3))
    v = jax.vmap(model.channel)(xs)
    for var, match in [
        (0.0, "noise_var must be positive"),
        (-1.0, "noise_var must be positive"),
        (jnp.ones(17) * (1 + 1j), "noise_var must be real"),
        (jnp.ones(16), r"noise_var must broadcast to \(3, 17\)"),
    ]:
        with pytest.raises(ValueError, match=match):
            rx.profiled_residuals(h, v, recv.constants, var)
    with pytest.raises(ValueError, match="h and v must have the same shape"):
        rx.profiled_residuals(h, v[:, :16], recv.constants)
    with pytest.raises(ValueError, match="b must broadcast"):
        rx.profiled_residuals(h, v, recv.constants[:16])
    with pytest.raises(ValueError, match="noise_var must be real"):
        rx.whiten(model, h, jnp.ones(17) * (1 + 0.5j))
    noise_var = jnp.ones((3, 17)) * 1e-6
    with pytest.raises(ValueError, match="noise_var must be real"):
        calibrate(MODEL, xs, h, noise_var * (1 + 1j), fit="receiver_gains")


def test_a_dead_receiver_and_a_snapshot_without_pilot_are_named():
    recv = rx.random_receivers(jax.random.key(0), MODEL)
    model = rx.ReceiverModel(MODEL, recv)
    xs = dj.sample_positions(jax.random.key(1), 20, SCENE)
    h = np.array(rx.simulate_snapshots(jax.random.key(2), MODEL, xs, recv, jnp.ones(20)))
    h[:, 5] = 0
    var = np.ones((20, 17)) * float(SCENE.noise_power)
    with pytest.raises(ValueError, match=r"r: the receivers of AP\(s\) \[5\] measured exactly 0"):
        calibrate(MODEL, xs, h, var, fit="receiver_gains")
    grid = dj.estimators.search_grid(SCENE, 0.2)
    h = np.array(rx.simulate_snapshots(jax.random.key(2), MODEL, xs[:3], recv, jnp.ones(3)))
    h[1] = np.asarray(recv.constants)  # no pilot: nothing but the constants
    with pytest.raises(ValueError, match=r"h: snapshot\(s\) \[1\] carry no pilot"):
        dj.estimators.complex_search(model, grid, h)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_complex_peb_checks_its_position_and_survives_an_ap_that_sees_nothing():
    """An AP the scene hides completely (a metal plate under it) drops out of the complex
    bound as it does from the phase-only one (finite, and at most the phase-only PEB: the
    amplitudes only add information); it was inf (a NaN Jacobian) before."""
    from dmimo_jax.datasets.worlds import face_scene

    ideal = rx.ideal_receivers(17)
    for x, match in [
        (jnp.zeros((2, 3)) + 1.0, r"x must have shape \(3,\)"),
        (jnp.asarray([4.0, jnp.nan, 1.0]), "x must be finite"),
        (jnp.asarray([4.0, 5.0, -1.5]), "above the ground"),
        (SCENE.ap_positions[3], "x"),
    ]:
        with pytest.raises(ValueError, match=match):
            dj.bounds.complex_peb(x, MODEL, ideal)
    for s, match in [
        (jnp.nan, "s must be finite"),
        (0.0, "s must be non-zero"),
        (jnp.ones(2), "s must be one"),
    ]:
        with pytest.raises(ValueError, match=match):
            dj.bounds.complex_peb(X, MODEL, ideal, s)
    base = face_scene(SCENE)
    with pytest.raises(ValueError, match="x"):  # inside the pillar
        dj.bounds.complex_peb(jnp.asarray([6.0, 4.5, 1.0]), base, ideal)
    ap = np.asarray(SCENE.ap_positions)[3]
    z = ap[2] - 0.3
    corners = [[-3, -2.5], [3, -2.5], [3, 2.5], [-3, 2.5]]
    plate = dj.Face([[ap[0] + a, ap[1] + b, z] for a, b in corners], None, name="plate")
    model = dj.MeshModel(SCENE, [*base.faces, plate.flipped()])
    x = jnp.asarray([4.0, 5.0, 1.0])
    assert not np.isfinite(float(model.variance(x)[3]))  # AP 3 hears nothing there
    jac = jax.jacfwd(lambda p: rx.channel(model, p))(x)
    assert np.all(np.isfinite(np.asarray(jac))) and np.all(np.asarray(jac[3]) == 0)
    complex_bound = float(dj.bounds.complex_peb(x, model, ideal))
    phase_bound = float(dj.peb(x, model))
    assert np.isfinite(complex_bound) and complex_bound <= phase_bound
