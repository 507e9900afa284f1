"""Moving UEs: motion models, the tracking filter, the posterior bound (dmimo_jax.tracking)."""

import dataclasses
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import tracking
from dmimo_jax.tracking import TrackerSettings as Settings
from dmimo_jax.tracking.kalman import position_update
from tests.helpers import xla_optimized

# the filters scan hundreds of steps: their run time, not their compilation, costs here
pytestmark = pytest.mark.optimized

DT = 0.01
SCENE = dj.paper_scene(-10.0)
MODEL = dj.TwoRayModel(SCENE)
WALK = tracking.ConstantVelocity(1.0, region=SCENE)
LAM = float(SCENE.wavelength)


def _walks(key, num_ues, num_steps):
    """Walking paths (1.5 m/s, random heading) and their snapshots (N, T, M)."""
    k_x, k_dir, k_path, k_snap = jax.random.split(key, 4)
    x0 = dj.sample_positions(k_x, num_ues, SCENE)
    heading = jax.random.uniform(k_dir, (num_ues,), maxval=2 * np.pi)
    v0 = 1.5 * jnp.stack([jnp.cos(heading), jnp.sin(heading), jnp.zeros(num_ues)], axis=1)
    sim = jax.vmap(tracking.simulate_trajectory, in_axes=(0, None, 0, 0, None, None))
    path = sim(jax.random.split(k_path, num_ues), WALK, x0, v0, num_steps, DT)
    snap = jax.vmap(tracking.simulate_track_phases, in_axes=(0, None, 0))
    r = snap(jax.random.split(k_snap, num_ues), MODEL, path.positions)
    return path, r


def test_position_update_is_the_information_form():
    # Woodbury form of kalman.py == ((P^-)^-1 + S^T J S)^-1, with a singular J
    rng = np.random.default_rng(0)
    a = rng.normal(size=(6, 6))
    cov = a @ a.T + 0.1 * np.eye(6)
    h = rng.normal(size=(2, 3))
    info = h.T @ h * 1e3  # rank 2
    gain, post = position_update(jnp.asarray(cov), jnp.asarray(info))
    s = np.eye(6)[:3]
    expect = np.linalg.inv(np.linalg.inv(cov) + s.T @ info @ s)
    np.testing.assert_allclose(np.asarray(post), expect, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gain), expect @ s.T, rtol=1e-8, atol=1e-12)


def test_constant_velocity_noise_matches_simulation():
    # one-step increments of an unbounded path: mean F s, covariance Q (a wrong lever arm
    # or a missing dt would show as a factor of 2 or 100)
    motion = tracking.ConstantVelocity(2.0)
    path = tracking.simulate_trajectory(
        jax.random.PRNGKey(1), motion, jnp.array([0.0, 0.0, 1.0]), jnp.zeros(3), 20001, 0.1
    )
    s = np.concatenate([np.asarray(path.positions), np.asarray(path.velocities)], axis=1)
    f, q = np.asarray(motion.transition(0.1)), np.asarray(motion.process_noise(0.1))
    w = s[1:] - s[:-1] @ f.T
    emp = np.cov(w.T)
    np.testing.assert_allclose(np.diagonal(emp), np.diagonal(q), rtol=0.05)
    np.testing.assert_allclose(emp[0, 3], q[0, 3], rtol=0.05)  # position-velocity, dt^3/2
    np.testing.assert_allclose(q[0, 3], 4.0 * 0.1**3 / 2)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_paths_bounce_inside_the_region(walked):
    # the fixture's 20 walks (2 s at 1.5 m/s from random starts: 6 bounces)
    path = walked["path"]
    x = np.asarray(path.positions)
    assert np.all(x >= np.asarray(SCENE.ue_low)) and np.all(x <= np.asarray(SCENE.ue_high))
    # a bouncing path is the fold of the free one: positions mirrored, velocities by parity
    folded, parity = WALK.fold(path.free_positions)
    np.testing.assert_allclose(np.asarray(folded), x)
    par = np.asarray(parity)
    # a bounce (the parity of an axis changes between two steps) reverses that axis's velocity
    bounce = par[:, 1:, :2] * par[:, :-1, :2] < 0
    assert bounce.any()
    v = np.asarray(path.velocities)
    assert np.all(np.sign(v[:, 1:, :2])[bounce] == -np.sign(v[:, :-1, :2])[bounce])
    p, par = WALK.fold(jnp.array([9.51, 5.0, -0.5]))  # region [0.5, 9.5] x ... x [0.5, 3.5]
    np.testing.assert_allclose(np.asarray(p), [9.49, 5.0, 1.5], atol=1e-12)
    np.testing.assert_allclose(np.asarray(par), [-1.0, 1.0, -1.0])


