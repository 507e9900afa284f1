"""dmimo_jax.tiles: tiles of the UE region with their own APs (locality), the halls of the
paper's AP density, and the exact MLE over tiles (locality off: today's answers)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import tiles
from dmimo_jax.datasets import hall_scene
from dmimo_jax.estimators import phasor_table, search_grid
from tests.helpers import run_on_host_devices


def test_halls_hold_the_papers_density_and_are_reproducible():
    sizes = {side: hall_scene(side).num_aps for side in (10, 20, 40)}
    assert sizes == {10: 17, 20: 68, 40: 272}
    a, b = hall_scene(20, seed=3), hall_scene(20, seed=3)
    np.testing.assert_array_equal(np.asarray(a.ap_positions), np.asarray(b.ap_positions))
    assert not np.array_equal(np.asarray(a.ap_positions), np.asarray(hall_scene(20).ap_positions))
    ap = np.asarray(a.ap_positions)
    assert np.all((ap[:, :2] > 0) & (ap[:, :2] < 20)) and np.all(ap[:, 2] == 4.0)
    with pytest.raises(ValueError, match="side"):
        hall_scene(1.0)


def test_tile_boxes_cover_the_region_without_overlap():
    scene = hall_scene(20)
    low, high = tiles.tile_boxes(scene, 5.0)
    assert low.shape == (16, 3)
    area = np.sum(np.prod((high - low)[:, :2], axis=1))
    np.testing.assert_allclose(area, 19.0**2)
    assert np.all(high[:, :2] - low[:, :2] <= 5.0 + 1e-12)


def test_each_tiles_aps_keep_its_bound_within_the_factor():
    """The 'bound' rule: every tile's worst ratio of its K-AP PEB to the all-AP PEB is within
    the factor, and the ratio is the PEB of the tile's own scene (bounds.peb, independent of
    the nested sums) over the full scene's; 'all' is K = M at ratio 1."""
    scene = hall_scene(20)
    tiling = tiles.tile_aps(scene, 10.0, factor=2.0)
    assert tiling.num_tiles == 4 and 4 <= tiling.num_aps < scene.num_aps
    assert np.all(tiling.ratio <= 2.0) and np.all(tiling.ratio >= 1.0)
    fewer = tiles.tile_aps(scene, 10.0, factor=3.0)
    assert fewer.num_aps <= tiling.num_aps
    t = 2
    sub = tiles.tile_scene(scene, tiling, t)
    corner = jnp.asarray(tiling.low[t])  # a corner of the tile: one of the rule's points
    ratio = float(dj.peb(corner, sub) / dj.peb(corner, scene))
    assert 1.0 <= ratio <= tiling.ratio[t] + 1e-9
    every = tiles.tile_aps(scene, 10.0, rule="all")
    assert every.num_aps == 68 and np.allclose(every.ratio, 1.0)
    near = tiles.tile_aps(scene, 10.0, rule="nearest", num_aps=12)
    assert near.aps.shape == (4, 12)
    for bad, match in (
        (dict(rule="closest"), "rule"),
        (dict(factor=0.5), "factor"),
        (dict(rule="nearest"), "num_aps"),
        (dict(num_aps=12), "num_aps"),
    ):
        with pytest.raises(ValueError, match=match):
            tiles.tile_aps(scene, 10.0, **bad)


def test_a_tiles_table_is_the_all_ap_table_restricted_to_its_aps():
    scene = hall_scene(20)
    tiling = tiles.tile_aps(scene, 10.0, factor=2.0)
    sub = dj.TwoRayModel(tiles.tile_scene(scene, tiling, 1))
    grid = search_grid(sub, 0.5, "ue")
    mine = np.asarray(phasor_table(sub, grid).data)
    every = np.asarray(phasor_table(dj.TwoRayModel(scene), grid).data)
    m, aps = scene.num_aps, tiling.aps[1]
    np.testing.assert_array_equal(mine, every[:, np.concatenate([aps, m + aps])])


