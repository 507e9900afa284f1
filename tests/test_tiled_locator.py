"""dmimo_jax.pipeline.tiled: the online stage over tiles (a tile classifier, then the tile's
Locator on its K APs; one program for every tile; the cost gate decides the tile)."""

import dataclasses
from types import SimpleNamespace
from typing import NamedTuple

import jax
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import tiles
from dmimo_jax.datasets import hall_scene
from dmimo_jax.learning import CellConfig, TrainConfig
from dmimo_jax.learning.presets import CellsPreset
from dmimo_jax.pipeline import tiled
from dmimo_jax.pipeline.rescues import Status
from dmimo_jax.pipeline.tiled_screen import tile_results
from tests.helpers import LOCATOR_LIGHT, shared_folder
from tests.test_offline_online import CELLS, TINY

# a 4 m x 2 m x 0.2 m strip of a 20 m hall (68 APs): two tiles of 2 m, each with its 24
# nearest APs; tiny networks (what is tested is the wiring and the gate, not accuracy)
SCENE = hall_scene(20).replace(
    ue_low=np.array([6.0, 8.0, 1.5]), ue_high=np.array([10.0, 10.0, 1.7])
)
TILE_NET = CellsPreset(
    CellConfig(hidden=(64, 64), top_k=1),
    TrainConfig(epochs=3, batch_size=200, peak_lr=3e-3, val_fraction=0.1),
    6000,
)


def test_the_tile_grid_names_each_tile():
    scene = hall_scene(20).replace(
        ue_low=np.array([1.0, 2.0, 0.5]), ue_high=np.array([7.0, 6.0, 2.0])
    )
    tiling = tiles.tile_aps(scene, 2.0, rule="nearest", num_aps=8)  # 3 x 2 tiles
    grid, tile_of = tiled.tile_grid(tiling)
    assert grid.shape == (3, 2, 1) and grid.cell_size == pytest.approx(2.0)
    centres = (tiling.low + tiling.high) / 2
    np.testing.assert_array_equal(tile_of[np.asarray(grid.index(centres))], np.arange(6))
    corners = tiling.low + 0.01  # just inside each tile's lower corner, at the floor of it
    np.testing.assert_array_equal(tile_of[np.asarray(grid.index(corners))], np.arange(6))
    oblong = scene.replace(ue_high=np.array([7.0, 5.0, 2.0]))  # 6 x 3 m: tiles 2 x 1.5 m
    with pytest.raises(ValueError, match="square tiles"):
        tiled.tile_grid(tiles.tile_aps(oblong, 2.0, rule="nearest", num_aps=8))
    for bad in (None, scene):
        with pytest.raises(ValueError, match="tiling must be tile_aps' Tiling"):
            tiled.tile_grid(bad)


@pytest.mark.slow  # four tiny classifiers trained (~10 s of CPU)
def test_tiles_classifiers_trained_together_are_those_trained_one_by_one(tmp_path):
    """Two tiles' cell classifiers (grids of one shape, 2 m apart) trained as one vmapped
    program: each in its own folder with its own corner, and each the network that
    train_cell_classifier trains alone (logits to float32 rounding); a later call loads
    them; grids of two shapes are refused."""
    from dmimo_jax.estimators import cell_grid

    scenes = [SCENE.replace(ue_low=np.array([6.0 + 2 * t, 8.0, 1.5]),
                            ue_high=np.array([8.0 + 2 * t, 10.0, 1.7])) for t in (0, 1)]  # fmt: skip
    models = [dj.TwoRayModel(s) for s in scenes]
    grids = [cell_grid(s, CELLS.cell_size) for s in scenes]
    both = dj.pipeline.train_cell_classifiers([tmp_path / "a", tmp_path / "b"], models, grids, CELLS,
                                        progress=False)  # fmt: skip
    r = np.asarray(dj.measure.labeled_snapshots(jax.random.key(3), models[1], 64).r)
    for t in (0, 1):
        net, meta = both[t]
        np.testing.assert_allclose(net.cell_low, np.asarray(grids[t].low), rtol=1e-12)
        alone, meta_alone = dj.pipeline.train_cell_classifier(
            tmp_path / f"alone{t}", models[t], grids[t], CELLS, progress=False
        )
        np.testing.assert_allclose(net(r), alone(r), rtol=1e-4, atol=1e-4)
        assert meta["val_top_k_miss"] == pytest.approx(meta_alone["val_top_k_miss"], abs=0.01)
        x = (np.asarray(grids[t].low) + 0.05)[None]  # a point in each tile's first cell
        assert int(net.labels(x)[0]) == 0
    again = dj.pipeline.train_cell_classifiers([tmp_path / "a", tmp_path / "b"], models, grids, CELLS,
                                         progress=False)  # fmt: skip
    for (net, _), (net2, _) in zip(both, again, strict=True):
        np.testing.assert_array_equal(net(r), net2(r))  # loaded, not retrained
    wide = cell_grid(scenes[1].replace(ue_high=np.array([10.4, 10.0, 1.7])), CELLS.cell_size)
    with pytest.raises(ValueError, match="one shape"):
        dj.pipeline.train_cell_classifiers([tmp_path / "c", tmp_path / "d"], models, [grids[0], wide],
                                     CELLS, progress=False)  # fmt: skip