def test_pcrb_of_a_static_ue_tends_to_peb_over_sqrt_k():
    x = jnp.array([6.5, 5.0, 2.0])
    still = tracking.RandomWalk(1e-9)
    k = 50
    bounds = tracking.pcrb(MODEL, still, jnp.tile(x, (k, 1)), DT, 1e2 * jnp.eye(3))
    rmse = np.asarray(tracking.pcrb_position_rmse(bounds))
    peb = float(dj.peb(x, MODEL))
    steps = np.array([1, 10, 50])
    np.testing.assert_allclose(rmse[steps - 1], peb / np.sqrt(steps), rtol=1e-4)


@pytest.fixture(scope="module")
def walked():
    """20 UEs walking 2 s at -10 dBm, tracked from their true start (+ 1 cm); all 20
    acquire at the same step (no UE waits for re-acquisition capacity)."""
    path, r = _walks(jax.random.PRNGKey(5), 20, 201)
    tracker = tracking.Tracker(MODEL, WALK, dt=DT, settings=Settings(reacquire_batch=20))
    x0 = path.positions[:, 0] + jnp.array([[0.01, -0.01, 0.005]])
    state = jax.vmap(lambda x: tracker.init(x, position_std=0.01))(x0)
    rs = jnp.swapaxes(r[:, 1:], 0, 1)
    with xla_optimized():  # the filter, compiled here first, runs in most tests below
        final, out = tracking.run_tracker(tracker, state, rs)
    return dict(path=path, r=r, rs=rs, tracker=tracker, state=state, final=final, out=out)


def test_noise_free_snapshots_converge_to_the_path(walked):
    # exact phases (no noise; a fresh CPO each), a filter that believes a tiny noise; the
    # fixture's paths (bounces included) and shapes (no new compilation)
    path = walked["path"]
    cpo = jax.random.uniform(jax.random.PRNGKey(4), (20, 201), minval=-np.pi, maxval=np.pi)
    r = dj.wrap(jax.vmap(jax.vmap(MODEL.mean))(path.positions) + cpo[..., None])
    tracker = tracking.Tracker(
        dj.TwoRayModel(dj.paper_scene(60.0)), WALK, dt=DT, settings=Settings(reacquire_batch=20)
    )
    x0 = path.positions[:, 0] + 1e-3
    state = jax.vmap(lambda x: tracker.init(x, position_std=3e-3, acquire=False))(x0)
    _, out = tracking.run_tracker(tracker, state, jnp.swapaxes(r[:, 1:], 0, 1))
    err = _errors(out, path)
    assert err[-100:].max() < 1e-6, err[-100:].max()


def _errors(out, path):
    true = np.swapaxes(np.asarray(path.positions[:, 1:]), 0, 1)
    return np.linalg.norm(np.asarray(out.position) - true, axis=-1)  # (T, N)


def test_tracker_is_consistent_and_reaches_the_pcrb(walked):
    out, path = walked["out"], walked["path"]
    true = np.swapaxes(np.asarray(path.positions[:, 1:]), 0, 1)
    e = (np.asarray(out.position) - true)[100:]  # after the first second
    nees = np.einsum("tni,tnij,tnj->tn", e, np.linalg.inv(np.asarray(out.position_cov[100:])), e)
    # NEES of the position is chi^2_3 (mean 3) and the NIS chi^2_(M-1) under lock; 2000
    # correlated samples each: 10% and 5% bands are > 4 standard errors of their means
    assert 2.7 < nees.mean() < 3.3, nees.mean()
    assert 15.2 < float(np.mean(out.nis[100:])) < 16.8
    bound = jax.vmap(lambda xs, c: tracking.pcrb(MODEL, WALK, xs, DT, c))(
        path.free_positions[:, 1:], walked["state"].cov
    )
    pcrb = np.asarray(tracking.pcrb_position_rmse(bound)).T[100:]
    ratio = np.sqrt(np.mean(np.sum(e**2, -1))) / np.sqrt(np.mean(pcrb**2))
    assert 0.9 < ratio < 1.1, ratio
    assert not np.any(np.asarray(out.lost))
    # confirmed lock after the first window, every UE
    assert np.all(np.asarray(out.locked)[100:])


