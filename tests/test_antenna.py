"""dmimo_jax.antenna and the scene's deployment in every model: per-AP phase offsets and antenna field patterns,
against an independent NumPy computation of every ray's amplitude and phase."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax.physics import image_paths

SCENE = dj.paper_scene(convention="itu")
M = SCENE.num_aps
OFFSETS = np.random.default_rng(3).uniform(-np.pi, np.pi, M)
EXPONENTS = np.random.default_rng(4).uniform(0.5, 3.0, M)


def _positions(n, seed=0):
    return np.asarray(dj.sample_positions(jax.random.key(seed), n, SCENE))


# --- an independent reference: explicit specular points, NumPy patterns, phasor sums -------


def _np_field(pattern, m, u):
    if isinstance(pattern, dj.CosinePattern):
        q = np.broadcast_to(np.asarray(pattern.exponent), (M,))[m]
        b = np.broadcast_to(np.asarray(pattern.boresight), (M, 3))[m]
        c = float(np.dot(u, b / np.linalg.norm(b)))
        return max(c, 0.0) ** (q / 2)
    if isinstance(pattern, dj.DipolePattern):
        v = np.broadcast_to(np.asarray(pattern.axis), (M, 3))[m]
        c = float(np.dot(u, v / np.linalg.norm(v)))
        return np.cos(np.pi / 2 * c) / np.sqrt(1 - c * c)
    return 1.0


def _np_gamma(cos_g, eps, pol):
    zeta = np.sqrt(eps - (1.0 - cos_g**2) + 0j)
    if pol == "TE":
        return (cos_g - zeta) / (cos_g + zeta)
    return (eps * cos_g - zeta) / (eps * cos_g + zeta)


def _np_channel(x, scene, planes):
    """Per-AP channel sum_j F(u_j) |G_j| lambda/(4 pi d_j) e^{-j(2 pi d_j/lambda - arg G_j + delta)}.

    ``planes``: (point, unit normal, eps_r); u_j points from the AP to the specular point."""
    lam = float(scene.wavelength)
    offsets = np.asarray(scene.ap_phase_offsets)
    out = []
    for m, p in enumerate(np.asarray(scene.ap_positions)):
        d = np.linalg.norm(x - p)
        f = _np_field(scene.antenna, m, (x - p) / d)
        h = f * lam / (4 * np.pi * d) * np.exp(-1j * 2 * np.pi * d / lam)
        for q, n, eps in planes:
            hp, hx = np.dot(p - q, n), np.dot(x - q, n)
            if hp <= 1e-6:
                continue
            pp, xp = p - hp * n, x - hx * n
            spec = pp + hp / (hp + hx) * (xp - pp)
            a, b = np.linalg.norm(spec - p), np.linalg.norm(x - spec)
            g = _np_gamma(np.dot(p - spec, n) / a, eps, scene.polarization)
            f = _np_field(scene.antenna, m, (spec - p) / a)
            h += (
                f
                * abs(g)
                * lam
                / (4 * np.pi * (a + b))
                * np.exp(-1j * (2 * np.pi * (a + b) / lam - np.angle(g)))
            )
        out.append(h * np.exp(-1j * offsets[m]))
    return np.asarray(out)


def _wrap(a):
    return (np.asarray(a) + np.pi) % (2 * np.pi) - np.pi


PATTERNS = {
    "isotropic": dj.IsotropicPattern(),
    "cosine": dj.CosinePattern(exponent=1.7),
    "cosine_per_ap": dj.CosinePattern(exponent=EXPONENTS, boresight=(0.1, -0.2, -1.0)),
    "dipole": dj.DipolePattern(axis=(1.0, 0.0, 0.0)),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_two_ray_rays_match_independent_reference(name):
    scene = SCENE.replace(antenna=PATTERNS[name], ap_phase_offsets=OFFSETS)
    model = dj.TwoRayModel(scene)
    xs = _positions(24)
    mean = np.asarray(jax.vmap(model.mean)(xs))
    amp = np.asarray(jax.vmap(dj.physics.effective_amplitude, (0, None))(xs, scene))
    ground = [(np.zeros(3), np.array([0.0, 0.0, 1.0]), complex(scene.eps_r))]
    ref = np.stack([_np_channel(x, scene, ground) for x in xs])
    np.testing.assert_array_less(np.abs(_wrap(mean + np.angle(ref))), 1e-9)
    np.testing.assert_allclose(amp, np.abs(ref), rtol=1e-9)


@pytest.mark.parametrize("name", ["cosine_per_ap", "dipole"])
def test_room_rays_match_independent_reference(name):
    scene = SCENE.replace(antenna=PATTERNS[name], ap_phase_offsets=OFFSETS)
    room = dj.room_model(scene, ceiling="plasterboard", walls="concrete")
    xs = _positions(16, seed=1)
    mean = np.asarray(jax.vmap(room.mean)(xs))
    amp = np.asarray(jax.vmap(room.amplitude)(xs))
    planes = [
        (np.asarray(r.point), np.asarray(r.normal), complex(r.eps_r)) for r in room.reflectors
    ]
    ref = np.stack([_np_channel(x, scene, planes) for x in xs])
    np.testing.assert_array_less(np.abs(_wrap(mean + np.angle(ref))), 1e-9)
    np.testing.assert_allclose(amp, np.abs(ref), rtol=1e-9)


def test_isotropic_pattern_equals_the_paper_model():
    """An explicit IsotropicPattern and zero offsets give today's numbers to 1e-12 rad."""
    xs = _positions(64, seed=2)
    base = jax.vmap(dj.TwoRayModel(SCENE).mean)(xs)
    explicit = SCENE.replace(antenna=dj.IsotropicPattern(), ap_phase_offsets=np.zeros(M))
    # the same world through the non-isotropic code path: a cosine pattern of exponent 0
    # seen only from its front half-space (boresight down, every ray leaves downward)
    hemisphere = SCENE.replace(antenna=dj.CosinePattern(exponent=0.0))
    for scene in (explicit, hemisphere):
        other = jax.vmap(dj.TwoRayModel(scene).mean)(xs)
        assert float(jnp.max(jnp.abs(other - base))) <= 1e-12
    room = dj.room_model(SCENE, walls="concrete")
    room_hemi = dj.room_model(hemisphere, walls="concrete")
    diff = jax.vmap(room.mean)(xs) - jax.vmap(room_hemi.mean)(xs)
    # the APs are above every UE, so every first-order ray leaves downward (F = 1)
    assert float(jnp.max(jnp.abs(diff))) <= 1e-12