def strip_models(num_aps, params=None):
    """The strip's two 2 m tiles with their ``num_aps`` nearest APs, 60 labels and the
    tiles' GP models (coarse tables; hyperparameters ``params`` or fitted):
    ``(tiling, labels, models)``."""
    tiling = tiles.tile_aps(SCENE, 2.0, rule="nearest", num_aps=num_aps)
    lab = dj.measure.labeled_snapshots(jax.random.key(5), dj.TwoRayModel(SCENE), 60)
    lam = float(SCENE.wavelength)
    coarse = dict(dd_step=lam / 64, num_gamma=32, var_dd_step=lam / 16, var_num_gamma=16)
    models = tiles.fit_tiles(
        lab.x, lab.r, lab.variance, SCENE, tiling, num_labels=30, tabulate=coarse, params=params
    )
    return tiling, lab, models


@pytest.fixture(scope="module")
def strip():
    """:func:`strip_models` of the tiles' 24 APs."""
    return strip_models(24)


@pytest.fixture(scope="module")
def building(strip, tmp_path_factory):
    tiling, lab, models = strip
    # one build a run: the worker that comes second loads the first one's (31-44 s each)
    with shared_folder(tmp_path_factory, "tiled-building") as cache:
        off = tiled.run_offline_tiled(
            lab.x, lab.r, lab.variance, SCENE, tiling, models, preset=TINY, cells=CELLS,
            classifier=TILE_NET, cache_dir=cache, together=2, progress=False,
        )  # fmt: skip
    loc = tiled.TiledLocator.from_offline(off, **LOCATOR_LIGHT)
    return off, loc