@pytest.mark.slow
def test_chord_steps_land_where_relinearizing_does(walked):
    """With relinearize=False the second iteration keeps the first linearization (a chord
    step); the iterated EKF re-linearizes: through the acquisition and after, the two
    tracks differ by a small fraction of their error."""
    chord = tracking.Tracker(MODEL, WALK, dt=DT, settings=Settings(relinearize=False))
    rs = walked["rs"][:60]
    _, out = tracking.run_tracker(chord, walked["state"], rs)
    iterated = np.asarray(walked["out"].position[:60])
    err = _errors(walked["out"], walked["path"])[20:60]
    gap = np.linalg.norm(np.asarray(out.position) - iterated, axis=-1)[20:]
    assert gap.max() < 0.05 * np.sqrt(np.mean(err**2)), (gap.max(), np.sqrt(np.mean(err**2)))


@pytest.mark.slow
def test_long_steps_relinearize_and_short_steps_take_chords_per_ue():
    """In a named batch, the UE whose first step is long re-linearizes (the iterated EKF's
    answer) and the one whose step is short takes a chord step (relinearize=False's),
    each as it would alone."""
    from dmimo_jax.tracking.filter import correct

    default = tracking.Tracker(MODEL, WALK, dt=DT)  # chord_below = lambda / 100
    always = tracking.Tracker(MODEL, WALK, dt=DT, settings=Settings(chord_below=0.0))
    chords = tracking.Tracker(MODEL, WALK, dt=DT, settings=Settings(relinearize=False))
    x = jnp.array([[5.0, 5.0, 1.5], [6.0, 4.0, 1.2]])
    r = dj.wrap(jax.vmap(MODEL.mean)(x) + 0.3)  # noise-free, one CPO
    off = jnp.array([[2e-5, 0.0, 0.0], [0.0, 2e-2, 0.0]])  # short (20 um), long (2 cm)
    means = jnp.concatenate([x + off, jnp.zeros((2, 3))], axis=1)
    covs = jnp.broadcast_to(jnp.diag(jnp.array([1e-4] * 3 + [1.0] * 3)), (2, 6, 6))
    batch = jax.jit(jax.vmap(partial(correct, default, axis_name="ues"), axis_name="ues"))
    got = batch(means, covs, r)
    correct_one = jax.jit(correct)  # one program per tracker structure, not op by op
    for ue, like in [(0, chords), (1, always)]:
        alone = correct_one(like, means[ue], covs[ue], r[ue])
        for a, b in zip(got, alone, strict=True):
            b = np.asarray(b)  # to 1e-9 of each output's scale (rounding in a batch)
            np.testing.assert_allclose(np.asarray(a[ue]), b, rtol=0, atol=1e-9 * np.abs(b).max())
    # the choice matters for the long step: a chord lands ~1e-7 m elsewhere (measured
    # 9.4e-8), about 15 times what the comparison above tolerates (6e-9 m)
    chord_long = correct_one(chords, means[1], covs[1], r[1])[0][:3]
    relin_long = correct_one(always, means[1], covs[1], r[1])[0][:3]
    assert np.linalg.norm(np.asarray(chord_long - relin_long)) > 5e-8


@pytest.mark.newest  # compiled phases against the eager model's, to an ulp (CI's newest leg)
def test_phases_at_the_update_after_a_short_step_are_the_exact_ones():
    """The NIS's phases at the update: after a step under chord_below / 1000 (3.3 um)
    the last iteration's moved along the Jacobian, within 1e-9 rad of the model's; after
    a longer step the model's own."""
    from dmimo_jax.tracking.filter import linearize_update, phases_at_update

    tracker = tracking.Tracker(MODEL, WALK, dt=DT)
    x0 = jnp.array([5.0, 5.0, 1.5])
    lin = linearize_update(tracker, x0, jnp.ones(3), jnp.eye(6) * 1e-4)
    short, long = jnp.array([2e-6, -1e-6, 1.5e-6]), jnp.array([0.0, 4e-6, 0.0])
    exact = MODEL.mean(x0 + short)
    gap = np.abs(np.asarray(phases_at_update(tracker, lin, x0 + short, short) - exact))
    assert 0 < gap.max() < 1e-9, gap.max()  # linear, and close
    # the long step's: the model's own, to float64 rounding of a ~100 rad phase (a compiled
    # program may round an ulp (1.4e-14) away from the eager call: measured on jax 0.12);
    # the Jacobian's line would be 7.2e-11 rad off there, 72 times the tolerance
    exact = MODEL.mean(x0 + long)
    linear = lin.mean + lin.jacobian @ long
    assert np.abs(np.asarray(linear - exact)).max() > 5e-11
    np.testing.assert_allclose(
        phases_at_update(tracker, lin, x0 + long, long), exact, rtol=0, atol=1e-12
    )


