import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax.deployments import paper_scene_data
from dmimo_jax.scene import SPEED_OF_LIGHT


def test_paper_scene_values():
    s = dj.paper_scene()
    assert s.num_aps == 17
    assert float(s.wavelength) == pytest.approx(SPEED_OF_LIGHT / 800e6)
    assert float(s.tx_power) == pytest.approx(1e-4)  # -10 dBm
    assert float(s.noise_power) == pytest.approx(1.38e-23 * 290 * 180e3 * 10**0.3)
    assert complex(s.eps_r) == pytest.approx(5.24 - 0.0096j, abs=5e-5)
    np.testing.assert_allclose(np.asarray(s.ap_positions), paper_scene_data()["aps"])
    assert np.all(np.asarray(s.ap_positions)[:, 2] == 4.0)
    np.testing.assert_allclose(np.asarray(s.ue_low), [0.5, 0.5, 0.5])
    np.testing.assert_allclose(np.asarray(s.ue_high), [9.5, 9.5, 3.5])
    np.testing.assert_allclose(np.asarray(s.room_size), [10.0, 10.0, 4.0])
    assert s.polarization == "TE" and s.ap_positions.dtype == jnp.float64


def test_paper_scene_itu_convention():
    s = dj.paper_scene(convention="itu")
    assert complex(s.eps_r).imag == pytest.approx(-0.872, abs=5e-4)


def test_scene_is_a_pytree():
    s = dj.paper_scene()
    leaves, treedef = jax.tree.flatten(s)
    s2 = jax.tree.unflatten(treedef, leaves)
    assert s2.polarization == s.polarization and s2.num_aps == s.num_aps
    # jit through a scene, and a transform that puts non-array leaves in it
    out = jax.jit(lambda sc: sc.wavelength * 2)(s)
    assert float(out) == pytest.approx(2 * float(s.wavelength))
    jax.tree.map(lambda _: None, s)
    # grad reaches eps_r
    g = jax.jit(jax.grad(lambda e: dj.peb(jnp.array([6.5, 5.0, 2.0]), s.replace(eps_r=e))))(5.0)
    assert np.isfinite(float(g))


def test_astype_float32():
    s32 = dj.paper_scene().astype(jnp.float32)
    assert s32.ap_positions.dtype == jnp.float32 and s32.eps_r.dtype == jnp.complex64


def test_units_roundtrip():
    p = jnp.array([-60.0, -10.0, 0.0, 30.0])
    np.testing.assert_allclose(
        np.asarray(dj.scene.watt_to_dbm(dj.scene.dbm_to_watt(p))), np.asarray(p)
    )
    assert float(dj.scene.dbm_to_watt(30.0)) == pytest.approx(1.0)


def _kwargs(**changes):
    base = dict(
        ap_positions=[[1.0, 1.0, 4.0], [5.0, 5.0, 4.0]],
        wavelength=0.375,
        eps_r=5.0 - 0.1j,
        tx_power=1e-4,
        noise_power=1e-15,
        ue_low=[0.5, 0.5, 0.5],
        ue_high=[9.5, 9.5, 3.5],
    )
    base.update(changes)
    return base


@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(ap_positions=[[1.0, 1.0, -4.0], [5.0, 5.0, 4.0]]), "above the ground"),
        (dict(ap_positions=[[1.0, 1.0, 0.0], [5.0, 5.0, 4.0]]), "above the ground"),
        (dict(ap_positions=[1.0, 1.0, 4.0]), r"shape \(M, 3\)"),
        (dict(ap_positions=[[1.0, 4.0], [5.0, 4.0]]), r"shape \(M, 3\)"),
        (dict(ap_positions=[[np.nan, 1.0, 4.0], [5.0, 5.0, 4.0]]), "finite"),
        (dict(wavelength=0.0), "wavelength must be positive"),
        (dict(wavelength=-0.3), "wavelength must be positive"),
        (dict(tx_power=0.0), "tx_power must be positive"),
        (dict(noise_power=-1.0), "noise_power must be positive"),
        (dict(ue_low=[0.5, 0.5, 0.0]), "ue_low"),
        (dict(ue_low=[9.6, 0.5, 0.5]), "ue_low must be <= ue_high"),
        (dict(polarization="circular"), "polarization"),
    ],
)
def test_scene_validation(changes, match):
    with pytest.raises(ValueError, match=match):
        dj.Scene(**_kwargs(**changes))


def test_sample_ap_positions_seeded_and_separated():
    a = dj.sample_ap_positions(jax.random.key(3), 17, min_separation=1.5)
    b = dj.sample_ap_positions(jax.random.key(3), 17, min_separation=1.5)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    xy = np.asarray(a)[:, :2]
    dist = np.linalg.norm(xy[:, None] - xy[None], axis=-1) + np.eye(17) * 1e9
    assert dist.min() >= 1.5
    assert np.all(np.asarray(a)[:, 2] == 4.0)
    c = dj.sample_ap_positions(jax.random.key(4), 17, min_separation=1.5)
    assert not np.allclose(np.asarray(a), np.asarray(c))


def test_sample_ap_positions_impossible():
    with pytest.raises(ValueError, match="could not place"):
        dj.sample_ap_positions(jax.random.key(0), 50, min_separation=3.0, max_candidates=2000)