def test_phase_offsets_shift_the_mean_and_keep_the_peb():
    scene = SCENE.replace(ap_phase_offsets=OFFSETS)
    xs = _positions(8, seed=5)
    for make in (dj.TwoRayModel, lambda s: dj.room_model(s, walls="concrete")):
        shifted = jax.vmap(make(scene).mean)(xs) - jax.vmap(make(SCENE).mean)(xs)
        np.testing.assert_allclose(shifted, np.broadcast_to(OFFSETS, shifted.shape), atol=1e-12)
    np.testing.assert_allclose(dj.peb_map(xs, scene), dj.peb_map(xs, SCENE), rtol=1e-12)
    # the GP's LoS reference carries the known offsets too
    los = jax.vmap(dj.gp.los_phase, (0, None))(xs, scene) - jax.vmap(dj.gp.los_phase, (0, None))(
        xs, SCENE
    )
    np.testing.assert_allclose(los, np.broadcast_to(OFFSETS, los.shape), atol=1e-12)


def test_mle_with_known_offsets_finds_the_ue():
    scene = dj.paper_scene(-10.0, convention="itu").replace(ap_phase_offsets=OFFSETS)
    x = jnp.array([[4.2, 6.1, 1.3], [7.7, 2.5, 2.9]])
    r = dj.simulate_phases_batch(jax.random.key(0), scene, x, jnp.array([0.3, -2.0]))
    out = dj.refine_batch(x + 0.01, r, scene)
    assert float(jnp.max(jnp.linalg.norm(out.x - x, axis=-1))) < 1e-3
    # a model that ignores the offsets does not
    wrong = dj.refine_batch(x + 0.01, r, scene.replace(ap_phase_offsets=np.zeros(M)))
    assert float(jnp.min(jnp.linalg.norm(wrong.x - x, axis=-1))) > 5e-3


def test_order2_departure_directions_point_at_the_first_bounce():
    """Unfold AP -> k -> l -> UE explicitly: the ray leaves toward the point on plane k."""
    room = dj.room_model(SCENE, ceiling=3.0, walls=4.0)
    x = np.array([3.3, 6.2, 1.4])
    paths = image_paths(x, SCENE, room.reflectors, order=2, directions=True)
    planes = [(np.asarray(r.point), np.asarray(r.normal)) for r in room.reflectors]
    pairs = [(k, l_) for k in range(len(planes)) for l_ in range(len(planes)) if k != l_]
    checked = 0
    for m, p in enumerate(np.asarray(SCENE.ap_positions)):
        for j, (k, l_) in enumerate(pairs):
            if not bool(paths.valid[m, len(planes) + j]):
                continue
            (qk, nk), (ql, nl) = planes[k], planes[l_]
            img1 = p - 2 * np.dot(p - qk, nk) * nk
            img2 = img1 - 2 * np.dot(img1 - ql, nl) * nl
            t = np.dot(x - ql, nl) / np.dot(x - img2, nl)  # x + t (img2 - x) on plane l
            r_l = x + t * (img2 - x)
            s = np.dot(r_l - qk, nk) / np.dot(r_l - img1, nk)
            r_k = r_l + s * (img1 - r_l)
            u = (r_k - p) / np.linalg.norm(r_k - p)
            np.testing.assert_allclose(paths.departure[m, len(planes) + j], u, atol=1e-12)
            checked += 1
    assert checked > 50