@pytest.mark.slow  # two tiles' offline stages and the Locator's program (~40 s)
def test_tiles_share_one_program_and_locate_at_their_bound(building, monkeypatch):
    """Every tile's Locator is one tree of one shape: calling the second tile after the
    first compiles nothing (nor does its rescue-free copy after the first's). The tiled answers are the answering tile's own Locator's on its
    K APs, in the tile that holds the truth, within a few PEB of all the APs. The rows of two
    tiles share one screen; rows that all fall in one tile run that tile's own Locator (one
    call: ``SHARED_SCREEN_TILES``), with the same answers."""
    off, loc = building
    screens = []
    shared = tiled.tile_results
    monkeypatch.setattr(tiled, "tile_results", lambda *a: screens.append(1) or shared(*a))
    assert len(loc.locators) == 2 and loc.aps.shape == (2, 24)
    # the two tiles' classifiers were trained together, and each tile's run_offline loaded its own
    for tile in off.tiles:
        (cells,) = tile.cache.glob("cells-*")
        assert (cells / "model" / "spec.json").is_file() and not (cells / "ckpt").exists()
    assert len(list(off.tiles[0].cache.glob("cells-*/ckpt-together-*"))) == 1
    truth = dj.TwoRayModel(SCENE)
    test = dj.measure.labeled_snapshots(jax.random.key(7), truth, 32)
    r, x = np.asarray(test.r), np.asarray(test.x)
    loc.locators[0](r[:16][:, loc.aps[0]])
    before = dj.Locator.compiled_programs()
    loc.locators[1](r[:16][:, loc.aps[1]])
    assert dj.Locator.compiled_programs() == before  # the second tile: no new program
    loc.quick[0](r[:16][:, loc.aps[0]])
    before = dj.Locator.compiled_programs()
    loc.quick[1](r[:16][:, loc.aps[1]])
    assert dj.Locator.compiled_programs() == before
    out = loc(r)
    assert out.x.shape == (32, 3) and out.excluded.shape == (32, SCENE.num_aps)
    assert not np.any(out.rejected)
    inside = np.all((x >= off.tiling.low[out.tile]) & (x <= off.tiling.high[out.tile]), axis=1)
    assert inside.all()  # the answering tile holds the true position
    err = np.linalg.norm(np.asarray(out.x) - x, axis=1)
    peb = np.asarray(dj.peb_map(x, truth))
    assert np.all(err < 10 * peb), np.max(err / peb)
    for t in (0, 1):  # each row's answer is its tile's Locator's on the tile's APs
        rows = np.flatnonzero(out.tile == t)
        own = loc.locators[t](r[np.ix_(rows, loc.aps[t])])
        np.testing.assert_allclose(np.asarray(out.x)[rows], np.asarray(own.x), atol=1e-9)
    assert screens and tiled.SHARED_SCREEN_TILES == 2  # the two tiles' first pass
    calls = len(screens)
    first = np.resize(np.flatnonzero((out.tile == 0) & (out.rank == 0)), 16)  # 16: compiled
    alone = loc(r[first])
    assert len(screens) == calls  # one tile: no shared screen
    np.testing.assert_array_equal(alone.tile, 0)
    np.testing.assert_allclose(np.asarray(alone.x), np.asarray(out.x)[first], atol=1e-9)
    np.testing.assert_array_equal(np.asarray(alone.status), np.asarray(out.status)[first])


@pytest.mark.slow  # shares the program of the test above
def test_a_wrong_tile_is_rejected_by_its_gate_and_the_next_one_answers(building):
    """A tile classifier that names the wrong tile first (its map swapped): that tile's cost
    gate rejects every row it cannot reach, by the gate alone and then with its rescues (its
    search holds no position that explains the phases), and the next tile answers, as the
    right map would; with one try (by the gate alone too) those rows stay rejected.
    Screening the rows of both tiles as one (the default, ``shared_screen``) or tile by tile
    changes no answer. A UE within a quarter wavelength of the wrong tile (its table's points
    reach past its faces, the refinement further) may be answered there: rightly, at its
    bound."""
    off, loc = building
    test = dj.measure.labeled_snapshots(jax.random.key(8), dj.TwoRayModel(SCENE), 16)
    r, x = np.asarray(test.r), np.asarray(test.x)
    right = loc(r)
    np.testing.assert_array_equal(right.rank, 0)
    swapped = dataclasses.replace(loc, tile_of=loc.tile_of[::-1].copy())
    wrong = swapped.ranked_tiles(r)[:, 0]
    assert np.all(wrong != right.tile)
    low, high = off.tiling.low[wrong, :2], off.tiling.high[wrong, :2]
    reach = np.linalg.norm(np.maximum(low - x[:, :2], 0) + np.maximum(x[:, :2] - high, 0), axis=1)
    far = reach > float(SCENE.wavelength) / 4
    assert far.sum() >= 12  # most rows: the wrong tile cannot explain them
    second = swapped(r)
    np.testing.assert_array_equal(second.rank[far], 1)
    np.testing.assert_array_equal(second.tile[far], right.tile[far])
    np.testing.assert_allclose(np.asarray(second.x)[far], np.asarray(right.x)[far], atol=1e-9)
    near_answer = ~far & (second.rank == 0)
    err = np.linalg.norm(np.asarray(second.x) - x, axis=1)
    assert np.all(err[near_answer] < 1e-4)  # a few PEB: the right position, from next door
    # the first pass tile by tile (shared_screen=False) against the shared screen: the same
    apart = tiled.TiledLocator.from_offline(off, shared_screen=False, **LOCATOR_LIGHT)
    assert loc.screen is not None and apart.screen is None
    for tiles_of in (loc.tile_of, swapped.tile_of):
        one = dataclasses.replace(loc, tile_of=tiles_of)(r)
        plain = dataclasses.replace(apart, tile_of=tiles_of)(r)
        for field in ("tile", "rank", "status", "excluded"):
            np.testing.assert_array_equal(np.asarray(getattr(one, field)),
                                          np.asarray(getattr(plain, field)))  # fmt: skip
        np.testing.assert_allclose(np.asarray(one.x), np.asarray(plain.x), atol=1e-9)
    # the first pass alone (here every row fails it: the tiny networks' answers are the
    # rescues'): each tile's results on its rows, screened with the other tile's, are its
    # own Locator's, every field
    ranked = loc.ranked_tiles(r)[:, 0]
    own = np.take_along_axis(r, loc.aps[ranked], axis=1)
    for t, rows, out in tile_results(loc.quick, loc.screen, own, ranked):
        alone = loc.quick[t](own[rows])
        assert rows.size and np.all(ranked[rows] == t)
        for field, a in zip(out._fields, out, strict=True):
            np.testing.assert_allclose(a, np.asarray(getattr(alone, field)), atol=1e-9)
    once = dataclasses.replace(swapped, tries=1, gate_tries=1)(r)
    np.testing.assert_array_equal(np.asarray(once.status)[far], int(Status.REJECTED))
    assert np.all(once.tile != right.tile)
    with pytest.raises(ValueError, match="r must"):
        loc(r[:, :10])
    # the tile ranking checks its snapshots (NaN rows were ranked, (B, M/2) rows read as
    # (B/2, M)), and one (M,) snapshot answers without the batch axis, as the Locator's
    for bad, match in ((np.full((2, r.shape[1]), np.nan), "finite"),
                       (r[:2].reshape(4, -1), "shape")):  # fmt: skip
        with pytest.raises(ValueError, match=f"r must .*{match}"):
            loc.ranked_tiles(bad)
    single = loc(r[3])
    assert single.x.shape == (3,) and single.excluded.shape == (r.shape[1],)
    assert int(single.tile) == right.tile[3] and int(single.status) == right.status[3]
    np.testing.assert_allclose(single.x, np.asarray(right.x)[3], atol=1e-9)


