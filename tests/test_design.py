"""dmimo_jax.design: AP placement by the gradient of the PEB."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import design

SCENE = dj.paper_scene(-10.0)


def test_mean_peb_gradient_matches_finite_differences():
    xs = dj.sample_positions(jax.random.key(0), 8, SCENE)

    @jax.jit
    def mean_peb(ap):
        return jnp.mean(design.peb_values(SCENE.replace(ap_positions=ap), xs))

    ap0 = SCENE.ap_positions
    grad = np.asarray(jax.grad(mean_peb)(ap0))
    h = 1e-5
    for m, k in [(0, 0), (3, 1), (7, 2), (12, 0), (16, 1)]:
        e = jnp.zeros_like(ap0).at[m, k].set(h)
        fd = (float(mean_peb(ap0 + e)) - float(mean_peb(ap0 - e))) / (2 * h)
        assert grad[m, k] == pytest.approx(fd, rel=1e-5, abs=1e-12)


def test_net_round_trip():
    size = np.asarray(SCENE.room_size)
    pts = np.array(
        [[3.0, 4.0, 4.0], [0.0, 2.0, 1.5], [10.0, 7.0, 0.5], [5.0, 0.0, 3.0], [1.0, 10.0, 2.0]]
    )
    st = design.room_to_net(pts, size)
    np.testing.assert_allclose(np.asarray(design.net_to_room(st, size)), pts, atol=1e-12)


@pytest.mark.parametrize(("surfaces", "objective"), [("ceiling", "mean"), ("ceiling+walls", "max")])
@pytest.mark.slow
def test_optimized_layout_meets_the_constraints_and_lowers_the_objective(surfaces, objective):
    start = SCENE.replace(
        ap_positions=design.sample_layout(
            jax.random.key(1), 17, SCENE.room_size, surfaces=surfaces, min_separation=1.2
        )
    )
    res = design.optimize_ap_positions(
        start,
        jax.random.key(2),
        objective=objective,
        surfaces=surfaces,
        min_separation=1.2,
        steps=40,
        num_ue=64,
        progress=False,
    )
    # "max" first descends the mean for steps // 2 steps
    assert res.history.shape == ((60,) if objective == "max" else (40,))
    ap = np.asarray(res.scene.ap_positions)
    assert design.min_pairwise_distance(ap) >= 1.2 * (1 - 1e-3)
    w, d, h = np.asarray(SCENE.room_size)
    st = design.room_to_net(ap, SCENE.room_size)  # raises when an AP is off every surface
    assert st.shape == (17, 2)
    assert np.all((ap >= -1e-9) & (ap <= np.array([w, d, h]) + 1e-9))
    if surfaces == "ceiling":
        np.testing.assert_allclose(ap[:, 2], h)
    else:
        assert np.all(ap[:, 2] >= 0.5 - 1e-9)
    xs = dj.sample_positions(jax.random.key(3), 512, SCENE)

    def value(s):
        return float(design.layout_objective(design.peb_values(s, xs), objective))

    assert value(res.scene) < value(start)


def test_bad_input_raises_clear_errors():
    key = jax.random.key(0)
    off = SCENE.replace(ap_positions=SCENE.ap_positions.at[0, 2].set(3.5))
    with pytest.raises(ValueError, match="no mounting surface"):
        design.optimize_ap_positions(off, key, steps=1, progress=False)
    with pytest.raises(ValueError, match="below min_separation"):
        design.optimize_ap_positions(SCENE, key, min_separation=2.0, steps=1, progress=False)
    with pytest.raises(ValueError, match="objective"):
        design.optimize_ap_positions(SCENE, key, objective="median", steps=1, min_separation=0.5)
    with pytest.raises(ValueError, match="mean_steps"):
        design.optimize_ap_positions(SCENE, key, mean_steps=-1, steps=1, min_separation=0.5)
    with pytest.raises(ValueError, match="surfaces"):
        design.optimize_ap_positions(SCENE, key, surfaces="floor", steps=1, min_separation=0.5)
    with pytest.raises(ValueError, match="could not place"):
        design.sample_layout(key, 17, SCENE.room_size, min_separation=5.0, max_candidates=2000)