def test_locality_off_is_todays_exhaustive_search_and_refinement():
    """One tile of every AP: tiled_egs equals egs then refine_batch (to 1e-12 m: the same
    arithmetic in two compiled programs, which may round differently) wherever that found
    the optimum, and is better by more than 1 in ML cost where a refined start beat it (on
    this coarse lambda/2 grid, one of six)."""
    scene = dj.paper_scene(-10.0)
    model = dj.TwoRayModel(scene)
    x, r, _, _ = dj.measure.labeled_snapshots(jax.random.key(5), model, 6)
    lam = float(scene.wavelength)
    one = tiles.tile_aps(scene, 100.0, rule="all")
    assert one.num_tiles == 1
    got = tiles.tiled_egs(r, scene, one, lam / 2)
    found = dj.egs(r, model, phasor_table(model, search_grid(model, lam / 2, "ue")))
    want = dj.refine_batch(found.x, r, model, num_steps=25)
    same = np.asarray(got.cost) >= np.asarray(want.cost) - 1.0
    assert same.sum() >= 1 and np.all(np.asarray(got.cost)[~same] < np.asarray(want.cost)[~same])
    np.testing.assert_allclose(
        np.asarray(got.x)[same], np.asarray(want.x)[same], rtol=0, atol=1e-12
    )
    np.testing.assert_allclose(np.asarray(got.cost)[same], np.asarray(want.cost)[same], rtol=1e-9)


@pytest.mark.slow  # tables of four tiles of a 20 m hall
def test_the_tiled_mle_locates_a_hall_at_its_bound():
    """A 20 m hall of 68 APs, four tiles of K APs within 2x the all-AP PEB: every answer
    on the right lobe (within 5 all-AP PEBs), the tile that holds the UE wins (or one it
    borders), and prebuilt
    tables give the same answers as tables built one tile at a time."""
    scene = hall_scene(20)
    model = dj.TwoRayModel(scene)
    tiling = tiles.tile_aps(scene, 10.0, factor=2.0)
    x, r, _, _ = dj.measure.labeled_snapshots(jax.random.key(2), model, 16)
    lam = float(scene.wavelength)
    out = tiles.tiled_egs(r, scene, tiling, lam / 4)
    err = np.linalg.norm(np.asarray(out.x - x), axis=1)
    pebs = np.asarray(dj.peb_map(x, model))
    assert np.all(err < 5 * pebs), (err / pebs).max()
    # the winning tile holds the UE (or borders it: a refinement may cross into a neighbour)
    xs, won = np.asarray(x), np.asarray(out.tile)
    near = lam / 2
    inside = np.all((xs >= tiling.low[won] - near) & (xs <= tiling.high[won] + near), axis=1)
    assert inside.all()
    tables = tiles.tile_tables(scene, tiling, lam / 4)
    again = tiles.tiled_egs(r, scene, tiling, tables=tables)
    np.testing.assert_array_equal(np.asarray(again.x), np.asarray(out.x))


_SHARDED = """
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
import dmimo_jax as dj
from dmimo_jax import tiles
from dmimo_jax.datasets import hall_scene
assert len(jax.devices()) == 4
scene = hall_scene(20)
tiling = tiles.tile_aps(scene, 10.0, factor=2.0)
x, r, _, _ = dj.measure.labeled_snapshots(jax.random.key(4), dj.TwoRayModel(scene), 8)
lam = float(scene.wavelength)
out = {}
for name, devices in (("sharded", jax.devices()), ("single", None)):
    tables = tiles.tile_tables(scene, tiling, lam / 2, devices=devices)  # lambda/2: the same
    # answers on every partition is what is tested, not the search's recall
    print(name, tables.tables.data.sharding)
    res = tiles.tiled_egs(r, scene, tiling, tables=tables)
    out[name] = (np.asarray(res.x), np.asarray(res.tile), np.asarray(res.cost))
loop = tiles.tiled_egs(r, scene, tiling, lam / 2)  # one tile's table at a time
np.testing.assert_array_equal(out["sharded"][1], out["single"][1])  # the same tiles win
np.testing.assert_array_equal(out["single"][1], np.asarray(loop.tile))
for i, want in ((0, loop.x), (2, loop.cost)):  # positions to a nanometre, costs to 1e-9
    tol = dict(rtol=0, atol=1e-9) if i == 0 else dict(rtol=1e-9)
    np.testing.assert_allclose(out["sharded"][i], out["single"][i], **tol)
    np.testing.assert_allclose(out["single"][i], np.asarray(want), **tol)
print("IDENTICAL")
"""


@pytest.mark.slow  # a subprocess of four host devices
def test_tiles_sharded_over_four_devices_give_the_one_device_answers():
    """Tiles split over four host devices (jax.sharding along the tile axis) give the one
    device's answers (the same winning tiles; positions to a nanometre, five orders of
    magnitude below the PEB, and ML costs to 1e-9: the rounding of another partition of one
    program, whose LM steps XLA fuses differently, measured up to 7e-12 m), and the loop
    that builds one tile's table at a time the same."""
    out = run_on_host_devices(_SHARDED)
    assert "NamedSharding" in out and "IDENTICAL" in out