@pytest.mark.slow
def test_chunks_of_ues_track_as_one_batch(walked):
    """run_tracker in chunks of UEs (padded: 20 = 8 + 8 + 4 + 4 copies) gives the one-batch
    answer when the re-acquisition capacity is not the limit (all 20 UEs acquire at the
    10th snapshot in both)."""
    final, parts = tracking.run_tracker(
        walked["tracker"], walked["state"], walked["rs"], ue_chunk=8
    )
    whole = walked["out"]
    for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(parts), strict=True):
        assert a.shape == b.shape
        np.testing.assert_allclose(
            np.asarray(a, float), np.asarray(b, float), rtol=1e-9, atol=1e-12
        )
    for a, b in zip(jax.tree.leaves(walked["final"]), jax.tree.leaves(final), strict=True):
        np.testing.assert_allclose(
            np.asarray(a, float), np.asarray(b, float), rtol=1e-9, atol=1e-12
        )


def test_update_matches_run_tracker(walked):
    tracker, state, rs, out = walked["tracker"], walked["state"], walked["rs"], walked["out"]
    s = jax.tree.map(lambda a: a[0], state)
    update = jax.jit(tracking.Tracker.update)
    for t in range(12):  # through the first acquisition (at the 10th snapshot)
        s = update(tracker, s, rs[t, 0])
    np.testing.assert_allclose(np.asarray(s.mean[:3]), np.asarray(out.position[11, 0]), rtol=1e-12)
    # a pytree: flatten/unflatten keeps the static settings
    leaves, treedef = jax.tree_util.tree_flatten(tracker)
    again = jax.tree_util.tree_unflatten(treedef, leaves)
    assert again.settings == tracker.settings and again.settings.window == 10
    # its fields are its constructor's arguments: a copy with another setting is checked,
    # the wavelength-relative defaults stored in metres
    lam = float(MODEL.scene.wavelength)
    assert tracker.settings.reacquire_spacing == lam / 8 and tracker.offsets.shape == (17**3, 3)
    wider = dataclasses.replace(tracker, settings=tracker.settings._replace(window=12))
    assert wider.settings.window == 12 and wider.nis_threshold > tracker.nis_threshold
    with pytest.raises(ValueError, match="window"):
        dataclasses.replace(tracker, settings=tracker.settings._replace(window=1))


def test_a_track_on_a_wrong_maximum_is_lost_and_reacquired(walked):
    # a locked track (velocity known to 0.1 m/s) that slipped half a wavelength (toward a
    # neighbouring maximum of the comb), confident of its position
    tracker, path, rs = walked["tracker"], walked["path"], walked["rs"]
    x0 = path.positions[:, 0] + jnp.array([[LAM / 2, 0.0, 0.0]])
    init = jax.vmap(
        lambda x, v: tracker.init(x, position_std=1e-4, velocity_std=0.1, v0=v, acquire=False)
    )
    _, out = tracking.run_tracker(tracker, init(x0, path.velocities[:, 0]), rs)
    err = _errors(out, path)
    wrong = err[0] > LAM / 4  # held on another maximum by the tight prior
    assert wrong.sum() >= 5, wrong.sum()
    assert np.all(np.asarray(out.reacquired)[:, wrong].any(axis=0))  # each restarted
    assert np.all(err[-100:] < 1e-3), err[-100:].max(axis=0)


