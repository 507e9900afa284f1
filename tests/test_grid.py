import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import estimators as est

SCENE = dj.paper_scene()
LAM = float(SCENE.wavelength)
BOX_LOW, BOX_HIGH = np.array([3.0, 3.0, 1.0]), np.array([4.2, 4.2, 2.2])


def test_room_grid_matches_paper_point_count():
    g = est.make_grid([0.0, 0.0, 0.0], SCENE.room_size, LAM / 8)
    assert g.shape == (213, 213, 85) and g.size == 3_856_365
    # V / delta^3 of the paper, up to the partial cells at the box edges
    assert g.size == pytest.approx(400.0 / (LAM / 8) ** 3, rel=0.02)
    pts = np.asarray(est.grid_points(g, jnp.array([0, g.size - 1])))
    np.testing.assert_allclose(pts[0], [LAM / 16] * 3)
    assert np.all(pts[1] < np.asarray(SCENE.room_size)) and pts[:, 2].min() > 0


@pytest.mark.parametrize("spacing", [0.0, -0.1, float("nan"), float("inf")])
def test_make_grid_bad_spacing(spacing):
    with pytest.raises(ValueError, match="spacing"):
        est.make_grid([0, 0, 0], [1, 1, 1], spacing)


def test_make_grid_box_smaller_than_cell():
    with pytest.raises(ValueError, match="smaller than one cell"):
        est.make_grid([0, 0, 0], [1, 1, 0.01], 0.05)


def _noise_free_snapshots(n, seed):
    loud = dj.paper_scene(power_dbm=200.0)
    u = jax.random.uniform(jax.random.key(seed), (n, 3))
    xs = jnp.asarray(BOX_LOW + 0.1)[None, :] + u * jnp.asarray(BOX_HIGH - BOX_LOW - 0.2)[None, :]
    cpos = dj.random_cpos(jax.random.key(seed + 1), n)
    return xs, dj.simulate_phases_batch(jax.random.key(seed + 2), loud, xs, cpos)


def test_lambda8_egs_noise_free_within_one_cell_diagonal():
    grid = est.make_grid(BOX_LOW, BOX_HIGH, LAM / 8)
    xs, r = _noise_free_snapshots(200, seed=0)
    res = est.egs(r, SCENE, grid)
    err = np.linalg.norm(np.asarray(res.x - xs), axis=1)
    assert np.mean(err <= np.sqrt(3) * LAM / 8) >= 0.99
    # EGS + refinement recovers the truth
    fine = est.refine_batch(res.x, r, SCENE)
    assert np.mean(np.linalg.norm(np.asarray(fine.x - xs), axis=1) < 1e-6) >= 0.99


def test_table_and_table_free_paths_agree():
    grid = est.make_grid(BOX_LOW, BOX_HIGH, LAM / 8)
    xs = jnp.asarray(BOX_LOW + 0.3)[None, :] + 0.5 * jax.random.uniform(jax.random.key(3), (64, 3))
    r = dj.simulate_phases_batch(
        jax.random.key(4), SCENE, xs, dj.random_cpos(jax.random.key(5), 64)
    )
    table = est.phase_table(SCENE, grid)
    assert table.shape == (grid.size, 17)
    a = est.egs(r, SCENE, grid)
    b = est.egs(r, SCENE, grid, table=table)
    np.testing.assert_array_equal(np.asarray(a.index), np.asarray(b.index))
    np.testing.assert_allclose(np.asarray(a.cost), np.asarray(b.cost), rtol=1e-12, atol=1e-12)
    # chunk size is an implementation detail
    c = est.egs(r, SCENE, grid, chunk_size=1000)
    np.testing.assert_array_equal(np.asarray(a.index), np.asarray(c.index))
    # a single snapshot is a batch of one
    d = est.egs(r[5], SCENE, grid, table=table)
    assert int(d.index[0]) == int(a.index[5])


@pytest.mark.parametrize(
    "r, kwargs, match",
    [
        (jnp.zeros(16), {}, r"r must have shape \(17,\)"),
        (jnp.zeros(17).at[0].set(jnp.nan), {}, "r must be finite"),
        (jnp.zeros(17), {"chunk_size": 0}, "chunk_size"),
        (jnp.zeros(17), {"table": jnp.zeros((5, 17))}, "table must have shape"),
    ],
)
def test_egs_bad_input(r, kwargs, match):
    grid = est.make_grid(BOX_LOW, BOX_HIGH, LAM / 2)
    with pytest.raises(ValueError, match=match):
        est.egs(r, SCENE, grid, **kwargs)
