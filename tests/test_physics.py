import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import dmimo_jax as dj
from dmimo_jax.physics import geometry
from tests.helpers import assert_allclose

SCENE = dj.paper_scene()
X0 = jnp.array([6.5, 5.0, 2.0])


def _positions(n, seed=0, scene=SCENE):
    return dj.sample_positions(jax.random.key(seed), n, scene)


# --- reflection coefficient, eq. (3) -------------------------------------------------


@pytest.mark.parametrize("eps", [5.24 - 0.0096j, 5.24 - 0.872j, 2.0 - 0.05j, 30.0 - 3.0j])
def test_gamma_normal_incidence(eps):
    s = np.sqrt(eps)
    te = complex(dj.physics.reflection_coefficient(1.0, eps, "TE"))
    tm = complex(dj.physics.reflection_coefficient(1.0, eps, "TM"))
    assert te == pytest.approx((1 - s) / (1 + s), rel=1e-12)
    # TM at normal incidence is (eps - sqrt eps)/(eps + sqrt eps) = -Gamma_TE
    assert tm == pytest.approx(-(1 - s) / (1 + s), rel=1e-12)


@pytest.mark.parametrize("pol", ["TE", "TM"])
def test_gamma_grazing_tends_to_minus_one(pol):
    c = jnp.array([1e-3, 1e-5, 1e-7])
    g = np.asarray(dj.physics.reflection_coefficient(c, 5.24 - 0.0096j, pol))
    err = np.abs(g + 1)
    assert np.all(np.diff(err) < 0) and err[-1] < 1e-5
    assert complex(dj.physics.reflection_coefficient(0.0, 5.24 - 0.0096j, pol)) == pytest.approx(
        -1.0
    )


def test_gamma_metal_and_passivity():
    c = jnp.linspace(0.0, 1.0, 101)
    g = dj.physics.reflection_coefficient(c, 5.0, "TE", perfect_conductor=True)
    np.testing.assert_array_equal(np.asarray(g), -1.0)
    for pol in ("TE", "TM"):
        g = np.asarray(dj.physics.reflection_coefficient(c, 5.24 - 0.872j, pol))
        assert np.all(np.abs(g) <= 1.0)
    # vacuum below vacuum reflects nothing
    np.testing.assert_allclose(
        np.asarray(dj.physics.reflection_coefficient(c, 1.0 + 0j)), 0.0, atol=1e-15
    )


def test_gamma_bad_polarization():
    with pytest.raises(ValueError, match="polarization"):
        dj.physics.reflection_coefficient(0.5, 5.0, "X")


# --- geometry and the effective phasor, eqs. (4), (7) --------------------------------


def test_geometry_against_direct_formulas():
    for x in np.asarray(_positions(50)):
        geo = geometry(jnp.asarray(x), SCENE)
        ap = np.asarray(SCENE.ap_positions)
        mirror = ap * [1, 1, -1]
        d1 = np.linalg.norm(ap - x, axis=1)
        d2 = np.linalg.norm(mirror - x, axis=1)
        assert_allclose(geo.d1, d1)
        assert_allclose(geo.d2, d2)
        assert_allclose(geo.path_difference, d2 - d1, rtol=1e-9)
        cos_gamma = np.cos(np.arccos((x[2] + ap[:, 2]) / d2))
        assert_allclose(geo.cos_gamma, cos_gamma)


@pytest.mark.parametrize("pol", ["TE", "TM"])
@pytest.mark.parametrize("material", ["concrete", "glass", "metal"])
def test_phasor_identity_eq7(pol, material):
    """Eq. (7a)/(7b) closed forms equal the complex sum of the two paths of eq. (4)."""
    scene = dj.paper_scene(material=material, polarization=pol, convention="itu")
    for x in _positions(20, seed=1, scene=scene):
        pp = dj.physics.path_parameters(x, scene)
        a1, t1, a2, t2 = (np.asarray(v) for v in pp[:4])
        h_sum = a1 * np.exp(-1j * t1) + a2 * np.exp(-1j * t2)
        alpha_7a = np.sqrt(a1**2 + a2**2 + 2 * a1 * a2 * np.cos(t1 - t2))
        theta_7b = np.arctan2(a1 * np.sin(t1) + a2 * np.sin(t2), a1 * np.cos(t1) + a2 * np.cos(t2))
        alpha = np.asarray(dj.physics.effective_amplitude(x, scene))
        theta = np.asarray(dj.physics.effective_phase(x, scene))
        assert_allclose(alpha, np.abs(h_sum), rtol=1e-12)
        assert_allclose(alpha, alpha_7a, rtol=1e-12)
        # compare on the circle; phases ~170 rad lose ~1e-13 in the direct form
        np.testing.assert_allclose(np.angle(np.exp(1j * (theta - theta_7b))), 0.0, atol=1e-11)
        np.testing.assert_allclose(
            np.angle(np.exp(1j * (theta + np.angle(h_sum)))), 0.0, atol=1e-11
        )
        assert_allclose(np.asarray(dj.physics.effective_phasor(x, scene)), h_sum, rtol=1e-11)