def test_an_outage_is_bridged_and_reacquired(walked):
    tracker, path, rs = walked["tracker"], walked["path"], walked["rs"]
    valid = np.ones(rs.shape[:2], bool)
    valid[50:150] = False  # 1 s without snapshots
    _, out = tracking.run_tracker(tracker, walked["state"], rs, jnp.asarray(valid))
    err = _errors(out, path)
    assert err[149].max() > 1e-3  # dead reckoning drifted during the outage
    assert np.all(err[-20:] < 1e-3), err[-20:].max()


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: tracking.Tracker(MODEL, WALK, dt=0.0), "dt must be > 0"),
        (lambda: tracking.Tracker(MODEL, WALK, dt=-0.01), "dt must be > 0"),
        (lambda: tracking.ConstantVelocity(-1.0), "sigma_a must be >= 0"),
        (lambda: tracking.RandomWalk(float("nan")), "sigma must be finite"),
        (lambda: tracking.Tracker(MODEL, "cv", dt=DT), "motion must be a ConstantVelocity"),
        (
            lambda: tracking.Tracker(MODEL, WALK, dt=DT, settings=Settings(window=1)),
            "window must be",
        ),
        (
            lambda: tracking.Tracker(MODEL, WALK, dt=DT, settings=Settings(relinearize=1)),
            "relinearize",
        ),
        (lambda: tracking.Tracker(MODEL, WALK, dt=DT, settings={"window": 4}), "TrackerSettings"),
        (
            lambda: tracking.Tracker(MODEL, WALK, dt=DT, settings=Settings(chord_below=-1e-3)),
            "chord_below",
        ),
        (
            lambda: tracking.simulate_trajectory(
                jax.random.PRNGKey(0), WALK, jnp.array([20.0, 5.0, 1.0]), None, 10, DT
            ),
            "x0 must lie inside the region",
        ),
        (lambda: tracking.pcrb(MODEL, WALK, jnp.ones((5, 3)), DT, jnp.eye(3)), "prior_cov must"),
    ],
)
def test_bad_settings_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_snapshots_raise(walked):
    tracker, state, rs = walked["tracker"], walked["state"], walked["rs"]
    with pytest.raises(ValueError, match="r must be finite"):
        tracking.run_tracker(tracker, state, rs[:3].at[1, 2, 0].set(jnp.nan))
    with pytest.raises(ValueError, match="M = 17"):
        tracking.run_tracker(tracker, state, rs[:3, :, :16])
    with pytest.raises(ValueError, match="state must hold B = 3"):
        tracking.run_tracker(tracker, state, rs[:3, :3])
    with pytest.raises(ValueError, match="valid must be a bool array"):
        tracking.run_tracker(tracker, state, rs[:3], jnp.ones((3, 4), bool))
    one = jax.tree.map(lambda a: a[0], state)
    with pytest.raises(ValueError, match="r must be finite"):
        tracker.update(one, jnp.full(17, jnp.nan))
    with pytest.raises(ValueError, match=r"shape \(M,\)"):
        tracker.update(one, jnp.zeros(16))


def test_medoid_start_ignores_a_minority_of_wrong_maxima():
    truth = np.array([5.0, 5.0, 1.5])
    est = np.array(
        [
            truth + [0.001, 0, 0],
            truth + [3.0, 1.0, 0],
            truth,
            truth - [0, 0.002, 0],
            truth + [-2.0, 0.5, 0.3],
        ]
    )
    np.testing.assert_allclose(np.asarray(tracking.medoid_start(jnp.asarray(est))), truth)
    batch = np.stack([est, est[::-1]])
    np.testing.assert_allclose(
        np.asarray(tracking.medoid_start(jnp.asarray(batch))), [truth, truth]
    )
    with pytest.raises(ValueError, match="estimates must have shape"):
        tracking.medoid_start(jnp.zeros((4, 2)))
    with pytest.raises(ValueError, match="estimates must be finite"):
        tracking.medoid_start(jnp.asarray(est).at[0, 0].set(jnp.nan))