@pytest.fixture(scope="module")
def ring(strip):
    """Each tile's ring of its 48 nearest APs (its 24 first) and their GP models at the
    tiles' hyperparameters (``fit_tiles(params=...)``: no second fit)."""
    wide, _, models = strip_models(48, params=strip[2].params)
    return wide, models


@pytest.mark.slow  # shares the program of the tests above; the rings conditioned (~10 s)
def test_the_ring_refines_on_more_aps_and_leaves_a_faulty_one_out(building, ring):
    """With each tile's ring of 48 APs (its K = 24 first), the accepted answers are refined
    on the ring's GP models: the same tiles and statuses, a lower error than on the K APs
    alone (the ring's GP at the tiles' hyperparameters: over three draws of 48 snapshots the RMSE fell by 8-16%, 9% on this test's 96; asserted: 5%). A ring AP beyond K with a phase 1.5 rad off (never seen by the tile's gate) makes
    the ring's cost fail the gate: those answers are the tiles' own, to the digit; so are
    they where the agreement test refuses every move (``ring_risk`` near 1). A ring of
    other tiles or without the tile's APs first is refused by name. A known tile's rows
    refined by ``refine_on_ring`` alone get the same answers."""
    off, loc = building
    wide, models = ring
    with_ring = tiled.TiledLocator.from_offline(off, ring=ring, **LOCATOR_LIGHT)
    assert with_ring.ring_aps.shape == (2, 48) and with_ring.ring_steps == 10
    truth = dj.TwoRayModel(SCENE)
    test = dj.measure.labeled_snapshots(jax.random.key(9), truth, 96)
    r, x = np.asarray(test.r), np.asarray(test.x)
    plain, fine = loc(r), with_ring(r)
    np.testing.assert_array_equal(fine.tile, plain.tile)
    np.testing.assert_array_equal(fine.status, plain.status)
    err = lambda out: np.linalg.norm(np.asarray(out.x) - x, axis=1)  # noqa: E731
    peb = np.asarray(dj.peb_map(x, truth))
    assert np.sqrt(np.mean(err(fine) ** 2)) < 0.95 * np.sqrt(np.mean(err(plain) ** 2))
    assert np.all(err(fine) < 10 * peb)
    # an AP in both tiles' rings and in neither tile's K APs, 1.5 rad off
    outer = np.setdiff1d(np.intersect1d(wide.aps[0], wide.aps[1]), loc.aps.reshape(-1))
    assert outer.size > 0
    bad = r.copy()
    bad[:, outer[0]] += 1.5
    np.testing.assert_allclose(np.asarray(with_ring(bad).x), np.asarray(plain.x), atol=1e-12)
    # the agreement test: at a risk near 1 its quantile is near 0 and it refuses every move
    strict = tiled.TiledLocator.from_offline(off, ring=ring, ring_risk=1 - 1e-9, **LOCATOR_LIGHT)
    np.testing.assert_allclose(np.asarray(strict(r).x), np.asarray(plain.x), atol=1e-12)
    # the fine stage alone, for rows whose tile is known: the ring's answers of one tile
    t = int(np.bincount(plain.tile).argmax())
    keep = ~np.asarray(plain.rejected) & ~np.asarray(plain.excluded).any(axis=1)
    rows = np.flatnonzero((plain.tile == t) & keep)
    mine, kept = tiled.refine_on_ring(
        np.asarray(plain.x)[rows], r[np.ix_(rows, wide.aps[t])], models.tile(t), loc.aps.shape[1],
        cost_gate=loc.locators[t].settings.cost_gate,
    )  # fmt: skip
    np.testing.assert_allclose(mine, np.asarray(fine.x)[rows], atol=1e-12)
    assert kept.mean() > 0.5 and np.all(mine[~kept] == np.asarray(plain.x)[rows][~kept])
    for name, call in [
        ("x", lambda: tiled.refine_on_ring(np.ones((2, 4)), r[:2, :48], models.tile(t), 24)),
        ("r", lambda: tiled.refine_on_ring(plain.x[:2], r[:2, :24], models.tile(t), 24)),
        ("num_aps", lambda: tiled.refine_on_ring(plain.x[:2], r[:2, :48], models.tile(t), 60)),
        ("risk", lambda: tiled.refine_on_ring(plain.x[:2], r[:2, :48], models.tile(t), 24, risk=1.0)),
        ("cost_gate", lambda: tiled.refine_on_ring(plain.x[:2], r[:2, :48], models.tile(t), 24, cost_gate=-1.0)),
        ("model", lambda: tiled.refine_on_ring(plain.x[:2], r[:2, :48], "gp", 24)),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=name):
            call()
    other = tiles.tile_aps(SCENE, 1.0, rule="nearest", num_aps=40)
    few = tiles.tile_aps(SCENE, 2.0, rule="nearest", num_aps=30)
    bad_rings = ((other, models), (few.take([1, 0]), models), (few, models), (wide,), (wide, "x"))
    for bad_ring in bad_rings:
        with pytest.raises(ValueError, match="ring"):
            tiled.TiledLocator.from_offline(off, ring=bad_ring, **LOCATOR_LIGHT)
    with pytest.raises(ValueError, match="ring_steps"):
        tiled.TiledLocator.from_offline(off, ring=ring, ring_steps=0, **LOCATOR_LIGHT)
    with pytest.raises(ValueError, match="ring_risk"):
        tiled.TiledLocator.from_offline(off, ring=ring, ring_risk=0.0, **LOCATOR_LIGHT)


