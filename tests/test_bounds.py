import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from tests.helpers import assert_allclose

SCENE = dj.paper_scene()
X0 = jnp.array([6.5, 5.0, 2.0])


def _positions(n, seed=0):
    return dj.sample_positions(jax.random.key(seed), n, SCENE)


def test_channel_fim_blocks_eqs_11_12():
    m = SCENE.num_aps
    fim = np.asarray(dj.bounds.channel_fim(X0, SCENE))
    a = np.asarray(dj.physics.effective_amplitude(X0, SCENE))
    s = 2 * float(SCENE.tx_power) / float(SCENE.noise_power)
    assert_allclose(fim, fim.T)
    assert fim[0, 0] == pytest.approx(s * np.sum(a**2), rel=1e-12)
    assert_allclose(fim[1 : m + 1, 1 : m + 1], s * np.eye(m), rtol=1e-12, atol=1e-12 * s)
    assert_allclose(
        fim[m + 1 :, m + 1 :], s * np.diag(a**2), rtol=1e-12, atol=1e-12 * s * a.max() ** 2
    )
    np.testing.assert_allclose(fim[0, 1 : m + 1], 0.0, atol=1e-12 * s * a.max())
    np.testing.assert_allclose(fim[1 : m + 1, m + 1 :], 0.0, atol=1e-12 * s * a.max())
    assert_allclose(fim[0, m + 1 :], s * a**2, rtol=1e-12)
    # rank 2M: the phases and the CPO are coupled
    assert np.linalg.matrix_rank(fim, tol=1e-9 * np.abs(fim).max()) == 2 * m


@pytest.mark.parametrize("pol", ["TE", "TM"])
def test_efim_schur_equals_closed_form(pol):
    scene = SCENE.replace(polarization=pol)
    for x in _positions(10, seed=1):
        schur = dj.bounds.efim_schur(dj.bounds.channel_fim(x, scene))
        closed = dj.bounds.efim(x, scene)
        scale = float(jnp.abs(closed).max())
        np.testing.assert_allclose(np.asarray(schur), np.asarray(closed), atol=1e-12 * scale)
        np.testing.assert_allclose(
            np.asarray(dj.bounds.efim_from_variance(dj.physics.phase_noise_var(x, scene))),
            np.asarray(closed),
            atol=1e-12 * scale,
        )
        # a common phase shift carries no information: EFIM @ 1 = 0
        np.testing.assert_allclose(np.asarray(closed @ jnp.ones(17)), 0.0, atol=1e-12 * scale)


def test_efim_schur_rejects_bad_shape():
    with pytest.raises(ValueError, match="odd size"):
        dj.bounds.efim_schur(jnp.eye(4))


@pytest.mark.parametrize(
    "material, pol",
    [
        ("concrete", "TE"),
        ("glass", "TE"),
        ("wet_ground", "TE"),
        ("concrete", "TM"),
        ("metal", "TE"),
    ],
)
@pytest.mark.parametrize("convention", ["itu", "paper"])
def test_analytic_jacobian_matches_autodiff(material, pol, convention):
    scene = dj.paper_scene(material=material, polarization=pol, convention=convention)
    xs = jnp.concatenate(
        [
            _positions(200, seed=2),
            # straight below every AP, where the printed Appendix has 0/0
            jnp.column_stack([scene.ap_positions[:, :2], jnp.full(17, 1.7)]),
        ]
    )
    auto = jax.vmap(dj.bounds.phase_jacobian, (0, None))(xs, scene)
    analytic = jax.vmap(dj.bounds.jacobian_analytic, (0, None))(xs, scene)
    assert np.all(np.isfinite(np.asarray(analytic)))
    scale = np.abs(np.asarray(auto)).max(axis=(1, 2), keepdims=True)
    rel = np.abs(np.asarray(analytic - auto)) / scale
    assert rel.max() < 1e-10


def test_appendix_printed_sign_is_flipped():
    """Eq. (A1) as printed returns -dtheta/dx; LoS-only makes the sign unambiguous."""
    vac = SCENE.replace(eps_r=1.0 + 0j)
    printed = dj.bounds.jacobian_analytic(X0, vac, paper_sign=True)
    correct = dj.bounds.jacobian_analytic(X0, vac)
    delta = np.asarray(X0)[None, :] - np.asarray(SCENE.ap_positions)
    d1 = np.linalg.norm(delta, axis=1, keepdims=True)
    expected = 2 * np.pi / float(SCENE.wavelength) * delta / d1  # d(2 pi d1 / lam)/dx
    assert_allclose(correct, expected)
    assert_allclose(printed, -expected)
    # and the sign does not change the position FIM
    j = dj.bounds.efim(X0, SCENE)
    h = dj.bounds.jacobian_analytic(X0, SCENE)
    hp = dj.bounds.jacobian_analytic(X0, SCENE, paper_sign=True)
    assert_allclose(h.T @ j @ h, hp.T @ j @ hp)


def test_peb_against_finite_differences():
    """PEB from a central-difference Jacobian agrees with the autodiff one."""
    for x in _positions(10, seed=3):
        h_step = 1e-6
        cols = []
        for k in range(3):
            e = jnp.zeros(3).at[k].set(h_step)
            cols.append(
                (
                    dj.physics.unwrapped_phase(x + e, SCENE)
                    - dj.physics.unwrapped_phase(x - e, SCENE)
                )
                / (2 * h_step)
            )
        h_fd = jnp.stack(cols, axis=1)
        j_fd = h_fd.T @ dj.bounds.efim(x, SCENE) @ h_fd
        peb_fd = float(jnp.sqrt(jnp.trace(jnp.linalg.inv(j_fd))))
        assert float(dj.peb(x, SCENE)) == pytest.approx(peb_fd, rel=1e-5)


