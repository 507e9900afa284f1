"""The learned coarse stage beyond the paper: cells, the candidate safeguard, the cheap fine stage."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dmimo_jax as dj
from dmimo_jax import estimators as est
from dmimo_jax import gp, pipeline
from dmimo_jax.learning import (
    CellClassifier,
    CellConfig,
    TrainConfig,
    load_model,
    save_model,
    synthesize,
    train,
)
from dmimo_jax.pipeline.online import check_screen_settings
from dmimo_jax.pipeline.stages import check_cell_table
from tests.helpers import xla_optimized

SCENE = dj.paper_scene()
MODEL = dj.TwoRayModel(SCENE)


def test_cell_grid_indexes_and_covers_the_region():
    cells = est.cell_grid(SCENE, 1.0)
    assert cells.shape == (9, 9, 3) and cells.num_cells == 243
    x = dj.sample_positions(jax.random.key(0), 500, SCENE)
    idx = cells.index(x)
    corner = cells.corner(idx)
    assert bool(jnp.all((x >= corner) & (x <= corner + 1.0)))
    np.testing.assert_allclose(cells.centre(idx), corner + 0.5)
    with pytest.raises(ValueError, match="cell_size"):
        est.cell_grid(SCENE, 0.0)


@pytest.fixture(scope="module")
def small_table():
    cells = est.cell_grid(SCENE, 1.0)
    return est.cell_table(MODEL, cells)


@pytest.mark.slow
def test_candidate_search_finds_the_true_basin_among_wrong_candidates(small_table):
    cells = small_table.cells
    xt = dj.sample_positions(jax.random.key(1), 6, SCENE)
    r = dj.simulate_phases_batch(jax.random.key(2), MODEL, xt, jnp.linspace(-3, 3, 6))
    true_cell = np.asarray(cells.index(xt))
    # the true cell hidden among seven wrong ones (no neighbours of it: a UE near a face
    # is legitimately found from the next cell), at a different position in each row
    rng = np.random.default_rng(0)
    centres = np.asarray(cells.centre(jnp.arange(cells.num_cells)))
    cand = []
    for i, c in enumerate(true_cell):
        far = np.flatnonzero(np.linalg.norm(centres - centres[c], axis=1) > 2.5)
        wrong = rng.choice(far, 7, replace=False)
        cand.append(np.insert(wrong, i % 8, c))
    out = est.candidate_search(r, MODEL, small_table, jnp.asarray(np.stack(cand)))
    err = np.linalg.norm(np.asarray(out.x) - np.asarray(xt), axis=1)
    assert err.max() < 5e-4  # in the basin: at the noise level, not a wavelength away
    # with only wrong cells the best point is far and its cost is large
    only_wrong = jnp.asarray(
        np.stack([np.asarray(c)[np.asarray(c) != t] for c, t in zip(cand, true_cell, strict=True)])
    )
    bad = est.candidate_search(r, MODEL, small_table, only_wrong)
    assert np.all(np.asarray(bad.cost) > 100 * np.asarray(out.cost))


def test_candidate_search_bad_input(small_table):
    r = jnp.zeros((2, 17))
    with pytest.raises(ValueError, match="cells must have shape"):
        est.candidate_search(r, MODEL, small_table, jnp.zeros((3, 4), int))
    with pytest.raises(ValueError, match="cells must index"):
        est.candidate_search(r, MODEL, small_table, jnp.full((2, 4), 999))
    with pytest.raises(ValueError, match=r"r must have shape"):
        est.candidate_search(jnp.zeros((2, 16)), MODEL, small_table, jnp.zeros((2, 4), int))
    with pytest.raises(ValueError, match="finite"):
        est.candidate_search(jnp.full((2, 17), jnp.nan), MODEL, small_table, jnp.zeros((2, 4), int))
    misaligned = est.CellTable(small_table.cells, small_table.table, small_table.per_edge + 1)
    with pytest.raises(ValueError, match="not aligned"):
        est.candidate_search(r, MODEL, misaligned, jnp.zeros((2, 4), int))
    with pytest.raises(ValueError, match="must be a CellTable"):
        est.candidate_search(r, MODEL, small_table.table, jnp.zeros((2, 4), int))


def test_a_cells_rows_are_the_model_at_its_points_of_the_shared_table():
    """A cell's rows, gathered from the aligned grid's phasor table, are the model's
    phasors at the cell's corner plus each offset: the cell widened by half a spacing on
    every face, its points one spacing apart (at most lambda/4), C order."""
    scene = _tiny_scene().replace(ue_high=jnp.array([5.4, 5.6, 1.9]))  # 2 x 3 x 2 cells
    cells = est.cell_grid(scene, 0.2)
    table = est.cell_table(MODEL, cells)
    lam = float(scene.wavelength)
    assert table.spacing <= lam / 4 and table.per_edge * table.spacing == pytest.approx(0.2)
    n = table.points_per_side
    offsets = np.asarray(table.offsets)
    assert offsets[0] == pytest.approx([-table.spacing / 2] * 3)  # half a spacing below
    assert offsets[-1] == pytest.approx([0.2 + table.spacing / 2] * 3)  # and above
    assert offsets[1, 2] - offsets[0, 2] == pytest.approx(table.spacing)  # z fastest
    assert offsets[n, 1] - offsets[0, 1] == pytest.approx(table.spacing)
    for c in (0, 5, 7, cells.num_cells - 1):
        x = np.asarray(cells.corner(c))[None, :] + offsets
        want = np.concatenate([np.cos(theta := np.asarray(jax.vmap(MODEL.mean)(x))),
                               np.sin(theta)], axis=1)  # fmt: skip
        np.testing.assert_allclose(np.asarray(table.rows(jnp.int32(c))), want, atol=2e-6)
    # neighbours along z share the two layers of their common face
    rows = np.asarray(table.rows(jnp.arange(2))).reshape(2, n, n, n, -1)
    np.testing.assert_array_equal(rows[0, :, :, -2:], rows[1, :, :, :2])


def test_cell_major_screen_picks_the_starts_of_the_snapshot_major_one():
    from dmimo_jax.estimators import candidates

    scene = _tiny_scene()
    model = dj.TwoRayModel(scene)
    table = est.cell_table(model, est.cell_grid(scene, 0.2))  # 8 cells of 125 points
    x = dj.sample_positions(jax.random.key(4), 300, scene)
    r = dj.simulate_phases_batch(jax.random.key(5), model, x, jnp.zeros(300))
    rng = np.random.default_rng(1)
    cells = np.stack([rng.permutation(8)[:3] for _ in range(300)])
    cells[:40, 0] = 7  # one cell named more often than the others
    groups = candidates.cell_groups(cells, 8)
    members = np.asarray(groups.members)
    assert members.shape[1] == 16 and np.all(np.asarray(groups.cell)[: len(members)] < 8)
    # every pair sits in an item of its cell, in a lane that names its snapshot
    item, lane = np.asarray(groups.item), np.asarray(groups.lane)
    np.testing.assert_array_equal(np.asarray(groups.cell)[item], cells)
    np.testing.assert_array_equal(members[item, lane], np.arange(300)[:, None].repeat(3, 1))
    assert (members < 300).sum() == cells.size  # each pair once, the other lanes empty
    by_snapshot = jax.jit(candidates.starts_by_snapshot, static_argnums=(3, 4))
    by_cell = jax.jit(candidates.starts_by_cell, static_argnums=(3,))
    for k in (4, 130):  # 130 > the 125 points of a cell
        # the same points; sub-grid shifts to float32 rounding. In each row's order of
        # score, except where two scores are equal to float32 rounding (the two screens'
        # products have other shapes: 16 snapshots against one) and swap: as sets.
        a = np.asarray(by_cell(r, table, jnp.asarray(cells), k, groups))
        b = np.asarray(by_snapshot(r, table, jnp.asarray(cells), k, 8))
        in_order = np.all(np.abs(a - b) <= 1e-5, axis=(1, 2))
        assert in_order.mean() > 0.98
        np.testing.assert_allclose(  # 1e-4 of a spacing: one point in 1e5 moves 1.5 um
            _sorted_points(a), _sorted_points(b), rtol=0, atol=1e-5
        )
    # a single snapshot, or one candidate each for a few: gathering is cheaper
    assert candidates.cell_groups(cells[:1], 8) is None
    assert candidates.cell_groups(cells[:2, :1], 8) is None


def _sorted_points(x):
    """Each row's points (B, k, 3) in lexicographic order (of their rounded coordinates)."""
    key = np.round(x, 4)
    order = np.stack([np.lexsort(row.T[::-1]) for row in key])
    return np.take_along_axis(x, order[..., None], axis=1)