@pytest.mark.parametrize("leaf", ["exponent", "boresight", "axis"])
def test_patterns_are_differentiable_in_their_parameters(leaf):
    x = jnp.array([2.5, 7.0, 1.2])
    if leaf == "axis":
        base = {"axis": jnp.array([0.3, 0.1, 1.0])}
        make = dj.DipolePattern
    else:
        base = {"exponent": jnp.asarray(1.3), "boresight": jnp.array([0.2, -0.1, -1.0])}
        make = dj.CosinePattern

    def phase_sum(value):
        pattern = make(**{**base, leaf: value})
        return jnp.sum(jnp.sin(dj.TwoRayModel(SCENE.replace(antenna=pattern)).mean(x)))

    grad = jax.grad(phase_sum)(base[leaf])
    assert np.all(np.isfinite(np.asarray(grad))) and float(jnp.max(jnp.abs(grad))) > 0
    step = jnp.zeros_like(base[leaf]).reshape(-1).at[0].set(1e-6).reshape(base[leaf].shape)
    fd = (phase_sum(base[leaf] + step) - phase_sum(base[leaf] - step)) / 2e-6
    np.testing.assert_allclose(np.asarray(grad).reshape(-1)[0], float(fd), rtol=1e-5)


def test_analytic_jacobian_refuses_a_pattern():
    scene = SCENE.replace(antenna=dj.CosinePattern())
    with pytest.raises(ValueError, match="isotropic"):
        dj.bounds.jacobian_analytic(jnp.array([5.0, 5.0, 1.0]), scene)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"ap_phase_offsets": np.zeros(M - 1)}, "ap_phase_offsets must have shape"),
        ({"ap_phase_offsets": np.full(M, np.nan)}, "ap_phase_offsets must be finite"),
        ({"antenna": "patch"}, "antenna must be an IsotropicPattern"),
        ({"antenna": dj.CosinePattern(exponent=np.ones(M + 1))}, "per-AP parameters for 18"),
        ({"antenna": dj.DipolePattern(axis=np.ones((3, 3)))}, "per-AP parameters for 3"),
    ],
)
def test_bad_deployment_is_refused(changes, match):
    with pytest.raises(ValueError, match=match):
        SCENE.replace(**changes)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: dj.CosinePattern(exponent=-1.0), "exponent must be >= 0"),
        (lambda: dj.CosinePattern(exponent=np.ones((2, 2))), "exponent must be a scalar"),
        (lambda: dj.CosinePattern(boresight=(0.0, 0.0, 0.0)), "boresight must be non-zero"),
        (lambda: dj.DipolePattern(axis=(1.0, 0.0)), r"axis must have shape \(3,\)"),
        (lambda: dj.DipolePattern(axis=(np.inf, 0.0, 1.0)), "axis must be finite"),
    ],
)
def test_bad_pattern_is_refused(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "pattern", [dj.IsotropicPattern(), dj.CosinePattern(exponent=2.0), dj.DipolePattern()]
)
def test_field_refuses_directions_without_an_ap_axis(pattern):
    # (P, 3) directions broadcast against a per-AP boresight into a (P, P) answer: refused
    u = np.array([[0.0, 0.6, -0.8], [0.6, 0.0, -0.8], [0.0, 0.0, -1.0]])
    with pytest.raises(ValueError, match=r"u must be unit directions of shape \(M, P, 3\)"):
        pattern.field(u)
    assert pattern.field(u[None]).shape == (1, 3)


def test_changing_the_number_of_aps_needs_new_offsets():
    fewer = SCENE.replace(ap_positions=SCENE.ap_positions[:5])  # zero offsets follow
    assert fewer.ap_phase_offsets.shape == (5,)
    with pytest.raises(ValueError, match="pass ap_phase_offsets too"):
        SCENE.replace(ap_phase_offsets=OFFSETS).replace(ap_positions=SCENE.ap_positions[:5])