@pytest.mark.slow
def test_lattice_screen_returns_the_whole_lattice_argmin(walked):
    """lattice_argmin (the screen on the newest snapshots, then the whole window for the
    lowest bounds, the whole lattice if uncertified) == the brute-force argmin, for a
    screen that certifies and for one too small to (the fallback)."""
    from dmimo_jax.tracking.reacquire import lattice_argmin, lattice_costs

    tracker, path = walked["tracker"], walked["path"]
    # one UE at step 12 with a buffer full of snapshots: the lattice 2 cm off its path
    s = jax.tree.map(lambda a: a[0], walked["state"])
    update = jax.jit(tracking.Tracker.update)
    for t in range(12):
        s = update(tracker, s, walked["rs"][t, 0])
    # its newest snapshot taken half a wavelength away: alone it points elsewhere
    far = path.positions[0, 12] + jnp.array([LAM / 2, 0.0, 0.0])
    s = s._replace(recent_r=s.recent_r.at[-1].set(dj.wrap(MODEL.mean(far) + 0.3)))
    candidates = path.positions[0, 12][None, :] + 0.02 + tracker.offsets
    velocities = jnp.stack([path.velocities[0, 12], jnp.zeros(3)])
    prior = jnp.linspace(0.0, 5.0, candidates.shape[0])

    # one program per number of snapshots scored
    brute = jax.jit(lattice_costs, static_argnums=5)
    costs = brute(tracker, s, candidates, velocities, prior, None)
    want = np.unravel_index(int(jnp.argmin(costs)), costs.shape)
    bound = brute(tracker, s, candidates, velocities, prior, 2)
    assert bool(jnp.all(bound <= costs))  # the newest snapshots' cost is a lower bound
    for kw in [{}, dict(screen_snapshots=1, screen_size=1)]:
        like = tracking.Tracker(MODEL, WALK, dt=DT, settings=Settings(reacquire_batch=20, **kw))
        got = jax.jit(lattice_argmin)(like, s, candidates, velocities, prior)
        assert tuple(int(g) for g in got) == tuple(int(w) for w in want), (kw, got, want)
    # one kept bound (the misleading newest snapshot) does not certify: the fallback ran
    bound1 = np.asarray(brute(tracker, s, candidates, velocities, prior, 1)).ravel()
    assert float(costs.ravel()[np.argmin(bound1)]) > np.sort(bound1)[1]
    assert np.argmin(bound1) != np.ravel_multi_index(want, costs.shape)  # screen alone: wrong


def _path_log_prob(x, s, t, k, sigma, eps, area, kappa):
    """The log-probability of the candidate choice k (N,), written out (module docstring)."""
    total = kappa * s[0, k[0]]
    for i in range(1, len(k)):
        v = sigma**2 * (t[i] - t[i - 1])
        d2 = np.sum((x[i, k[i], :2] - x[i - 1, k[i - 1], :2]) ** 2)
        walk = (1 - eps) * np.exp(-d2 / (2 * v)) / (2 * np.pi * v)
        total += np.log(walk + eps / area) + kappa * s[i, k[i]]
    return total


def test_most_likely_path_is_the_best_of_every_path():
    import itertools

    rng = np.random.default_rng(3)
    n, k = 6, 3
    x = np.concatenate([rng.uniform(0, 1, (n, k, 2)), np.ones((n, k, 1))], -1)
    s = rng.uniform(0, 1, (n, k))
    t = np.cumsum(rng.integers(1, 4, n)).astype(float)
    kw = dict(step_std=0.3, jump_probability=0.05, area=1.0, score_weight=3.0)
    got = tracking.most_likely_path(x, s, t, **kw)
    logp = {
        c: _path_log_prob(x, s, t, np.array(c), 0.3, 0.05, 1.0, 3.0)
        for c in itertools.product(range(k), repeat=n)
    }
    best = max(logp, key=logp.get)
    np.testing.assert_array_equal(got.index, best)
    np.testing.assert_array_equal(got.x, x[np.arange(n), np.array(best)])
    np.testing.assert_allclose(got.log_prob, logp[best], rtol=1e-12)
    one = tracking.most_likely_path(x[:1], s[:1], t[:1], **kw)  # one snapshot: its best score
    assert int(one.index[0]) == int(np.argmax(s[0]))
    # two anchors (known positions; one before the first snapshot, one between the 3rd and
    # 4th): the same enumeration over the merged sequence, each anchor a step with its one
    # position and no score
    a = np.array([[0.2, 0.7, 1.0], [0.9, 0.1, 1.0]])
    ta = np.array([t[0] - 0.5, (t[2] + t[3]) / 2])
    xa = np.repeat(a[:, None], k, 1)
    xm = np.concatenate([xa[:1], x[:3], xa[1:], x[3:]])
    sm = np.concatenate([np.zeros((1, k)), s[:3], np.zeros((1, k)), s[3:]])
    tm = np.concatenate([ta[:1], t[:3], ta[1:], t[3:]])
    logp = {
        c: _path_log_prob(xm, sm, tm, np.array((0, *c[:3], 0, *c[3:])), 0.3, 0.05, 1.0, 3.0)
        for c in itertools.product(range(k), repeat=n)
    }
    best = max(logp, key=logp.get)
    got = tracking.most_likely_path(x, s, t, anchors=a[::-1], anchor_times=ta[::-1], **kw)
    np.testing.assert_array_equal(got.index, best)
    np.testing.assert_array_equal(got.x, x[np.arange(n), np.array(best)])
    np.testing.assert_allclose(got.log_prob, logp[best], rtol=1e-12)