def test_amplitude_between_path_difference_and_sum():
    for x in _positions(100, seed=2):
        pp = dj.physics.path_parameters(x, SCENE)
        alpha = np.asarray(dj.physics.effective_amplitude(x, SCENE))
        a1, a2 = np.asarray(pp.alpha1), np.asarray(pp.alpha2)
        assert np.all(alpha <= a1 + a2 + 1e-18)
        assert np.all(alpha >= np.abs(a1 - a2) - 1e-18)


def test_los_only_phase_and_sign():
    """With a vacuum ground (Gamma = 0) the phase is 2 pi d1 / lambda and grows with distance."""
    scene = SCENE.replace(eps_r=1.0 + 0j)
    x = X0
    d1 = np.linalg.norm(np.asarray(SCENE.ap_positions) - np.asarray(x), axis=1)
    assert_allclose(dj.physics.unwrapped_phase(x, scene), 2 * np.pi * d1 / float(SCENE.wavelength))
    assert_allclose(
        dj.physics.effective_amplitude(x, scene), float(SCENE.wavelength) / (4 * np.pi * d1)
    )
    # moving away from AP 0 (straight down) increases its phase at 2 pi / lambda per metre
    g = jax.grad(lambda z: dj.physics.unwrapped_phase(jnp.array([5.0, 5.0, z]), scene)[0])(2.0)
    assert float(g) == pytest.approx(-2 * np.pi / float(SCENE.wavelength), rel=1e-12)


def test_effective_phase_is_wrapped_unwrapped():
    for x in _positions(20, seed=3):
        th = np.asarray(dj.physics.effective_phase(x, SCENE))
        assert np.all(th >= -np.pi) and np.all(th < np.pi)
        assert_allclose(th, np.asarray(dj.wrap(dj.physics.unwrapped_phase(x, SCENE))))
        pert = np.asarray(dj.physics.phase_perturbation(x, SCENE))
        assert np.all(np.abs(pert) < np.pi / 2)


def test_noise_variance_eq9_and_power_scaling():
    var = dj.physics.phase_noise_var(X0, SCENE)
    alpha = dj.physics.effective_amplitude(X0, SCENE)
    assert_allclose(var, SCENE.noise_power / (2 * SCENE.tx_power * alpha**2))
    var_hi = dj.physics.phase_noise_var(X0, dj.paper_scene(power_dbm=10.0))
    assert_allclose(var / var_hi, np.full(17, 100.0))
    # the paper's regime: sigma ~ 5e-4 rad at -10 dBm
    assert 1e-4 < float(jnp.sqrt(var).mean()) < 1e-3


def test_vmap_jit_equivalence():
    xs = _positions(64, seed=4)
    for fn in (
        dj.physics.effective_phase,
        dj.physics.effective_amplitude,
        dj.physics.phase_noise_var,
        dj.physics.unwrapped_phase,
    ):
        batched = jax.jit(jax.vmap(fn, in_axes=(0, None)))(xs, SCENE)
        loop = np.stack([np.asarray(fn(x, SCENE)) for x in xs])
        # XLA may reorder float ops under jit: allow a few ulp of a ~170 rad phase
        # (ulp(170) = 2.8e-14 rad), eight orders of magnitude below the phase noise.
        ulp = np.spacing(np.float64(2 * np.pi * 20 / 0.375))
        assert_allclose(batched, loop, rtol=1e-13, atol=8 * ulp)


@pytest.mark.parametrize("pol", ["TE", "TM"])
def test_gradients_finite_straight_below_ap(pol):
    scene = SCENE.replace(polarization=pol)
    ap = np.asarray(scene.ap_positions)
    xs = jnp.asarray([[a[0], a[1], z] for a in ap for z in (0.5, 2.0, 3.5)])
    for fn in (
        dj.physics.unwrapped_phase,
        dj.physics.effective_amplitude,
        dj.physics.phase_noise_var,
    ):
        fwd = jax.jit(jax.vmap(jax.jacfwd(fn), (0, None)))(xs, scene)
        rev = jax.jit(jax.vmap(jax.jacrev(fn), (0, None)))(xs, scene)
        assert np.all(np.isfinite(np.asarray(fwd))), fn.__name__
        assert_allclose(fwd, rev, rtol=1e-9, atol=1e-12)
    x = jnp.array([5.0, 5.0, 2.0])  # directly below AP 0
    check_grads(
        jax.jit(lambda x: dj.physics.unwrapped_phase(x, scene)), (x,), order=1, modes=["fwd", "rev"]
    )
    g = jax.grad(lambda e: jnp.sum(dj.physics.unwrapped_phase(x, scene.replace(eps_r=e))))(5.0 + 0j)
    assert np.isfinite(complex(g))