def test_snug_parts_cover_every_row_with_little_padding():
    """Every count of rows splits into parts that sum to it, each one of the bucket sizes
    or padded to one by at most ``waste`` of it (what a tile's few rows run); bad counts
    and wastes are refused by name."""
    from dmimo_jax.pipeline import BUCKETS, bucket_for, snug_parts

    for n in range(0, 5000):
        parts = snug_parts(n)
        assert sum(parts) == n
        for p in parts:
            assert p in BUCKETS or bucket_for(p) - p <= 0.25 * bucket_for(p)
    assert snug_parts(5) == [4, 1] and snug_parts(4097) == [4096, 1]
    with pytest.raises(ValueError, match="n must"):
        snug_parts(-1)
    with pytest.raises(ValueError, match="waste"):
        snug_parts(3, waste=1.0)


class _Answer(NamedTuple):
    x: np.ndarray
    cost: np.ndarray
    status: np.ndarray
    excluded: np.ndarray

    @property
    def rejected(self):
        return self.status == Status.REJECTED


@dataclasses.dataclass
class _Tile:
    """A stand-in for tile ``t``'s Locator: a row's phases all hold its true tile (x 0.1);
    it passes the gate in its true tile (with the rescues, also where ``rescued`` names the
    row's tile: a fault its exclusion recovers). Every call is logged ``(t, rescues, tiles)``."""

    t: int
    rescues: bool
    log: list
    rescued: tuple = ()

    def __call__(self, r):
        own = np.rint(r[:, 0] / 0.1).astype(int)
        self.log.append((self.t, self.rescues, own.tolist()))
        ok = (own == self.t) & ~np.isin(own, self.rescued) | (self.rescues & (own == self.t))
        status = np.where(ok, int(Status.EXCLUDED if self.rescues else Status.LOCATED),
                          int(Status.REJECTED))  # fmt: skip
        x = np.stack([own, np.full(own.size, self.t), np.zeros(own.size)], 1).astype(float)
        return _Answer(x, np.zeros(own.size), status, np.zeros(r.shape, bool))


