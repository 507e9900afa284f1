"""dmimo_jax.physics.image_source: agreement with the two-ray model and with an
independent NumPy/SciPy computation, the physics limits, gradients and bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import minimize

import dmimo_jax as dj
from dmimo_jax.physics import image_paths
from tests.helpers import assert_allclose

SCENE = dj.paper_scene(convention="itu")
ROOM = dj.room_model(SCENE, ceiling="plasterboard", walls="concrete")
X0 = jnp.array([6.5, 5.0, 2.0])


def _positions(n, seed=0):
    return dj.sample_positions(jax.random.key(seed), n, SCENE)


def _wrap(a):
    return (np.asarray(a) + np.pi) % (2 * np.pi) - np.pi


# --- an independent reference: explicit reflection points and phasor sums in NumPy ---------


def _np_gamma(cos_g, eps, pol, pec):
    if pec:
        return -1.0 + 0j
    sin2 = 1.0 - cos_g**2
    zeta = np.sqrt(eps - sin2 + 0j)
    if pol == "TE":
        return (cos_g - zeta) / (cos_g + zeta)
    return (eps * cos_g - zeta) / (eps * cos_g + zeta)


def _np_channel(x, scene, reflectors, second_order=False):
    """Total channel per AP by summing alpha e^{-j theta} over explicit ray paths."""
    lam = float(scene.wavelength)
    pol = scene.polarization
    planes = [
        (np.asarray(r.point), np.asarray(r.normal), complex(r.eps_r), r.perfect_conductor)
        for r in reflectors
    ]
    out = []
    for p in np.asarray(scene.ap_positions):
        d = np.linalg.norm(p - x)
        h = lam / (4 * np.pi * d) * np.exp(-2j * np.pi * d / lam)
        for q, n, eps, pec in planes:
            hp, hx = np.dot(p - q, n), np.dot(x - q, n)
            if hp <= 1e-6:
                continue
            # the specular point divides the AP-UE projection in the ratio hp : hx
            pp, xp = p - hp * n, x - hx * n
            r = pp + hp / (hp + hx) * (xp - pp)
            a, b = np.linalg.norm(p - r), np.linalg.norm(x - r)
            g = _np_gamma(np.dot(p - r, n) / a, eps, pol, pec)
            length = a + b
            h += (
                abs(g)
                * lam
                / (4 * np.pi * length)
                * np.exp(-1j * (2 * np.pi * length / lam - np.angle(g)))
            )
        if second_order:
            for k, (qk, nk, ek, pk) in enumerate(planes):
                for l_, (ql, nl, el, pl) in enumerate(planes):
                    if k == l_ or np.dot(p - qk, nk) <= 1e-6:
                        continue
                    path = _fermat_double(p, x, (qk, nk), (ql, nl))
                    if path is None:
                        continue
                    length, cos_k, cos_l = path
                    g = _np_gamma(cos_k, ek, pol, pk) * _np_gamma(cos_l, el, pol, pl)
                    h += (
                        abs(g)
                        * lam
                        / (4 * np.pi * length)
                        * np.exp(-1j * (2 * np.pi * length / lam - np.angle(g)))
                    )
        out.append(h)
    return np.asarray(out)


def _fermat_double(p, x, plane_k, plane_l):
    """AP -> plane k -> plane l -> UE by Fermat's principle (shortest path through the two
    planes, points parametrized on each plane), None when its points leave the room side."""
    (qk, nk), (ql, nl) = plane_k, plane_l

    def basis(n):
        a = np.array([1.0, 0, 0]) if abs(n[0]) < 0.9 else np.array([0, 1.0, 0])
        u = np.cross(n, a)
        u /= np.linalg.norm(u)
        return u, np.cross(n, u)

    (uk, vk), (ul, vl) = basis(nk), basis(nl)

    def points(t):
        return qk + t[0] * uk + t[1] * vk, ql + t[2] * ul + t[3] * vl

    def length(t):
        rk, rl = points(t)
        return np.linalg.norm(p - rk) + np.linalg.norm(rk - rl) + np.linalg.norm(rl - x)

    rk0 = p - np.dot(p - qk, nk) * nk
    rl0 = x - np.dot(x - ql, nl) * nl
    t0 = np.array(
        [np.dot(rk0 - qk, uk), np.dot(rk0 - qk, vk), np.dot(rl0 - ql, ul), np.dot(rl0 - ql, vl)]
    )
    res = minimize(length, t0, method="BFGS", options={"gtol": 1e-12, "xrtol": 1e-14})
    rk, rl = points(res.x)

    # a reflection path obeys the specular law at both points (a minimum squeezed onto the
    # planes' common edge does not) and stays on the room side of both planes
    def unit(v):
        return v / np.linalg.norm(v)

    def specular(a, r, b, n):
        u_in, u_out = unit(r - a), unit(b - r)
        return np.linalg.norm(u_in - 2 * np.dot(u_in, n) * n - u_out) < 1e-5

    if not (specular(p, rk, rl, nk) and specular(rk, rl, x, nl)):
        return None
    if np.dot(rk - ql, nl) < -1e-9 or np.dot(rl - qk, nk) < -1e-9:
        return None
    cos_k = abs(np.dot(p - rk, nk)) / np.linalg.norm(p - rk)
    cos_l = abs(np.dot(x - rl, nl)) / np.linalg.norm(x - rl)
    return length(res.x), cos_k, cos_l


# --- agreement ------------------------------------------------------------------------------


def test_floor_only_equals_two_ray():
    xs = _positions(64)
    two_ray = dj.TwoRayModel(SCENE)
    room = dj.room_model(SCENE)  # the scene's ground only
    assert [r.name for r in room.reflectors] == ["floor"]
    both = jax.jit(
        jax.vmap(lambda x: (room.mean(x), two_ray.mean(x), room.variance(x), two_ray.variance(x)))
    )
    mean_room, mean_two_ray, var_room, var_two_ray = both(xs)
    assert float(jnp.max(jnp.abs(mean_room - mean_two_ray))) <= 1e-12
    assert_allclose(var_room, var_two_ray, rtol=1e-12)


@pytest.mark.parametrize("polarization", ["TE", "TM"])
def test_first_order_matches_independent_reference(polarization):
    scene = SCENE.replace(polarization=polarization)
    room = dj.room_model(
        scene,
        ceiling="plasterboard",
        walls={"x0": "concrete", "x1": "metal", "y0": "glass", "y1": "wood"},
    )
    for x in np.asarray(_positions(8, seed=1)):
        h = _np_channel(x, scene, room.reflectors)
        assert np.max(np.abs(_wrap(room.mean(jnp.asarray(x)) + np.angle(h)))) < 1e-9
        assert_allclose(room.amplitude(jnp.asarray(x)), np.abs(h), rtol=1e-10)


@pytest.mark.slow  # .ci/run runs these after the test command
def test_second_order_matches_fermat_paths():
    scene = SCENE.replace(ap_positions=SCENE.ap_positions[::4])  # 5 APs keep BFGS quick
    room = dj.room_model(scene, ceiling="plasterboard", walls="concrete", order=2)
    # the reference's path lengths agree to ~1e-14 m; its incidence angles carry the BFGS
    # point error (~1e-8), hence the 1e-6 here (the first-order reference is exact: 1e-9)
    for x in np.asarray(_positions(1, seed=2)):
        h = _np_channel(x, scene, room.reflectors, second_order=True)
        assert np.max(np.abs(_wrap(room.mean(jnp.asarray(x)) + np.angle(h)))) < 1e-6
        assert_allclose(room.amplitude(jnp.asarray(x)), np.abs(h), rtol=1e-6)


def test_corner_double_bounce_counted_once():
    # perpendicular walls commute as reflections: of the orderings (x0, y0) and (y0, x0) exactly
    # one reflection path exists for a given UE
    room = dj.room_model(SCENE, walls={"x0": "concrete", "y0": "concrete"}, order=2)
    paths = jax.jit(image_paths, static_argnames="order")(X0, SCENE, room.reflectors, order=2)
    names = [r.name for r in room.reflectors]
    i, j = names.index("wall_x0"), names.index("wall_y0")
    pairs = [(k, l_) for k in range(3) for l_ in range(3) if k != l_]
    col = {pr: 3 + c for c, pr in enumerate(pairs)}
    valid = np.asarray(paths.valid)
    assert np.all(valid[:, col[(i, j)]] ^ valid[:, col[(j, i)]])
    # parallel floor and ceiling: both orderings exist (for APs not on the ceiling)
    room2 = dj.room_model(
        SCENE.replace(ap_positions=SCENE.ap_positions.at[:, 2].set(3.0)), ceiling="wood", order=2
    )
    v2 = np.asarray(
        jax.jit(image_paths, static_argnames="order")(
            X0, room2.scene, room2.reflectors, order=2
        ).valid
    )
    assert v2[:, 2:].all()


# --- physics limits ---------------------------------------------------------------------------


def test_metal_bounce_has_unit_magnitude():
    room = dj.room_model(SCENE, walls="metal")
    paths = image_paths(X0, SCENE, room.reflectors)
    walls = [i for i, r in enumerate(room.reflectors) if r.name.startswith("wall")]
    assert all(room.reflectors[i].perfect_conductor for i in walls)
    assert_allclose(np.abs(np.asarray(paths.gamma)[:, walls]), 1.0, rtol=1e-14)
    # and the dielectric floor does not
    assert np.all(np.abs(np.asarray(paths.gamma)[:, 0]) < 0.9)


def test_receding_wall_bounce_vanishes():
    floor = dj.room_model(SCENE).reflectors
    base = dj.ImageSourceModel(SCENE, floor).mean(X0)
    gaps = []
    for dist in (1e2, 1e4, 1e6):
        wall = dj.Reflector((-dist, 0.0, 0.0), (1.0, 0.0, 0.0), 5.24 - 0.87j, name="far")
        mean = dj.ImageSourceModel(SCENE, floor + (wall,)).mean(X0)
        gaps.append(float(jnp.max(jnp.abs(_wrap(mean - base)))))
    assert gaps[0] > gaps[1] > gaps[2]
    assert gaps[2] < 1e-5


def test_path_lengths_are_reciprocal():
    room = ROOM
    x = np.asarray(X0)
    fwd = np.asarray(image_paths(X0, SCENE, room.reflectors).length)  # (M, K)
    for m in (0, 5, 11):
        p = np.asarray(SCENE.ap_positions[m])
        if p[2] >= float(SCENE.room_size[2]) - 1e-6:
            p = p - np.array([0.0, 0.0, 0.5])  # off the ceiling so every bounce exists
            fwd_m = np.asarray(
                image_paths(X0, SCENE.replace(ap_positions=p[None]), room.reflectors).length
            )[0]
        else:
            fwd_m = fwd[m]
        swapped = SCENE.replace(ap_positions=x[None])
        back = np.asarray(image_paths(jnp.asarray(p), swapped, room.reflectors).length)[0]
        assert_allclose(back, fwd_m, rtol=1e-13)


def test_mounted_ap_gets_no_bounce_from_its_surface():
    paths = image_paths(X0, SCENE, ROOM.reflectors)
    ceiling = [r.name for r in ROOM.reflectors].index("ceiling")
    on_ceiling = np.isclose(np.asarray(SCENE.ap_positions[:, 2]), float(SCENE.room_size[2]))
    assert on_ceiling.any()
    assert not np.asarray(paths.valid)[on_ceiling, ceiling].any()
    assert np.asarray(paths.valid)[:, 0].all()  # everyone sees the floor


# --- gradients and the PEB ------------------------------------------------------------------


def _finite(tree):
    return all(bool(jnp.all(jnp.isfinite(jnp.asarray(v)))) for v in jax.tree.leaves(tree))


def test_gradients_finite_below_an_ap_and_at_grazing():
    ap = SCENE.ap_positions[3]
    below = jnp.array([ap[0], ap[1], 1.0])
    near_wall = jnp.array([1e-7, 5.0, 1e-7])  # grazing on the floor and on wall x0

    def total(model, x):
        return jnp.sum(model.mean(x)) + jnp.sum(jnp.log(model.variance(x)))

    @jax.jit
    def all_gradients(x):
        g = jax.grad(total)(ROOM, x)
        return (
            jax.jacfwd(ROOM.mean)(x),
            jax.jacfwd(ROOM.variance)(x),
            g.scene.ap_positions,
            [r.eps_r for r in g.reflectors],
        )

    for x in (below, near_wall):
        assert _finite(all_gradients(x))


def test_gradient_in_wall_permittivity_matches_finite_differences():
    def mean_of(eps):
        walls = {k: eps for k in ("x0", "x1", "y0", "y1")}
        return dj.room_model(SCENE, walls=walls).mean(X0)

    eps0 = 5.24 - 0.87j
    # d/d(Re eps) of the real-valued mean via grad of the complex leaf's real part
    jac = jax.jacfwd(lambda a: mean_of(a + 1j * eps0.imag))(jnp.asarray(eps0.real))
    h = 1e-5  # rounding of ~100 rad phases over 2h: ~1e-9 rad per unit eps_r
    fd = (mean_of(eps0 + h) - mean_of(eps0 - h)) / (2 * h)
    assert_allclose(jac, fd, rtol=1e-6, atol=1e-8)


def test_room_peb_is_finite_and_matches_finite_differences():
    x = np.asarray(X0)
    h = 1e-6
    jac_fd = np.stack(
        [
            (ROOM.mean(jnp.asarray(x + h * e)) - ROOM.mean(jnp.asarray(x - h * e))) / (2 * h)
            for e in np.eye(3)
        ],
        axis=1,
    )
    j_theta = dj.bounds.efim_from_variance(ROOM.variance(X0))
    peb_fd = dj.bounds.peb_from_fim(jnp.asarray(jac_fd).T @ j_theta @ jnp.asarray(jac_fd))
    peb = dj.peb(X0, ROOM)
    assert np.isfinite(float(peb)) and 1e-6 < float(peb) < 1e-3
    assert float(peb) == pytest.approx(float(peb_fd), rel=1e-6)
    # and the walls change it: the room is not the two-ray world
    assert abs(float(peb) / float(dj.peb(X0, dj.TwoRayModel(SCENE))) - 1) > 1e-3


def test_estimators_take_the_room_model_unchanged():
    key = jax.random.key(3)
    xs = _positions(4, seed=4)
    r = dj.simulate_phases_batch(key, ROOM, xs, jnp.zeros(4))
    res = dj.refine_batch(xs + 0.01, r, ROOM)
    assert float(jnp.max(jnp.linalg.norm(res.x - xs, axis=-1))) < 1e-3


# --- bad input ------------------------------------------------------------------------------


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="normal must be a non-zero"):
        dj.Reflector((0, 0, 0), (0, 0, 0), 4.0)
    with pytest.raises(ValueError, match="eps_r must be finite"):
        dj.Reflector((0, 0, 0), (0, 0, 1), complex(np.nan, 0))
    with pytest.raises(ValueError, match="behind"):
        ROOM.mean(jnp.array([11.0, 5.0, 2.0]))
    with pytest.raises(ValueError, match="behind"):
        dj.ImageSourceModel(SCENE, [dj.Reflector((0, 0, 3.0), (0, 0, -1), 4.0, name="mezzanine")])
    with pytest.raises(ValueError, match="walls"):
        dj.box_room((10, 10, 4), floor=4.0, walls="unobtainium", frequency_hz=8e8)
    with pytest.raises(ValueError, match="frequency_hz"):
        dj.box_room((10, 10, 4), floor="concrete")
    with pytest.raises(ValueError, match="size"):
        dj.box_room((10, -1, 4), floor=4.0)
    with pytest.raises(ValueError, match="order"):
        dj.ImageSourceModel(SCENE, ROOM.reflectors, order=3)


def test_a_nan_permittivity_is_refused_at_every_entry():
    refl = dj.physics.Reflector([0, 0, 0], [0, 0, 1], 3.0 - 0.1j, name="floor")
    with pytest.raises(ValueError, match="eps_r must be finite"):
        refl.with_permittivity(complex(np.nan, 0.0))
    with pytest.raises(ValueError, match="eps_r must be finite"):
        dj.physics.Reflector([0, 0, 0], [0, 0, 1], np.nan, name="floor")
