"""dmimo_jax.pipeline on any PhaseModel: run_offline for every kind under a physical
model, the cache key that covers everything, and the one Locator equal to the composed stages."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dmimo_jax as dj
from dmimo_jax import pipeline
from dmimo_jax.learning import CellConfig, POPTConfig, TrainConfig
from dmimo_jax.learning.presets import CellsPreset, Preset
from dmimo_jax.pipeline.online import check_screen_settings
from tests.helpers import LOCATOR_BATCH, LOCATOR_LIGHT

# a 0.6 m x 0.6 m x 0.4 m UE region: small tables, 0.2 m cells
SCENE = dj.paper_scene(-10.0, convention="itu").replace(
    ue_low=jnp.array([5.0, 5.0, 1.5]),
    ue_high=jnp.array([5.6, 5.6, 1.9]),
    ap_phase_offsets=np.random.default_rng(0).uniform(-np.pi, np.pi, 17),
)
MODEL = dj.TwoRayModel(SCENE)
CELLS = CellsPreset(
    CellConfig(hidden=(64, 64), top_k=2),
    TrainConfig(epochs=2, batch_size=200, peak_lr=3e-3, val_fraction=0.1),
    4000,
    cell_size=0.2,
)
# a one-block POPT, 3 epochs: what is tested is the wiring (training, caching, loading,
# the locators), not the networks' accuracy (each epoch also writes an orbax checkpoint)
TINY = Preset("tiny", POPTConfig.tiny(), TrainConfig(epochs=3, batch_size=100), 400, CELLS)


def _labeled(num=20, seed=0, model=MODEL):
    k_x, k_c, k_n = jax.random.split(jax.random.key(seed), 3)
    x = dj.sample_positions(k_x, num, model.scene)
    r = dj.simulate_phases_batch(k_n, model, x, dj.random_cpos(k_c, num))
    return x, r, jax.vmap(model.variance)(x)


LABELED = _labeled()


def _offline(tmp, *, scene=SCENE, model=MODEL, labeled=LABELED, kinds=(), **kw):
    kw = {"preset": TINY, "cells": CELLS, "progress": False, **kw}
    return pipeline.run_offline(*labeled, scene, model=model, kinds=kinds, cache_dir=tmp, **kw)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cache")
    return tmp, _offline(tmp, kinds=("popt", "mlp", "hi", "cells"))


def test_run_offline_trains_every_kind_under_the_given_model(trained):
    tmp, off = trained
    assert set(off.estimators) == {"popt", "mlp", "hi", "cells"}
    assert off.model is MODEL and off.screen is MODEL  # no GP was fitted
    for kind in ("popt", "mlp", "hi"):
        assert off.radii[kind] >= 0.1 and np.isfinite(off.info[kind]["val_rmse_m"])
    assert off.cache.parent == tmp
    # a second call loads every network from the cache
    again = _offline(tmp, kinds=("popt", "mlp", "hi", "cells"))
    assert again.cache == off.cache
    r = _labeled(4, seed=9)[1]
    for kind in ("popt", "mlp"):
        np.testing.assert_allclose(
            pipeline.coarse_estimate(again.estimators[kind], r),
            pipeline.coarse_estimate(off.estimators[kind], r),
            rtol=1e-6,
        )


@pytest.mark.slow  # the Locator's program compiles (about 25 s here): the slow tier's
def test_cells_locator_equals_the_composed_stages(trained):
    _, off = trained
    x, r, _ = _labeled(LOCATOR_BATCH, seed=3)
    # without fault exclusion: its program compiles in a third of the time (the answers with
    # it are these: tests/test_faults.py::test_without_faults_the_locator_is_unchanged)
    loc = pipeline.Locator.from_offline(off, "cells", **LOCATOR_LIGHT)
    out = loc(r)
    # the same stages composed from the public functions: the classifier's candidates, the
    # two-tier screen (the whole region for unsure rows), the fine stage under its model
    cells, probs = pipeline.cell_probabilities(off.estimators["cells"], r, 4)
    settings = check_screen_settings(
        off.screen, off.cells, 4, first_cells=2, first_mass=0.999, min_mass=0.5, num_starts=4,
        screen_steps=2,
    )  # fmt: skip
    screen = jax.jit(pipeline.cell_screen, static_argnums=(6, 7))
    found, _ = screen(r, cells, probs, off.screen, off.cells, off.table, settings, LOCATOR_BATCH)
    ref = dj.refine_batch(found.x, r, off.screen, num_steps=loc.settings.fine_steps)
    # one program against separate calls: the same steps, fused differently (a nanometre is
    # five orders of magnitude below the PEB)
    np.testing.assert_allclose(np.asarray(out.x), np.asarray(ref.x), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(np.asarray(out.fallback), np.asarray(found.fallback))
    assert out.x.shape == (LOCATOR_BATCH, 3) and out.coarse.shape == (LOCATOR_BATCH, 3)
    # stage by stage, as a benchmark times them
    coarse = loc.coarse(r)
    found = loc.screen(r, coarse)
    fine = loc.fine_stage(r, found.x).x
    np.testing.assert_allclose(np.asarray(fine), np.asarray(out.x), rtol=0, atol=1e-9)
    # the physical model's tables put the estimate in the right basin
    assert float(np.max(np.linalg.norm(np.asarray(out.x) - np.asarray(x), axis=1))) < 1e-3


# the window program is compiled per network (about 25 s each here): the cells program is the
# test command's, the window programs the slow tests'
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["popt", "mlp", "hi"])
def test_window_locator_equals_locate(trained, kind):
    _, off = trained
    r = _labeled(8, seed=4)[1]
    # fault exclusion in one kind's program only (a fault-free answer is the same without it)
    out = pipeline.Locator.from_offline(
        off, kind, fine="model", max_excluded=3 if kind == "popt" else 0
    )(r)
    ref = pipeline.locate(
        r,
        off.estimators[kind],
        off.model,
        screen=off.screen,
        radius=off.radii[kind],
        table=off.table,
    )
    # the Locator is one program, locate three calls: the same steps, fused differently
    np.testing.assert_allclose(np.asarray(out.x), np.asarray(ref.fine), rtol=0, atol=1e-9)
    # the network runs in float32: its positions agree to float32 rounding (m)
    np.testing.assert_allclose(np.asarray(out.coarse), np.asarray(ref.coarse), rtol=0, atol=2e-6)
    assert out.fallback.shape == (8,)


def _folder(tmp, **changes):
    labeled = changes.pop("labeled", LABELED)
    model = changes.pop("model", MODEL)
    return _offline(tmp, model=model, labeled=labeled, **changes).cache


def test_the_cache_key_covers_everything_that_determines_the_result(tmp_path):
    base = _folder(tmp_path)
    assert _folder(tmp_path) == base
    x, r, nv = LABELED
    other_region = SCENE.replace(ue_high=jnp.array([5.6, 5.6, 2.0]))
    changed = {
        "region": dict(scene=other_region, model=dj.TwoRayModel(other_region)),
        "noise": dict(labeled=(x, r, 2 * nv)),
        "phases": dict(labeled=(x, r + 1e-3, nv)),
        "power": dict(model=dj.TwoRayModel(SCENE.replace(tx_power=2 * SCENE.tx_power))),
        "offsets": dict(model=dj.TwoRayModel(SCENE.replace(ap_phase_offsets=np.zeros(17)))),
        "antenna": dj.TwoRayModel(SCENE.replace(antenna=dj.CosinePattern(1.0))),
        "polarization": dj.TwoRayModel(SCENE.replace(polarization="TM")),
        "room": dj.room_model(SCENE, walls="concrete"),
        "seed": dict(seed=1),
        "samples": dict(num_samples=500),
        "preset": dict(preset="quick"),
        "own network": dict(
            preset=dataclasses.replace(TINY, popt=dataclasses.replace(POPTConfig.tiny(), d_h=8))
        ),
    }
    folders = {}
    for name, change in changed.items():
        kwargs = change if isinstance(change, dict) else dict(model=change)
        folders[name] = _folder(tmp_path, **kwargs)
    assert base not in folders.values()
    assert len(set(folders.values())) == len(folders), folders


@pytest.mark.parametrize("preset", ["fast", 3, None])
def test_a_preset_is_a_known_name_or_a_preset(preset, tmp_path):
    with pytest.raises(ValueError, match=r"preset must be one of \['cpu', 'paper', 'quick'\]"):
        _offline(tmp_path, preset=preset)


def test_cache_key_of_trees_and_settings():
    key = pipeline.cache_key({"a": 1}, MODEL)
    assert key == pipeline.cache_key({"a": 1}, dj.TwoRayModel(SCENE))
    assert key != pipeline.cache_key({"a": 1}, dj.TwoRayModel(SCENE.replace(eps_r=5.0 - 0.5j)))
    assert key != pipeline.cache_key({"a": 2}, MODEL)
    assert key != pipeline.cache_key({"a": 1}, dj.room_model(SCENE))  # same numbers, other class


def test_the_default_cache_is_the_users_not_the_working_directory(monkeypatch, tmp_path):
    monkeypatch.delenv(pipeline.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert pipeline.default_cache_dir() == tmp_path / "xdg" / "dmimo_jax"
    monkeypatch.setenv(pipeline.CACHE_ENV, str(tmp_path / "mine"))
    assert pipeline.default_cache_dir() == tmp_path / "mine"
    off = pipeline.run_offline(*LABELED, SCENE, model=MODEL, kinds=(), progress=False)
    assert off.cache.parent == tmp_path / "mine"


class _NotAModel:
    scene = SCENE
    num_aps = 17


@pytest.mark.parametrize(
    ("model", "match"),
    [
        ("gpx", "model must be 'gp' or a PhaseModel"),
        (_NotAModel(), "missing mean, variance"),
        (
            dj.TwoRayModel(dj.paper_scene().replace(ap_positions=SCENE.ap_positions[:16])),
            "must agree",
        ),
    ],
)
def test_run_offline_refuses_a_bad_model(tmp_path, model, match):
    with pytest.raises(ValueError, match=match):
        _offline(tmp_path, model=model)


def test_locator_refuses_bad_settings(trained):
    _, off = trained
    with pytest.raises(ValueError, match="was not trained"):
        pipeline.Locator.from_offline(off._replace(estimators={}), "cells")
    with pytest.raises(ValueError, match="fine must be"):
        pipeline.Locator.from_offline(off, "cells", fine="gp")
    with pytest.raises(ValueError, match="num_cells=99 exceeds"):
        pipeline.Locator.from_offline(off, "cells", num_cells=99)
    with pytest.raises(ValueError, match="offline must be"):
        pipeline.Locator.from_offline(object(), "cells")
    with pytest.raises(ValueError, match=r"r must have shape"):
        pipeline.Locator.from_offline(off, "cells", num_cells=4)(jnp.zeros((2, 16)))


@pytest.mark.slow
def test_the_cost_gate_recovers_wrong_cells(trained):
    """Screen only the most likely cell: where the classifier is wrong the answer's cost is
    far above chi-square, and the whole-region search recovers it."""
    _, off = trained
    x, r, _ = _labeled(64, seed=8)
    blind = pipeline.Locator.from_offline(off, "cells", num_cells=1, min_mass=0.0, cost_gate=None)
    err = np.linalg.norm(np.asarray(blind(r).x) - np.asarray(x), axis=1)
    assert np.any(err > 1e-3)  # the top cell alone misses some
    out = pipeline.Locator.from_offline(off, "cells", num_cells=1, min_mass=0.0)(r)
    err_gated = np.linalg.norm(np.asarray(out.x) - np.asarray(x), axis=1)
    assert float(err_gated.max()) < 1e-3
    np.testing.assert_array_equal(np.asarray(out.recovered), err > 1e-3)
    assert np.all(np.asarray(out.fallback)[np.asarray(out.recovered)])


def test_locator_refuses_a_cell_table_of_other_cells(trained):
    """An Offline whose cell table is not the classifier's (another cell size) was accepted,
    right only because every snapshot fell back; it is refused."""
    from dmimo_jax.estimators import cell_grid, cell_table

    _, off = trained
    other = cell_table(off.screen, cell_grid(SCENE, 0.3))
    with pytest.raises(ValueError, match="does not belong to the classifier's cells"):
        pipeline.Locator.from_offline(off._replace(cells=other), "cells", num_cells=2)
    with pytest.raises(ValueError, match="table: none"):
        pipeline.Locator.from_offline(off._replace(cells=None), "cells", num_cells=2)
    # the region's table is the cells' (one copy); a table of another grid is refused
    assert off.table is off.cells.table
    region = dj.estimators.phasor_table(off.screen, dj.estimators.search_grid(SCENE, 0.1, "ue"))
    with pytest.raises(ValueError, match="not aligned with its"):
        pipeline.Locator.from_offline(off._replace(table=region), "cells", num_cells=2)


def test_the_estimator_kinds_are_declared_once_by_their_networks():
    """pipeline.KINDS and train_estimator's choices are learning.ESTIMATORS: each network
    class builds itself for a scene and names its training settings and online estimator."""
    from dmimo_jax.learning import ESTIMATORS, get_preset

    assert pipeline.offline.KINDS == tuple(ESTIMATORS) == ("popt", "mlp", "hi", "cells")
    preset = get_preset(TINY)
    for kind, cls in ESTIMATORS.items():
        net = cls.for_training(SCENE, preset, rngs=nnx.Rngs(0))
        assert type(net) is cls and cls.estimator_kind == kind
    assert ESTIMATORS["cells"].training_config(preset) is preset.cells.train
    assert ESTIMATORS["popt"].training_config(preset) is preset.train
    with pytest.raises(ValueError, match="kind must be one of 'popt', 'mlp', 'hi', 'cells'"):
        pipeline.train_estimator("knn", None, SCENE)