def test_a_row_tries_its_tiles_by_the_gate_then_the_first_rescue_then_further_tiles():
    """The order of a pending row's tries (stand-in tiles, a fixed ranking): its first
    ``tries`` tiles by the gate alone, its first tile with the rescues, its further tiles up
    to ``gate_tries`` by the gate alone, then the rescues of its other ``tries`` tiles. A row
    whose tile is ranked beyond ``tries`` is located there by the gate alone (no rescue
    run); one whose first tile's rescues recover it never tries a further tile; one whose
    tile is ranked beyond ``gate_tries`` is rejected with its first tile's rescued answer."""

    log = []

    class Ranked(tiled.TiledLocator):
        def ranked_tiles(self, r):  # every row: tiles 4, 3, 2, 1, 0 (the last most likely)
            return np.tile(np.arange(5)[::-1], (np.shape(r)[0], 1))[:, : self.first_tries]

    quick = tuple(_Tile(t, False, log, rescued=(4,)) for t in range(5))
    full = tuple(_Tile(t, True, log) for t in range(5))
    loc = Ranked(classifier=SimpleNamespace(num_aps=6), locators=full, quick=quick,
                 aps=np.tile(np.arange(3), (5, 1)), tile_of=np.arange(5), tries=2,
                 gate_tries=4)  # fmt: skip
    assert loc.first_tries == 4 and dataclasses.replace(loc, gate_tries=1).first_tries == 2
    # rows whose tile is 4 (a fault: its rescues recover it), 3, 1 (ranked 4th) and 0 (5th)
    r = np.repeat(np.array([4, 3, 1, 0])[:, None] * 0.1, 6, axis=1)
    out = loc(r)
    np.testing.assert_array_equal(out.tile, [4, 3, 1, 4])
    np.testing.assert_array_equal(out.rank, [0, 1, 3, 0])
    np.testing.assert_array_equal(
        out.status, [Status.EXCLUDED, Status.LOCATED, Status.LOCATED, Status.REJECTED]
    )
    tried = {}  # (tile, rescues): the rows' tiles, in call order (a tile's rows may be split)
    for t, rescues, rows in log:
        tried.setdefault((t, rescues), []).extend(rows)
    assert list(tried) == [(4, False), (3, False), (4, True), (2, False), (1, False), (3, True)]
    assert tried[(4, True)] == [4, 1, 0] and tried[(2, False)] == [1, 0]  # row 4: done
    assert tried[(3, True)] == [0]  # only the row no tile passed
    log.clear()
    once = dataclasses.replace(loc, gate_tries=1)(r)  # every try within tries: today's order
    np.testing.assert_array_equal(once.status[2:], Status.REJECTED)
    assert list(dict.fromkeys((t, rescues) for t, rescues, _ in log)) == [
        (4, False), (3, False), (4, True), (3, True)]  # fmt: skip