def test_peb_physical_scaling():
    p10 = float(dj.peb(X0, dj.paper_scene(power_dbm=-10.0)))
    p30 = float(dj.peb(X0, dj.paper_scene(power_dbm=-30.0)))
    assert p30 / p10 == pytest.approx(10.0, rel=1e-10)  # PEB ~ 1 / sqrt(P)
    assert 1e-5 < p10 < 1e-4  # tens of micrometres at -10 dBm
    # removing APs can only lose information
    sub = SCENE.replace(ap_positions=SCENE.ap_positions[:8])
    assert float(dj.peb(X0, sub)) > p10


def test_peb_matches_monte_carlo_of_linearized_estimator():
    """Cramer-Rao check: the efficient linearized WLS estimator with the CPO as a nuisance
    has error covariance J(x)^{-1}; its Monte-Carlo RMSE matches the PEB."""
    x = X0
    h = dj.bounds.phase_jacobian(x, SCENE)
    var = dj.physics.phase_noise_var(x, SCENE)
    a = jnp.concatenate([h, jnp.ones((17, 1))], axis=1)  # unknowns: dx (3) and dphi (1)
    w = 1.0 / var
    gain = jnp.linalg.solve(a.T @ (w[:, None] * a), a.T * w[None, :])
    noise = jax.random.normal(jax.random.key(0), (20_000, 17)) * jnp.sqrt(var)[None, :]
    err = noise @ gain.T
    rmse = float(jnp.sqrt(jnp.mean(jnp.sum(err[:, :3] ** 2, axis=1))))
    assert rmse == pytest.approx(float(dj.peb(x, SCENE)), rel=0.02)


def test_peb_map_matches_vmap_and_chunking():
    xs = _positions(300, seed=4)
    ref = jax.vmap(dj.peb, (0, None))(xs, SCENE)
    for bs in (7, 10_000):
        assert_allclose(dj.peb_map(xs, SCENE, batch_size=bs), ref, rtol=1e-12)
    assert_allclose(dj.peb_map(xs, dj.TwoRayModel(SCENE)), ref, rtol=1e-12)


def test_a_chunked_map_compiles_its_body_once_for_any_length():
    """map_in_chunks (peb_map's loop) splits 300 positions into two chunks of 150: one copy
    of the PEB in the program, where lax.map's remainder (256 + 44) compiled a second."""
    from dmimo_jax import bounds

    model = dj.TwoRayModel(SCENE)

    def lines(n):
        xs = _positions(n, seed=5)
        return len(bounds.information._peb_map.lower(xs, model, 256).as_text().splitlines())

    assert lines(300) < 1.1 * lines(256)  # 1,510 against 773 with lax.map's remainder


def test_peb_gradient_finite_below_ap():
    x = jnp.array([5.0, 5.0, 2.0])
    g = jax.jit(jax.grad(dj.peb))(x, SCENE)
    assert np.all(np.isfinite(np.asarray(g)))


@pytest.mark.parametrize(
    "xs, kwargs, match",
    [
        (jnp.array([[1.0, 1.0, np.nan]]), {}, "finite"),
        (jnp.ones((3,)), {}, r"shape \(N, 3\)"),
        (jnp.array([[1.0, 1.0, 0.0]]), {}, "above the ground"),
        (jnp.ones((2, 3)), {"batch_size": 0}, "batch_size"),
    ],
)
def test_peb_map_validation(xs, kwargs, match):
    with pytest.raises(ValueError, match=match):
        dj.peb_map(xs, SCENE, **kwargs)


def test_peb_map_does_not_retrace_for_same_shapes():
    from dmimo_jax import bounds

    traced = chex.assert_max_traces(bounds.information._peb_map.__wrapped__, n=1)
    fn = jax.jit(traced, static_argnames=("batch_size",))
    xs = _positions(16, seed=6)
    # the private core takes a PhaseModel (peb_map converts a Scene before it)
    a = fn(xs, dj.TwoRayModel(SCENE), 8)
    b = fn(xs + 0.01, dj.TwoRayModel(dj.paper_scene(power_dbm=-20.0)), 8)  # same shapes
    assert float(jnp.mean(b)) > float(jnp.mean(a))


@pytest.mark.parametrize("power", [-10.0, -40.0])
def test_the_order_m_fim_equals_the_dense_one(power):
    """fim_from_jacobian (O(M), no M x M EFIM) equals H^T J(theta) H with the dense EFIM of
    eq. (13b) to 1e-12 relative, with and without APs left out (weight 0)."""
    from dmimo_jax.bounds import efim_from_variance, fim_from_jacobian, linearize

    scene = dj.paper_scene(power)
    model = dj.TwoRayModel(scene)
    for x in ([6.5, 5.0, 2.0], [1.0, 9.0, 0.7], [5.0, 5.0, 3.4]):
        _, h, var = linearize(jnp.asarray(x), model)
        dense = h.T @ efim_from_variance(var) @ h
        fast = fim_from_jacobian(h, 1.0 / var)
        np.testing.assert_allclose(np.asarray(fast), np.asarray(dense), rtol=1e-12, atol=0)
        out = jnp.arange(17) % 5 == 0
        w = jnp.where(out, 0.0, 1.0 / var)
        dense = h.T @ (jnp.diag(w) - jnp.outer(w, w) / jnp.sum(w)) @ h
        np.testing.assert_allclose(
            np.asarray(fim_from_jacobian(h, w)), np.asarray(dense), rtol=1e-12
        )
