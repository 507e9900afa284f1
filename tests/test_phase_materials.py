import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax.materials import ITU_MATERIALS, is_perfect_conductor, relative_permittivity


def test_wrap_range_and_identity():
    z = jnp.linspace(-50.0, 50.0, 100_001)
    w = dj.wrap(z)
    assert float(w.min()) >= -np.pi and float(w.max()) < np.pi
    # wrap only removes multiples of 2 pi
    k = (z - w) / (2 * np.pi)
    np.testing.assert_allclose(k, np.round(k), atol=1e-9)


def test_wrap_boundaries():
    assert float(dj.wrap(jnp.pi)) == pytest.approx(-np.pi)
    assert float(dj.wrap(-jnp.pi)) == pytest.approx(-np.pi)
    # one ulp below -pi: mod(x + pi, 2 pi) rounds to exactly 2 pi, and unguarded
    # mod-and-shift would return +pi; wrap must fold it back to -pi
    below = np.nextafter(-np.pi, -np.inf)
    assert float(jnp.mod(below + np.pi, 2 * np.pi) - np.pi) >= np.pi  # the edge is real
    assert float(dj.wrap(below)) == pytest.approx(-np.pi)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_wrap_preserves_dtype(dtype):
    assert dj.wrap(jnp.ones(3, dtype)).dtype == dtype


def test_circular_mean_across_branch_cut():
    a = jnp.array([np.pi - 0.1, -np.pi + 0.1])
    assert abs(abs(float(dj.phase.circular_mean(a))) - np.pi) < 1e-12
    assert float(dj.phase.circular_mean(jnp.array([0.1, 0.3]))) == pytest.approx(0.2)


def test_concrete_conventions():
    itu = relative_permittivity("concrete", 800e6)
    paper = relative_permittivity("concrete", 800e6, convention="paper")
    assert itu.real == pytest.approx(5.24)
    assert itu.imag == pytest.approx(-0.872, abs=5e-4)
    assert paper.real == pytest.approx(5.24)
    assert paper.imag == pytest.approx(-0.0096, abs=5e-5)


def test_itu_formula_at_1ghz_is_the_table():
    # at f = 1 GHz, eps' = a and sigma = c, so eps'' = 17.98 c
    for name, row in ITU_MATERIALS.items():
        eps = relative_permittivity(name, 1e9)
        assert eps.real == pytest.approx(row.a)
        assert eps.imag == pytest.approx(-17.98 * row.c)


@pytest.mark.parametrize(
    "name",
    [
        "concrete",
        "brick",
        "plasterboard",
        "wood",
        "glass",
        "ceiling_board",
        "chipboard",
        "floorboard",
        "very_dry_ground",
        "medium_dry_ground",
        "wet_ground",
        "metal",
    ],
)
def test_required_materials_present_and_lossy(name):
    eps = relative_permittivity(name, 800e6)
    assert eps.real >= 1.0 and eps.imag <= 0.0


def test_metal_is_perfect_conductor():
    assert is_perfect_conductor("metal") and not is_perfect_conductor("concrete")
    scene = dj.paper_scene(material="metal")
    assert scene.perfect_conductor
    x = jnp.array([3.0, 4.0, 1.5])
    pp = dj.physics.path_parameters(x, scene)
    np.testing.assert_allclose(np.asarray(pp.gamma), -1.0)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(material="unobtainium", frequency_hz=1e9), "material must be one of"),
        (dict(material="concrete", frequency_hz=-1.0), "frequency_hz"),
        (dict(material="concrete", frequency_hz=1e9, convention="si"), "convention"),
    ],
)
def test_material_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        relative_permittivity(**kwargs)
