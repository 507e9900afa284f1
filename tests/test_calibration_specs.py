"""dmimo_jax.calibration.groups as requests: what calibrate fits, as objects with their
options; the strings are their shorthands (the same fit to the bit)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax.calibration import (
    FIT_GROUPS,
    GROUPS,
    Offsets,
    Polarization,
    Positions,
    Surfaces,
    as_fit_groups,
    calibrate,
)

SCENE = dj.paper_scene(-10.0, convention="itu")
M, L = SCENE.num_aps, 12


def _data():
    rng = np.random.default_rng(0)
    scene = SCENE.replace(
        ap_phase_offsets=rng.uniform(-np.pi, np.pi, M),
        ap_positions=SCENE.ap_positions + jnp.asarray(rng.normal(0, 0.005, (M, 3))),
    )
    world = dj.TwoRayModel(scene)
    x = dj.sample_positions(jax.random.key(0), L, SCENE)
    return x, jax.vmap(world.mean)(x), jax.vmap(world.variance)(x)


def test_strings_are_the_groups_with_their_defaults():
    assert GROUPS == tuple(g.name for g in FIT_GROUPS)
    got = as_fit_groups(("polarization", Offsets(), "ap_positions"))
    assert [type(g) for g in got] == [Positions, Offsets, Polarization]  # the fit's order
    assert got[0].free_axes is None and got[0].prior is None and got[0].start is None
    assert [type(g) for g in as_fit_groups(Surfaces(names=("ground",)))] == [Surfaces]
    for bad, match in [
        ((), "fit must name groups"),
        (("offsets",), "fit must name groups"),
        ((Positions(), "ap_positions"), "must not repeat"),
        ((Polarization(),), "continuous group"),
        ((3,), "fit must name groups"),
    ]:
        with pytest.raises(ValueError, match=match):
            as_fit_groups(bad)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_an_object_fit_equals_its_shorthand_and_its_options_apply():
    x, r, var = _data()
    nominal = dj.TwoRayModel(SCENE)
    by_name = calibrate(nominal, x, r, var, fit=("ap_positions", "ap_phase_offsets"), warn=False)
    by_object = calibrate(nominal, x, r, var, fit=(Positions(), Offsets()), warn=False)
    for k in ("ap_positions", "ap_phase_offsets"):
        np.testing.assert_array_equal(by_object.values[k], by_name.values[k])
    assert by_object.fit == by_name.fit == ("ap_positions", "ap_phase_offsets")
    # free_axes: z held, the fitted heights are the nominal ones
    axes = np.ones((M, 3), bool)
    axes[:, 2] = False
    held = calibrate(nominal, x, r, var, fit=(Positions(free_axes=axes), Offsets()), warn=False)
    np.testing.assert_array_equal(held.values["ap_positions"][:, 2], SCENE.ap_positions[:, 2])
    assert not np.allclose(held.values["ap_positions"][:, :2], SCENE.ap_positions[:, :2])
    # a tight prior keeps the centres near the nominal ones
    tight = calibrate(nominal, x, r, var, fit=(Positions(prior=1e-6), Offsets()), warn=False)
    moved = np.abs(np.asarray(tight.values["ap_positions"]) - np.asarray(SCENE.ap_positions))
    free = np.abs(np.asarray(by_name.values["ap_positions"]) - np.asarray(SCENE.ap_positions))
    assert moved.max() < 0.1 * free.max()