def test_subgrid_shift_finds_the_peak_of_a_parabola():
    from dmimo_jax.estimators import candidates

    scene = _tiny_scene()
    table = est.cell_table(dj.TwoRayModel(scene), est.cell_grid(scene, 0.2))
    spacing = float(table.offsets[1, 2] - table.offsets[0, 2])
    peaks = np.array(
        [
            [0.10, 0.13, 0.04],  # inside the cell's grid, off its points
            [0.07, 0.11, 0.45],  # beyond the grid's top face in z
        ]
    )
    amplitude = 10.0 - np.sum((np.asarray(table.offsets)[None] - peaks[:, None]) ** 2, -1)
    score = jnp.asarray(amplitude**2, jnp.float32)  # squared coherences (2, P)
    point = jnp.argmax(score, axis=-1)[:, None]
    x = np.asarray(table.offsets)[np.asarray(point[:, 0])] + np.asarray(
        candidates.subgrid_shift(table, score, point)[:, 0]
    )
    np.testing.assert_allclose(x[0], peaks[0], atol=1e-5)  # a parabola's peak, exactly
    np.testing.assert_allclose(x[1, :2], peaks[1, :2], atol=1e-5)
    top = float(table.offsets[-1, 2])
    assert x[1, 2] == pytest.approx(top)  # on the face: no shift along z (no point above)
    assert spacing / 2 < peaks[1, 2] - top  # the peak is beyond what a shift may reach


