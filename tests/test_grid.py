import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import estimators as est
from tests.helpers import run_on_host_devices

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


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_lambda8_egs_noise_free_within_one_cell_diagonal():
    grid = est.make_grid(BOX_LOW, BOX_HIGH, LAM / 8)
    xs, r = _noise_free_snapshots(200, seed=0)
    res = est.egs(r, SCENE, grid)
    err = np.linalg.norm(np.asarray(res.x - xs), axis=1)
    assert np.mean(err <= np.sqrt(3) * LAM / 8) >= 0.99
    # EGS + refinement recovers the truth
    fine = est.refine_batch(res.x, r, SCENE)
    assert np.mean(np.linalg.norm(np.asarray(fine.x - xs), axis=1) < 1e-6) >= 0.99


def _snapshots_in_box(n, seed, scene=SCENE):
    xs = jnp.asarray(BOX_LOW + 0.3)[None, :] + 0.5 * jax.random.uniform(
        jax.random.key(seed), (n, 3)
    )
    cpos = dj.random_cpos(jax.random.key(seed + 1), n)
    return xs, dj.simulate_phases_batch(jax.random.key(seed + 2), scene, xs, cpos)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_table_and_table_free_paths_agree():
    grid = est.make_grid(BOX_LOW, BOX_HIGH, LAM / 8)
    _, r = _snapshots_in_box(64, seed=3)
    table = est.phasor_table(SCENE, grid, chunk_size=1000)
    assert table.data.shape == (table.num_chunks * 1000, 34) and table.data.dtype == jnp.float32
    a = est.egs(r, SCENE, grid)
    b = est.egs(r, SCENE, table)
    assert bool(jnp.all(b.screened))  # the certificate holds with 64 candidates
    np.testing.assert_array_equal(np.asarray(a.index), np.asarray(b.index))
    np.testing.assert_allclose(np.asarray(a.cost), np.asarray(b.cost), rtol=1e-12, atol=1e-12)
    # chunk size is an implementation detail
    c = est.egs(r, SCENE, grid, chunk_size=1000)
    np.testing.assert_array_equal(np.asarray(a.index), np.asarray(c.index))
    # a single snapshot is a batch of one
    d = est.egs(r[5], SCENE, table)
    assert int(d.index[0]) == int(a.index[5])


def test_table_screen_falls_back_when_its_certificate_fails():
    grid = est.make_grid(BOX_LOW, BOX_HIGH, LAM / 8)
    _, r = _snapshots_in_box(32, seed=6)
    table = est.phasor_table(SCENE, grid)
    exact = est.egs(r, SCENE, grid)
    one = est.egs(r, SCENE, table, num_candidates=1, widen=1)
    assert not bool(jnp.all(one.screened))  # one candidate cannot certify every snapshot
    np.testing.assert_array_equal(np.asarray(one.index), np.asarray(exact.index))
    # the wider second screen (16 candidates) certifies them without a full scan
    wide = est.egs(r, SCENE, table, num_candidates=1)
    assert bool(jnp.all(wide.screened))
    np.testing.assert_array_equal(np.asarray(wide.index), np.asarray(exact.index))


def test_coherence_bound_is_a_lower_bound_on_the_ls_cost():
    # LS(x) >= 2 (M - |sum_m e^{j(r_m - theta_m(x))}|) at every point: what makes the screen exact
    grid = est.make_grid(BOX_LOW, BOX_HIGH, LAM / 4)
    _, r = _snapshots_in_box(4, seed=9)
    pts = est.grid_points(grid, jnp.arange(grid.size))
    theta = jax.vmap(dj.TwoRayModel(SCENE).mean)(pts)
    for rb in r:
        ls = jnp.sum(dj.likelihood.compressed_residuals(rb[None, :], theta) ** 2, axis=-1)
        coh = jnp.abs(jnp.sum(jnp.exp(1j * (rb[None, :] - theta)), axis=-1))
        assert bool(jnp.all(ls >= 2 * (17 - coh) - 1e-9))
        assert float(jnp.min(ls - 2 * (17 - coh))) < 0.05  # and tight near the arg-min