def test_the_path_overrules_a_wrong_lobe_and_a_missing_candidate():
    # a walk along x, 5 cm per step; at step 3 a wrong lobe 0.5 m away scores higher
    n = 8
    true = np.stack([np.arange(n) * 0.05, np.zeros(n), np.ones(n)], -1)
    wrong = true + np.array([0.0, 0.5, 0.0])
    x = np.stack([true, wrong], axis=1)
    s = np.tile([0.9, 0.5], (n, 1))
    s[3] = [0.8, 0.95]
    kw = dict(step_std=0.05, jump_probability=0.01, area=4.0)
    path = tracking.most_likely_path(x, s, np.arange(n), score_weight=20.0, **kw)
    np.testing.assert_array_equal(path.index, np.zeros(n))
    np.testing.assert_allclose(path.x, true)
    # trusting the scores alone follows them
    greedy = tracking.most_likely_path(x, s, np.arange(n), score_weight=1e4, **kw)
    np.testing.assert_array_equal(greedy.index, np.argmax(s, axis=1))
    # a missing candidate (-inf) is never chosen, even where the path would prefer it
    s[5, 0] = -np.inf
    assert int(tracking.most_likely_path(x, s, np.arange(n), score_weight=20.0, **kw).index[5]) == 1
    # with no weight on the scores at all, too (0 x -inf is not a NaN here)
    still = tracking.most_likely_path(x, s, np.arange(n), score_weight=0.0, **kw)
    assert int(still.index[5]) == 1 and np.isfinite(float(still.log_prob))


def test_an_anchor_overrules_a_consistent_wrong_track():
    # the wrong lobe outscores the truth at every snapshot, and consistently (it moves with
    # the UE): without anchors the path follows it; one known position settles it
    n = 6
    true = np.stack([np.arange(n) * 0.05, np.zeros(n), np.ones(n)], -1)
    x = np.stack([true, true + np.array([0.0, 0.5, 0.0])], axis=1)
    s = np.tile([0.8, 0.9], (n, 1))
    kw = dict(step_std=0.05, jump_probability=0.01, area=4.0, score_weight=20.0)
    free = tracking.most_likely_path(x, s, np.arange(n), **kw)
    np.testing.assert_array_equal(free.index, np.ones(n))
    anchored = tracking.most_likely_path(
        x, s, np.arange(n), anchors=true[2:3] + [0.02, 0, 0], anchor_times=[2.5], **kw
    )
    np.testing.assert_array_equal(anchored.index, np.zeros(n))
    np.testing.assert_allclose(anchored.x, true)


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(candidates=np.zeros((4, 2, 2))), "candidates must have shape"),
        (dict(scores=np.zeros((4, 3))), "scores must have shape"),
        (dict(scores=np.full((4, 2), np.nan)), "scores must be finite or -inf"),
        (dict(scores=np.full((4, 2), -np.inf)), "a finite score in every snapshot"),
        (dict(times=np.array([0.0, 1.0, 1.0, 2.0])), "strictly increasing"),
        (dict(step_std=0.0), "step_std"),
        (dict(jump_probability=1.0), "jump_probability"),
        (dict(area=-1.0), "area"),
        (dict(score_weight=-1.0), "score_weight"),
        (dict(anchors=np.ones((1, 3))), "anchors and anchor_times go together"),
        (dict(anchor_times=np.ones(1)), "anchors and anchor_times go together"),
        (dict(anchors=np.ones((1, 2)), anchor_times=[0.5]), "anchors must have shape"),
        (dict(anchors=np.ones((2, 3)), anchor_times=[0.5]), "anchor_times must have shape"),
        (dict(anchors=np.full((1, 3), np.nan), anchor_times=[0.5]), "must be finite"),
        (dict(anchors=np.ones((1, 3)), anchor_times=[2.0]), "must differ from times"),
        (dict(anchors=np.ones((2, 3)), anchor_times=[0.5, 0.5]), "and from each other"),
    ],
)
def test_most_likely_path_refuses_bad_input(change, match):
    args = dict(
        candidates=np.ones((4, 2, 3)),
        scores=np.zeros((4, 2)),
        times=np.arange(4.0),
        step_std=0.1,
        jump_probability=0.1,
        area=1.0,
        score_weight=1.0,
    )
    args.update(change)
    with pytest.raises(ValueError, match=match):
        tracking.most_likely_path(
            args.pop("candidates"), args.pop("scores"), args.pop("times"), **args
        )