def _tiny_scene():
    """A 0.4 m cube of UE positions: 8 cells of 0.2 m."""
    return SCENE.replace(ue_low=jnp.array([5.0, 5.0, 1.5]), ue_high=jnp.array([5.4, 5.4, 1.9]))


@pytest.fixture(scope="module")
def tiny_classifier():
    scene = _tiny_scene()
    model = dj.TwoRayModel(scene)
    cells = est.cell_grid(scene, 0.2)
    net = CellClassifier(17, CellConfig(hidden=(128, 128), top_k=2), cells=cells, rngs=nnx.Rngs(0))
    data = synthesize(jax.random.key(3), model, 12_000)
    train(
        net,
        data,
        TrainConfig(epochs=12, batch_size=200, peak_lr=3e-3, val_fraction=0.1),
        progress=False,
    )
    return scene, model, cells, net


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_a_tiny_candidate_model_learns_a_tiny_region(tiny_classifier):
    scene, model, cells, net = tiny_classifier
    test = synthesize(jax.random.key(4), model, 1000)
    idx, probs = pipeline.cell_probabilities(net, test.r, 2)
    hit = np.any(np.asarray(idx) == np.asarray(cells.index(test.x))[:, None], axis=1)
    assert hit.mean() > 0.9  # top-2 of 8 cells; chance is 0.25
    p = np.asarray(probs)
    assert float(np.mean(p.sum(axis=1))) > 0.5
    assert np.all(p[:, 0] >= p[:, 1])  # most likely first


@pytest.mark.newest  # an orbax checkpoint written and read (CI's newest leg)
def test_model_file_round_trip_of_the_cell_classifier(tiny_classifier, tmp_path):
    _, model, _, net = tiny_classifier
    save_model(tmp_path / "m", net)
    back, _ = load_model(tmp_path / "m")
    r = synthesize(jax.random.key(5), model, 4).r
    np.testing.assert_allclose(np.asarray(back(r)), np.asarray(net(r)), rtol=1e-6)
    assert back.cells.shape == net.cells.shape