def test_settings_are_checked_however_the_tiled_locator_is_built():
    """The constructor and dataclasses.replace check what from_offline checks (the
    settings only: placeholders stand for the two tiles' classifier and Locators)."""
    parts = dict(classifier=None, locators=(None, None), quick=(None, None),
                 aps=np.zeros((2, 3), int), tile_of=np.zeros(2, int))  # fmt: skip
    ok = tiled.TiledLocator(**parts, tries=2)
    for bad, name in ((dict(tries=0), "tries"), (dict(tries=3), "tries"),
                      (dict(ring_steps=0), "ring_steps"), (dict(ring_risk=1.0), "ring_risk"),
                      (dict(gate_tries=0), "gate_tries"),
                      (dict(ring_aps=np.zeros((2, 4), int)), "ring")):  # fmt: skip
        with pytest.raises(ValueError, match=name):
            tiled.TiledLocator(**parts, **bad)
        with pytest.raises(ValueError, match=name):
            dataclasses.replace(ok, **bad)


def test_one_table_of_every_tile_screens_each_row_as_its_own_tile():
    """``TiledCellTable`` (every tile's cell table as one, global cell t * C + c): its rows
    and corners are each tile's, to the bit, and one screen of the rows of both tiles, cell
    by cell or row by row, gives the starts each tile's own screen gives; tables of
    another shape are refused."""
    from dmimo_jax.estimators import cell_grid, cell_table
    from dmimo_jax.pipeline.online import ScreenSettings, cell_starts
    from dmimo_jax.pipeline.tiled_screen import TiledCellTable

    tiling = tiles.tile_aps(SCENE, 2.0, rule="nearest", num_aps=12)
    scenes = [tiles.tile_scene(SCENE, tiling, t) for t in range(2)]
    tables = [cell_table(s, cell_grid(s, 0.5), spacing=0.1) for s in scenes]
    one = TiledCellTable.of(tables)
    per_tile = tables[0].cells.num_cells
    assert one.num_tiles == 2 and one.cells.num_cells == 2 * per_tile and one.num_aps == 12
    cells = np.array([[0, 3], [per_tile - 1, 1]])
    for t in range(2):
        np.testing.assert_array_equal(one.rows(cells + t * per_tile), tables[t].rows(cells))
        np.testing.assert_array_equal(
            one.cells.corner(cells + t * per_tile), tables[t].cells.corner(cells)
        )
    np.testing.assert_array_equal(one.offsets, tables[0].offsets)
    # 6 snapshots in each tile, each naming 3 of its tile's cells (its true one first)
    labs = [dj.measure.labeled_snapshots(jax.random.key(t), s, 6) for t, s in enumerate(scenes)]
    x = np.concatenate([np.asarray(lab.x) for lab in labs])
    r = np.concatenate([np.asarray(lab.r) for lab in labs])
    own = np.concatenate([np.asarray(tables[t].cells.index(x[6 * t : 6 * t + 6])) for t in (0, 1)])
    named = np.stack([own, (own + 1) % per_tile, (own + 5) % per_tile], axis=1).astype(np.int32)
    probs = np.tile(np.array([0.6, 0.3, 0.05], np.float32), (12, 1))
    settings = ScreenSettings(1, 0.999, 0.5, 4, 2)
    screen = jax.jit(
        lambda table, r, c, p, by_cell: cell_starts(r, c, p, table, settings, by_cell)[::2],
        static_argnums=4,
    )
    shift = np.repeat([0, per_tile], 6)[:, None]
    for by_cell in (True, False):
        together, unsure = screen(one, r, named + shift, probs, by_cell)
        for t in range(2):
            rows = slice(6 * t, 6 * t + 6)
            alone, _ = screen(tables[t], r[rows], named[rows], probs[rows], by_cell)
            np.testing.assert_allclose(together[rows], alone, atol=1e-12)
        assert not np.any(unsure)
    with pytest.raises(ValueError, match="tables must share"):
        TiledCellTable.of(
            [tables[0], cell_table(scenes[1], cell_grid(scenes[1], 1.0), spacing=0.1)]
        )