@pytest.mark.parametrize("prior", [1.0, 1e6])
def test_pcrb_with_a_flat_prior_is_peb_over_root_k(prior):
    """A static UE, vanishing diffusion: the bound is PEB / sqrt(k) for k = 1..50 to 1e-6,
    whatever the prior's width (the covariance form lost ~15 digits to a 1e6 m^2 prior)."""
    x = jnp.asarray([4.0, 5.0, 1.5])
    walk = tracking.RandomWalk(1e-12, region=SCENE)
    bounds = tracking.pcrb(MODEL, walk, jnp.tile(x, (50, 1)), DT, prior * jnp.eye(3))
    rmse = np.asarray(tracking.pcrb_position_rmse(bounds))
    expect = float(dj.peb(x, MODEL)) / np.sqrt(np.arange(1, 51))
    np.testing.assert_allclose(rmse, expect, rtol=1e-6)


def test_pcrb_of_a_patch_room_at_one_snapshot_is_its_peb():
    room = dj.room_model(SCENE.replace(antenna=dj.CosinePattern(1.7)), walls="brick")
    x = jnp.asarray([4.0, 5.0, 1.5])
    walk = tracking.RandomWalk(1e-12, region=SCENE)
    b = tracking.pcrb(room, walk, x[None], DT, 1e6 * jnp.eye(3))
    assert float(tracking.pcrb_position_rmse(b)[0]) == pytest.approx(float(dj.peb(x, room)), 1e-6)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prior_cov": -np.eye(3)}, "prior_cov must be positive definite"),
        ({"prior_cov": np.array([[1.0, 0.5, 0], [0, 1, 0], [0, 0, 1]])}, "symmetric"),
        ({"positions": np.zeros((0, 3))}, "at least one position"),
    ],
)
def test_pcrb_refuses_an_impossible_prior_and_an_empty_path(kwargs, match):
    args = {"positions": jnp.tile(jnp.asarray([4.0, 5.0, 1.5]), (3, 1)), "prior_cov": np.eye(3)}
    args |= kwargs
    walk = tracking.RandomWalk(0.1, region=SCENE)
    with pytest.raises(ValueError, match=match):
        tracking.pcrb(MODEL, walk, args["positions"], DT, args["prior_cov"])


def test_tracker_init_refuses_a_start_far_outside_the_motion_region():
    """Far outside (or NaN): refused; a little outside (a legitimate low-power estimate, as
    examples/tracking.py --seed 53 met): moved onto the region with a warning."""
    tracker = tracking.Tracker(MODEL, WALK, dt=DT)
    above = np.asarray(SCENE.ue_high) + np.array([0.0, 0.0, 1.0])
    with pytest.raises(ValueError, match=r"x0: UE\(s\) \[0\] start more than 0.5 m outside"):
        tracker.init(above, position_std=0.1)
    with pytest.warns(UserWarning, match="moved onto its boundary"):
        state = tracker.init(above - np.array([0.0, 0.0, 0.8]), position_std=0.1)
    assert float(state.mean[2]) == float(np.asarray(SCENE.ue_high)[2])
    with pytest.raises(ValueError, match="x0 must lie inside"):
        tracking.simulate_trajectory(jax.random.key(0), WALK, above, jnp.zeros(3), 3, DT)


@pytest.mark.slow
def test_a_track_whose_reacquisitions_keep_firing_is_never_called_locked():
    """15 m/s with the velocity unknown: the track is lost over and over (each loss cleared
    by the same step's re-acquisition, so ``lost`` never reads True at a step's end); it
    ends metres off, and ``locked`` says so."""
    motion = tracking.ConstantVelocity(1.0, region=SCENE)
    x0 = jnp.asarray([3.0, 3.0, 1.5])
    path = tracking.simulate_trajectory(
        jax.random.key(0), motion, x0, jnp.asarray([15.0, 0.0, 0.0]), 200, DT
    )
    r = tracking.simulate_track_phases(jax.random.key(1), MODEL, path.positions)
    tracker = tracking.Tracker(MODEL, motion, dt=DT)
    state = jax.tree.map(lambda a: a[None], tracker.init(x0, position_std=0.01))
    _, out = tracking.run_tracker(tracker, state, r[:, None])
    err = np.linalg.norm(np.asarray(out.position[:, 0]) - np.asarray(path.positions), axis=1)
    assert err[-1] > 1.0 and int(np.asarray(out.reacquired).sum()) > 5
    assert not np.any(np.asarray(out.locked)[-100:])