def test_model_is_pytree_and_matches_functions():
    model = dj.TwoRayModel(SCENE)
    mean = jax.jit(lambda m, x: m.mean(x))(model, X0)
    assert_allclose(mean, dj.physics.unwrapped_phase(X0, SCENE))
    assert_allclose(model.variance(X0), dj.physics.phase_noise_var(X0, SCENE))
    assert isinstance(model, dj.PhaseModel)
    assert dj.as_phase_model(SCENE).num_aps == 17
    with pytest.raises(ValueError, match="PhaseModel"):
        dj.as_phase_model(object())


def test_float32_effective_phase_error_is_visible_but_below_noise():
    """float32 loses ~1e-5 rad on ~170 rad phases: measured, and kept below the noise std."""
    xs = _positions(1280, seed=5)
    s32 = SCENE.astype(jnp.float32)
    phases = jax.jit(jax.vmap(dj.physics.effective_phase, (0, None)))
    th64 = phases(xs, SCENE)
    th32 = phases(xs.astype(jnp.float32), s32)
    assert th32.dtype == jnp.float32
    err = np.abs(np.asarray(dj.wrap(th32.astype(jnp.float64) - th64)))
    sigma = np.sqrt(np.asarray(jax.vmap(dj.physics.phase_noise_var, (0, None))(xs, SCENE)))
    assert 1e-7 < err.max() < 1e-3  # visible, not catastrophic
    assert np.median(err / sigma) < 0.2


@pytest.mark.parametrize(
    "x, match",
    [
        (jnp.array([1.0, 2.0, 0.0]), "above the ground"),
        (jnp.array([1.0, 2.0, -1.0]), "above the ground"),
        (jnp.array([np.nan, 2.0, 1.0]), "finite"),
        (jnp.array([1.0, 2.0]), r"shape \(3,\)"),
        (jnp.ones((2, 3)), r"shape \(3,\)"),
    ],
)
def test_position_validation(x, match):
    for fn in (
        dj.physics.effective_phase,
        dj.physics.effective_amplitude,
        dj.physics.phase_noise_var,
        dj.peb,
    ):
        with pytest.raises(ValueError, match=match):
            fn(x, SCENE)


# ------------------------------------------------- an AP whose pattern sees nothing


def _blind_ap_scene():
    """AP 0 a patch facing up, the others down; a UE straight below AP 0 (no field from it)."""
    sc = dj.paper_scene(-10.0, convention="itu")
    b = np.tile([0.0, 0.0, -1.0], (sc.num_aps, 1))
    b[0] = [0.0, 0.0, 1.0]
    ap0 = np.asarray(sc.ap_positions[0])
    x = jnp.asarray([ap0[0], ap0[1], 1.0])
    without = sc.replace(
        ap_positions=sc.ap_positions[1:],
        ap_phase_offsets=sc.ap_phase_offsets[1:],
        antenna=dj.CosinePattern(1.0),
    )
    return sc.replace(antenna=dj.CosinePattern(1.0, boresight=b)), without, x


@pytest.mark.parametrize(
    "make",
    [dj.TwoRayModel, lambda s: dj.room_model(s, ceiling="plasterboard", walls="brick")],
    ids=["two-ray", "room"],
)
def test_an_ap_that_sees_nothing_drops_out_exactly(make):
    """Its variance is infinite, its phase finite with a zero gradient: the PEB is the other
    16 APs' PEB, gradients of every phase are finite, and the refinement converges."""
    scene, without, x = _blind_ap_scene()
    model, other = make(scene), make(without)
    assert np.isinf(model.variance(x)[0]) and np.all(np.isfinite(model.variance(x)[1:]))
    assert float(dj.peb(x, model)) == pytest.approx(float(dj.peb(x, other)), rel=1e-9)
    grad = jax.grad(lambda y: jnp.sum(model.mean(y)))(x)
    assert np.all(np.isfinite(grad))
    r = dj.simulate_phases(jax.random.key(0), model, x, 0.3)
    assert np.all(np.isfinite(r))
    refined = dj.estimators.refine_batch(x[None] + 1e-3, r[None], model)
    assert float(jnp.linalg.norm(refined.x[0] - x)) < 5 * float(dj.peb(x, model))