def _screen(r, net, model, table, fallback=None, num_cells=2, **kw):
    """The classifier's candidates through the two-tier screen (every row fitted), then the
    fine stage: the Locator's cell path composed from its public functions."""
    cells, probs = pipeline.cell_probabilities(net, r, num_cells)
    settings = dict(first_cells=None, first_mass=0.999, min_mass=0.5, num_starts=4,
                    screen_steps=2) | kw  # fmt: skip
    settings = check_screen_settings(model, table, num_cells, **settings)
    screen = jax.jit(pipeline.cell_screen, static_argnums=(6, 7))
    found, _ = screen(r, cells, probs, model, table, fallback, settings, r.shape[0])
    return cells, found, dj.refine_batch(found.x, r, model, num_steps=3)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_the_screen_falls_back_when_the_classifier_is_unsure(tiny_classifier):
    scene, model, cells, net = tiny_classifier
    table = est.cell_table(model, cells, spacing=0.05)
    fallback = est.phasor_table(model, est.search_grid(scene, 0.05, region="ue"))
    test = synthesize(jax.random.key(6), model, 16)
    _, sure, fine = _screen(test.r, net, model, table, fallback, min_mass=0.0)
    assert not bool(jnp.any(sure.fallback))
    err = np.linalg.norm(np.asarray(fine.x) - np.asarray(test.x), axis=1)
    assert err.max() < 1e-3
    # nothing is ever that sure: every snapshot falls back
    _, unsure, fine = _screen(test.r, net, model, table, fallback, min_mass=1.01)
    assert bool(jnp.all(unsure.fallback))
    err = np.linalg.norm(np.asarray(fine.x) - np.asarray(test.x), axis=1)
    assert err.max() < 1e-3  # the whole-region screen found them


def test_confident_snapshots_screen_only_their_first_cells(tiny_classifier):
    """The two tiers: first_mass 0 screens one cell for every snapshot, a threshold above 1
    screens all num_cells; the confident tier still finds the UEs its top cell holds."""
    scene, model, cells, net = tiny_classifier
    table = est.cell_table(model, cells, spacing=0.05)
    test = synthesize(jax.random.key(9), model, 16)
    kw = dict(num_cells=4, first_cells=1, min_mass=0.0)
    top, narrow, fine_n = _screen(test.r, net, model, table, first_mass=0.0, **kw)
    _, wide, fine_w = _screen(test.r, net, model, table, first_mass=1.01, **kw)
    assert bool(jnp.all(narrow.narrow)) and not bool(jnp.any(wide.narrow))
    top1 = np.asarray(top[:, 0]) == np.asarray(cells.index(test.x))
    err_n = np.linalg.norm(np.asarray(fine_n.x) - np.asarray(test.x), axis=1)
    err_w = np.linalg.norm(np.asarray(fine_w.x) - np.asarray(test.x), axis=1)
    assert top1.sum() >= 8 and err_n[top1].max() < 1e-3
    assert err_w.max() < 1e-3


def test_bucket_sizes_are_a_few_per_octave():
    sizes = {pipeline.bucket_size(n) for n in range(1, 1281)}
    assert len(sizes) <= 40  # a handful per octave, not one per batch size
    assert all(n <= pipeline.bucket_size(n) < 1.25 * n + 1 for n in range(1, 1281))


def test_a_classifier_of_another_scene_and_bad_screen_settings_are_refused(
    tiny_classifier, small_table
):
    _, _, _, net = tiny_classifier
    with pytest.raises(ValueError, match="does not belong"):
        check_cell_table(net, small_table)
    scene, model, cells, net = tiny_classifier
    table = est.cell_table(model, cells, spacing=0.1)
    base = dict(first_cells=None, first_mass=0.999, min_mass=0.5, num_starts=4, screen_steps=2)
    for kw, match in (
        (dict(first_cells=5), "first_cells"),
        (dict(first_mass=-0.1), "first_mass"),
        (dict(min_mass=float("nan")), "min_mass"),
        (dict(screen_steps=-1), "screen_steps"),
    ):
        with pytest.raises(ValueError, match=match):
            check_screen_settings(model, table, 4, **(base | kw))