@pytest.mark.parametrize("batch", [1, 16, 17, 40])  # both sides of SKINNY_BATCH (16)
def test_squared_coherence_is_the_sum_of_phasors_in_either_orientation(batch):
    from dmimo_jax.estimators import phasors

    assert phasors.SKINNY_BATCH == 16
    rng = np.random.default_rng(batch)
    theta = rng.uniform(-np.pi, np.pi, (300, 17))
    r = rng.uniform(-np.pi, np.pi, (batch, 17))
    got = phasors.squared_coherence(phasors.phasor_rows(theta), phasors.coherence_weights(r))
    want = np.abs(np.exp(1j * (r[:, None, :] - theta[None, :, :])).sum(-1)) ** 2  # (B, N)
    assert got.shape == (batch, 300) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=2e-4)


def test_search_grid_regions():
    g = est.search_grid(SCENE, LAM / 2)
    np.testing.assert_allclose(np.asarray(g.low), 0.0)
    ue = est.search_grid(SCENE, LAM / 2, region="ue")
    np.testing.assert_allclose(np.asarray(ue.low), np.asarray(SCENE.ue_low))
    with pytest.raises(ValueError, match="region"):
        est.search_grid(SCENE, LAM / 2, region="house")


def test_egs_accepts_a_spacing():
    xs, r = _snapshots_in_box(2, seed=12)
    res = est.egs(r, SCENE, LAM / 2, region="ue")
    assert res.x.shape == (2, 3)
    assert float(jnp.max(jnp.linalg.norm(res.x - xs, axis=1))) < LAM  # nearest lambda/2 cells


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_coarse_to_fine_matches_fine_egs_plus_refinement():
    xs, r = _snapshots_in_box(64, seed=15)
    fine = est.refine_batch(
        est.egs(r, SCENE, est.make_grid(BOX_LOW, BOX_HIGH, LAM / 8)).x, r, SCENE
    )
    coarse = est.phasor_table(SCENE, est.make_grid(BOX_LOW, BOX_HIGH, LAM / 4))
    h = est.coarse_to_fine(r, SCENE, coarse, num_starts=8)
    assert h.starts.shape == (64, 8)
    agree = np.linalg.norm(np.asarray(h.x - fine.x), axis=1) < 1e-3
    assert agree.mean() >= 0.98
    assert float(jnp.median(jnp.linalg.norm(h.x - xs, axis=1))) < 1e-4


_SHARDED = """
import jax, numpy as np
jax.config.update("jax_enable_x64", True)
import dmimo_jax as dj
from dmimo_jax import estimators as est
assert len(jax.devices()) == 4
s = dj.paper_scene()
lam = float(s.wavelength)
grid = est.make_grid([3.0, 3.0, 1.0], [4.2, 4.2, 2.2], lam / 8)
xs = dj.sample_positions(jax.random.key(0), 16, s) * 0 + np.array([3.5, 3.6, 1.7])
xs = xs + 0.3 * jax.random.uniform(jax.random.key(1), (16, 3))
r = dj.simulate_phases_batch(jax.random.key(2), s, xs, dj.random_cpos(jax.random.key(3), 16))
out = {}
for name, dev in (("sharded", None), ("single", jax.devices()[:1])):
    t = est.phasor_table(s, grid, chunk_size=1000, devices=dev)
    a = est.egs(r, s, grid, chunk_size=1000, devices=dev)
    b = est.egs(r, s, t)
    out[name] = (np.asarray(a.index), np.asarray(a.cost), np.asarray(b.index), np.asarray(b.cost))
    print(name, t.data.sharding)
for x, y in zip(out["sharded"], out["single"]):
    np.testing.assert_array_equal(x, y)
print("IDENTICAL")
"""


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_sharded_and_single_device_results_identical():
    out = run_on_host_devices(_SHARDED)
    assert "NamedSharding" in out and "IDENTICAL" in out