def test_sample_positions_in_region():
    s = dj.paper_scene()
    x = np.asarray(dj.sample_positions(jax.random.key(1), 5000, s))
    assert x.shape == (5000, 3)
    assert np.all(x >= np.asarray(s.ue_low)) and np.all(x <= np.asarray(s.ue_high))
    # covers the box
    assert np.all(x.min(0) < np.asarray(s.ue_low) + 0.05)
    assert np.all(x.max(0) > np.asarray(s.ue_high) - 0.05)


def test_a_scene_built_inside_jit_with_a_traced_pattern_is_differentiable():
    sc = dj.paper_scene()
    x = jnp.asarray([4.0, 5.0, 1.5])

    def phase0(q):
        return dj.TwoRayModel(sc.replace(antenna=dj.CosinePattern(q))).mean(x)[0]

    g = jax.jit(jax.grad(phase0))(1.0)
    fd = (phase0(1.0 + 1e-6) - phase0(1.0 - 1e-6)) / 2e-6
    assert float(g) == pytest.approx(float(fd), rel=1e-5)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ap_phase_offsets", np.full(17, 1.0 + 1.0j)),
        ("ap_positions", np.asarray(dj.paper_scene().ap_positions) + 0j),
        ("tx_power", 1.0 + 0.5j),
    ],
)
def test_complex_real_fields_are_refused_not_truncated(field, value):
    with pytest.raises(ValueError, match=f"{field} must be real"):
        dj.paper_scene().replace(**{field: value})


def test_perturb_deployment_of_a_model_names_the_argument():
    with pytest.raises(ValueError, match="scene must be a Scene"):
        dj.perturb_deployment(jax.random.key(0), dj.TwoRayModel(dj.paper_scene()))


def test_a_scene_file_in_the_papers_format_is_the_papers_scene(tmp_path):
    """load_scene reads the shipped scene's format: the paper's file gives paper_scene leaf by
    leaf; a file of one's own (other APs, carrier and link budget) gives the plan's numbers."""
    import json

    from dmimo_jax.deployments import paper_scene_data

    path = tmp_path / "paper.json"
    path.write_text(json.dumps(paper_scene_data()))
    for convention in ("paper", "itu"):
        a = dj.paper_scene(-10.0, convention=convention)
        b = dj.load_scene(path, -10.0, convention=convention)
        for leaf_a, leaf_b in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
            np.testing.assert_array_equal(np.asarray(leaf_a), np.asarray(leaf_b))
    own = {
        "aps": [[1.0, 1.0, 3.0], [5.0, 1.0, 3.0], [3.0, 4.0, 3.0], [3.0, 2.0, 2.5]],
        "carrier_frequency_hz": 3.5e9,
        "bandwidth_hz": 1e6,
        "noise_figure_db": 7.0,
        "ue_region": {"low": [0.5, 0.5, 0.5], "high": [5.5, 4.5, 2.0]},
    }
    (tmp_path / "own.json").write_text(json.dumps(own))
    scene = dj.load_scene(tmp_path / "own.json", 0.0, "metal")
    assert scene.num_aps == 4 and scene.perfect_conductor
    assert float(scene.wavelength) == pytest.approx(299_792_458.0 / 3.5e9, rel=1e-12)
    # k_B T W NF with the paper's k_B, T = 290 K
    assert float(scene.noise_power) == pytest.approx(1.38e-23 * 290 * 1e6 * 10**0.7, rel=1e-12)
    assert float(scene.tx_power) == pytest.approx(1e-3, rel=1e-12)
    np.testing.assert_array_equal(np.asarray(scene.room_size), [5.5, 4.5, 3.0])


def test_deployment_scene_states_the_plan_and_refuses_a_bad_one(tmp_path):
    aps = [[2.0, 2.0, 3.0], [8.0, 2.0, 3.0], [5.0, 8.0, 3.0], [5.0, 5.0, 3.0]]
    region = {"ue_low": [1.0, 1.0, 0.5], "ue_high": [9.0, 9.0, 2.0]}
    scene = dj.deployment_scene(aps, frequency_hz=800e6, ground=4.0 - 0.3j, **region)
    assert complex(scene.eps_r) == 4.0 - 0.3j and not scene.perfect_conductor
    itu = dj.deployment_scene(aps, frequency_hz=800e6, ground="concrete", **region)
    assert complex(itu.eps_r) == pytest.approx(complex(dj.paper_scene(convention="itu").eps_r))
    for bad in (0.0, -1.0, float("nan"), "800 MHz", True):
        with pytest.raises(ValueError, match="frequency_hz must be a positive number"):
            dj.deployment_scene(aps, frequency_hz=bad, **region)
    with pytest.raises(ValueError, match="ap_positions"):
        dj.deployment_scene([[1.0, 1.0]], frequency_hz=800e6, **region)
    (tmp_path / "no_region.json").write_text('{"aps": [[1, 1, 3]], "carrier_frequency_hz": 8e8}')
    with pytest.raises(ValueError, match="missing \\['bandwidth_hz', 'ue_region'\\]"):
        dj.load_scene(tmp_path / "no_region.json")
    with pytest.raises(ValueError, match="cannot read a JSON scene file"):
        dj.load_scene(tmp_path / "absent.json")