@pytest.fixture(scope="module")
def small_gp():
    """The exact GP model of 20 two-ray snapshots and its tables (one fit for the tests)."""
    truth = dj.TwoRayModel(SCENE)
    k1, k2, k3 = jax.random.split(jax.random.key(7), 3)
    x = dj.sample_positions(k1, 20, SCENE)
    r = dj.simulate_phases_batch(k2, truth, x, dj.random_cpos(k3, 20))
    nv = jax.vmap(truth.variance)(x)
    exact = pipeline.fit_phase_model(x, r, nv, SCENE, num_steps=10)
    with xla_optimized():  # tabulating: run time, not compilation
        return exact, gp.TabulatedGPModel.from_model(exact)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_cheap_fine_stage_matches_exact_gp_refinement(small_gp):
    """Refinement under the tabulated GP of eq. (27) (cubic mean, tabulated variance) ==
    refinement under the exact GP (noise-free snapshots of the GP model itself), to below
    1 um; so does the tabulated pre-refinement + 2 exact steps."""
    exact, cheap = small_gp
    assert cheap.has_variance and not cheap.without_variance().has_variance
    xt = dj.sample_positions(jax.random.key(8), 8, SCENE)
    rt = dj.wrap(jax.vmap(exact.mean)(xt) + 0.7)  # noise-free
    start = xt + 0.02  # inside the basin
    ref = dj.refine_batch(start, rt, exact, num_steps=15).x
    tables_only = dj.refine_batch(start, rt, cheap, num_steps=10).x
    assert np.abs(np.asarray(tables_only) - np.asarray(ref)).max() < 1e-6
    fast = dj.refine_batch(tables_only, rt, exact, num_steps=2).x
    assert np.abs(np.asarray(fast) - np.asarray(ref)).max() < 1e-6
    assert np.abs(np.asarray(ref) - np.asarray(xt)).max() < 1e-6
    # one step with the exact mean and the LoS variance (no eq. 27 solves) lands there too
    mean_only = dj.refine_batch(tables_only, rt, gp.GPMeanModel(exact), num_steps=1).x
    assert np.abs(np.asarray(mean_only) - np.asarray(ref)).max() < 1e-6


def test_tabulated_gp_model_matches_eqs_26_27(small_gp):
    """The cubic mean table within 1e-5 rad of eq. (26), the variance table within a few
    per cent of eq. (27), over random UEs; without the variance table: the LoS part."""
    exact, cheap = small_gp
    xs = dj.sample_positions(jax.random.key(14), 200, SCENE)
    dm = jax.vmap(cheap.mean)(xs) - jax.vmap(exact.mean)(xs)
    assert float(jnp.max(jnp.abs(dm))) < 1e-5
    ve = jax.vmap(exact.variance)(xs)
    rel = np.abs(np.asarray(jax.vmap(cheap.variance)(xs) / ve - 1))
    assert np.median(rel) < 0.01 and np.percentile(rel, 99) < 0.1
    los = jax.vmap(cheap.without_variance().variance)(xs)
    np.testing.assert_allclose(los, jax.vmap(gp.GPMeanModel(exact).variance)(xs), rtol=1e-12)
    assert bool(jnp.all(ve > los))  # eq. (27) adds the GP's own uncertainty
    with pytest.raises(ValueError, match="var_dd_step"):
        gp.TabulatedGPModel.from_model(exact, var_dd_step=0.0)
    with pytest.raises(ValueError, match="var_num_gamma"):
        gp.TabulatedGPModel.from_model(exact, var_num_gamma=1)


def test_a_cell_table_too_large_is_refused_before_it_is_allocated():
    """The size guard runs before any phasor is computed: an 80 m hall's cell table (1,088
    APs, hundreds of GB) is refused by the default limit, naming the setting, and a limit
    of 1 MiB refuses the paper room's."""
    from dmimo_jax.datasets import hall_scene

    hall = hall_scene(80)
    with pytest.raises(ValueError, match=r"needs \d+\.\d+ GiB > max_bytes = 8\.00 GiB"):
        est.cell_table(hall, est.cell_grid(hall, 1.0))
    scene = dj.paper_scene()
    with pytest.raises(ValueError, match="max_bytes"):
        est.cell_table(scene, est.cell_grid(scene, 1.0), max_bytes=2**20)