@pytest.mark.parametrize(
    "r, grid, kwargs, match",
    [
        (jnp.zeros(16), None, {}, r"r must have shape \(17,\)"),
        (jnp.zeros(17).at[0].set(jnp.nan), None, {}, "r must be finite"),
        (jnp.zeros(17), None, {"chunk_size": 0}, "chunk_size"),
        (jnp.zeros(17), None, {"num_candidates": 0}, "num_candidates"),
        (jnp.zeros(17), 0.0, {}, "spacing"),
        (jnp.zeros(17), -LAM, {}, "spacing"),
        (jnp.zeros(17), LAM, {"region": "garden"}, "region"),
    ],
)
def test_egs_bad_input(r, grid, kwargs, match):
    grid = est.make_grid(BOX_LOW, BOX_HIGH, LAM / 2) if grid is None else grid
    with pytest.raises(ValueError, match=match):
        est.egs(r, SCENE, grid, **kwargs)


def test_tables_that_do_not_fit_are_refused():
    with pytest.raises(ValueError, match="max_bytes"):
        est.phasor_table(SCENE, est.search_grid(SCENE, LAM / 8), max_bytes=2**28)
    with pytest.raises(ValueError, match="too large"):  # 2**31 points would overflow the index
        est.make_grid([0, 0, 0], [100, 100, 40], LAM / 16)
    with pytest.raises(ValueError, match="num_starts"):
        est.coarse_to_fine(
            jnp.zeros(17),
            SCENE,
            est.phasor_table(SCENE, est.make_grid(BOX_LOW, BOX_HIGH, LAM)),
            num_starts=0,
        )


def test_flop_counts_paper_formula_and_xla():
    from dmimo_jax.complexity import egs_flops_paper, egs_flops_xla

    # the paper's F = B M V / delta^3 with B = 57 at lambda/8 over V = 400 m^3
    assert egs_flops_paper(17, 400.0, LAM / 8) == pytest.approx(57 * 17 * 400 / (LAM / 8) ** 3)
    grid = est.make_grid(BOX_LOW, BOX_HIGH, LAM / 4)
    table = egs_flops_xla(SCENE, grid, batch=8)
    plain = egs_flops_xla(SCENE, grid, method="plain")
    assert table is not None and plain is not None
    # per point and AP: the table screen is a few FLOPs (one 2M x 2B matrix product),
    # the table-free search evaluates the two-ray model (~10^2 FLOPs)
    per = lambda f: f / (grid.size * 17)
    assert 4 <= per(table) < 20 and 50 < per(plain) < 500
    with pytest.raises(ValueError, match="method"):
        egs_flops_xla(SCENE, grid, method="magic")


@pytest.mark.parametrize("k", [1, 5, 40])
def test_running_top_k_over_chunks_is_a_stable_sort_of_every_point(k):
    """scan_top_k: the top k of every chunk's scores, best first, equal scores in index
    order (what a stable sort of all points gives), for k below and above the chunk size;
    the points past ``size`` (the last chunk's padding) never appear."""
    size, chunk, batch = 70, 16, 3
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 6, (batch, size)).astype(np.float32)  # many ties
    padded = np.pad(scores, ((0, 0), (0, 5 * chunk - size)), constant_values=99.0)

    def score_chunk(c, idx):
        return jnp.asarray(padded)[:, c * chunk + jnp.arange(chunk)]

    top, index = est.grid.scan_top_k(score_chunk, 0, 5, chunk, size, k, batch, jnp.float32)
    want = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(np.asarray(index), want)
    np.testing.assert_array_equal(np.asarray(top), np.take_along_axis(scores, want, axis=1))
