"""POPT, the MLP/HI benchmarks, the training loop and model files (Sec. IV, VI-A)."""

import dataclasses
import json
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dmimo_jax as dj
from dmimo_jax import complexity
from dmimo_jax.estimators import cell_grid, hyperbola
from dmimo_jax.learning import synthesize
from dmimo_jax.learning.cells import CellClassifier, CellConfig
from dmimo_jax.learning.hi import AmbiguityClassifier
from dmimo_jax.learning.io import load_model, save_model
from dmimo_jax.learning.mlp import MLPConfig, MLPRegressor
from dmimo_jax.learning.nets import differential_inputs, functional, jit_method
from dmimo_jax.learning.popt import POPT, POPTConfig
from dmimo_jax.learning.train import TrainConfig, train, train_many
from tests.helpers import run_on_host_devices

SCENE = dj.paper_scene()
LOW, HIGH = SCENE.ue_low, SCENE.ue_high


def _popt(cfg=None, seed=0):
    cfg = POPTConfig.tiny() if cfg is None else cfg
    return POPT(SCENE.num_aps, cfg, low=LOW, high=HIGH, rngs=nnx.Rngs(seed))


def _data(num, seed=0):
    return synthesize(jax.random.key(seed), dj.TwoRayModel(SCENE), num)


def _params(model):
    return jax.tree.leaves(nnx.state(model, nnx.Param))


def test_paper_popt_shapes_parameter_count_and_flops():
    net = _popt(POPTConfig.paper())
    apply, state = functional(net)  # shapes traced, not computed (eager is 150 compiles)
    assert jax.eval_shape(apply, state, jnp.zeros((5, 17))).shape == (5, 3)
    single = jax.eval_shape(apply, state, jnp.zeros(17))
    assert single.shape == (3,) and single.dtype == jnp.float32
    count = sum(p.size for p in _params(net))
    assert abs(count - 2.4e6) / 2.4e6 < 0.01, count  # the paper: ~2.4 M
    # eq. (29): 2 N_enc D (2 M^2 + 4 M D + 2 M D_ff) = 81.1 M at the paper's sizes
    assert complexity.popt_flops(17, POPTConfig.paper()) == pytest.approx(81.1e6, rel=2e-3)


def test_ap_embeddings_break_permutation_symmetry():
    net = _popt(POPTConfig(d_emb=16, n_enc=1, n_head=2, d_ff=32, d_h=16, dropout=0.0))
    r = jax.random.uniform(jax.random.key(1), (17,), minval=-np.pi, maxval=np.pi)
    perm = jnp.roll(jnp.arange(17), 5)
    run = nnx.jit(lambda m, r: m(r))  # one program for every call below, not op by op
    assert float(jnp.max(jnp.abs(run(net, r) - run(net, r[perm])))) > 1e-4
    # without AP embeddings POPT is permutation invariant (encoder equivariant + pooling)
    net.ap_embedding[...] = jnp.zeros_like(net.ap_embedding[...])
    np.testing.assert_allclose(run(net, r), run(net, r[perm]), atol=1e-5)


def test_dropout_only_with_a_key_and_pure_apply_matches_the_module():
    net = _popt(POPTConfig(d_emb=16, n_enc=1, n_head=2, d_ff=32, d_h=16, dropout=0.2))
    r = jax.random.uniform(jax.random.key(1), (4, 17), minval=-np.pi, maxval=np.pi)
    apply, state = functional(net)
    np.testing.assert_allclose(jax.jit(apply)(state, r), net(r), rtol=1e-6)  # jit fuses: ulps
    a, b = net(r, key=jax.random.key(0)), net(r, key=jax.random.key(1))
    assert float(jnp.max(jnp.abs(a - b))) > 0
    np.testing.assert_array_equal(net(r, key=jax.random.key(0)), a)


def test_jit_method_runs_the_current_weights_as_one_program():
    net = _popt()
    r = jax.random.uniform(jax.random.key(2), (4, 17), minval=-np.pi, maxval=np.pi)
    x = jnp.ones((4, 3))
    np.testing.assert_allclose(jit_method(net, "error", r, x), net.error(r, x), rtol=1e-5)
    before = jit_method(net, "__call__", r)
    net.head2.bias[...] = net.head2.bias[...] + 1.0  # new weights, same structure
    after = jit_method(net, "__call__", r)
    np.testing.assert_allclose(after, net(r), rtol=1e-5)
    assert float(jnp.min(jnp.abs(after - before))) > 0.1  # not a stale program
    cells = CellClassifier(17, CellConfig(), cells=cell_grid(SCENE, 2.0), rngs=nnx.Rngs(0))
    idx, p = jit_method(cells, "top_cells", r, k=3)  # a static keyword
    want = cells.top_cells(r, 3)
    assert idx.shape == (4, 3)
    np.testing.assert_array_equal(idx, want[0])
    np.testing.assert_allclose(p, want[1], rtol=1e-5)


def test_same_key_same_model_and_same_training():
    data = _data(300)
    cfg = TrainConfig(epochs=2, batch_size=50, val_fraction=0.2)
    a = train(_popt(), data, cfg, progress=False).model
    b = train(_popt(), data, cfg, progress=False).model
    for pa, pb in zip(_params(a), _params(b), strict=True):
        np.testing.assert_array_equal(pa, pb)
    c = _popt(seed=1)
    assert any(not np.array_equal(pa, pc) for pa, pc in zip(_params(a), _params(c), strict=True))


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_tiny_mlp_overfits_a_tiny_dataset():
    data = _data(40)
    net = MLPRegressor(17, MLPConfig(hidden=(64, 64)), low=LOW, high=HIGH, rngs=nnx.Rngs(0))
    before = float(jnp.sqrt(jnp.mean(net.error(data.r[:32], data.x[:32]) ** 2)))
    cfg = TrainConfig(epochs=400, batch_size=32, val_fraction=0.2, peak_lr=3e-3, weight_decay=0.0)
    res = train(net, data, cfg, progress=False)
    after = float(jnp.sqrt(jnp.mean(net.error(data.r[:32], data.x[:32]) ** 2)))
    assert before > 2.0 and after < 0.05 * before, (before, after)
    assert res.history[-1]["loss"] < 0.05 * res.history[0]["loss"]


@pytest.mark.slow
def test_tiny_popt_overfits_a_tiny_dataset():
    data = _data(40)
    net = _popt(POPTConfig(d_emb=32, n_enc=1, n_head=2, d_ff=64, d_h=32, dropout=0.0))
    cfg = TrainConfig(epochs=300, batch_size=32, val_fraction=0.2, peak_lr=3e-3, weight_decay=0.0)
    res = train(net, data, cfg, progress=False)
    assert res.history[-1]["loss"] < 0.1 * res.history[0]["loss"], res.history[-1]


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_checkpoint_kill_and_resume_reproduces_the_uninterrupted_run(tmp_path):
    data = _data(400)
    cfg = TrainConfig(epochs=3, batch_size=50, val_fraction=0.25)
    full = train(_popt(), data, cfg, progress=False)

    def kill_after_first_epoch(epoch, row):
        if epoch == 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(
            _popt(),
            data,
            cfg,
            checkpoint_dir=tmp_path,
            progress=False,
            on_epoch_end=kill_after_first_epoch,
        )
    # a fresh process would rebuild the model from scratch: here a different init proves
    # that the parameters come from the checkpoint
    resumed = train(_popt(seed=7), data, cfg, checkpoint_dir=tmp_path, progress=False)
    assert [h["epoch"] for h in resumed.history] == [1, 2, 3]
    for pa, pb in zip(_params(full.model), _params(resumed.model), strict=True):
        np.testing.assert_array_equal(pa, pb)
    assert resumed.history[-1]["loss"] == full.history[-1]["loss"]


@pytest.mark.slow
def test_resident_scan_loop_matches_the_host_loop():
    """The device-resident loop (lax.scan over minibatches, scans of 3 steps leaving a
    remainder of 1) takes the same minibatches and dropout keys as the host loop: the
    same losses and validation errors to float32 rounding (Adam's normalized steps carry
    rounding of near-zero gradients into the weights, so those are compared through the
    validation error), where another data order moves them by percent."""
    data = _data(450)
    cfg = TrainConfig(epochs=2, batch_size=50, val_fraction=0.125)
    cfg_net = POPTConfig(d_emb=32, n_enc=1, n_head=2, d_ff=32, d_h=16, dropout=0.1)
    host = train(_popt(cfg_net), data, cfg, progress=False, resident=False)
    res = train(_popt(cfg_net), data, cfg, progress=False, resident=True, scan_steps=3)
    other = train(
        _popt(cfg_net),
        data,
        dataclasses.replace(cfg, seed=1),
        progress=False,
        resident=True,
    )
    for key in ("loss", "val_loss", "val_error"):
        for h, r in zip(host.history, res.history, strict=True):
            assert r[key] == pytest.approx(h[key], rel=1e-5), (key, h, r)
        assert abs(other.history[-1][key] / host.history[-1][key] - 1) > 1e-3, key
    with pytest.raises(ValueError, match="scan_steps"):
        train(_popt(), data, cfg, progress=False, scan_steps=0)
    with pytest.raises(ValueError, match="resident"):
        train(_popt(), data, cfg, progress=False, resident="yes")


def test_checkpoint_of_another_architecture_is_a_clear_error(tmp_path):
    data = _data(200)
    cfg = TrainConfig(epochs=1, batch_size=50, val_fraction=0.25)
    train(_popt(), data, cfg, checkpoint_dir=tmp_path, progress=False)
    other = _popt(POPTConfig(d_emb=32, n_enc=1, n_head=2, d_ff=32, d_h=16, dropout=0.0))
    # named before any array is read (a failed restore leaves orbax's other reads pending)
    with pytest.raises(ValueError, match=r"checkpoint_dir.*ap_embedding.*saved with shape"):
        train(
            other,
            data,
            TrainConfig(epochs=2, batch_size=50, val_fraction=0.25),
            checkpoint_dir=tmp_path,
            progress=False,
        )


def test_model_file_roundtrip_and_bad_files(tmp_path):
    net = _popt()
    r = _data(8).r
    save_model(tmp_path / "m", net, meta={"radius": 0.3})
    back, meta = load_model(tmp_path / "m")
    same = nnx.jit(lambda m, r: m(r))  # one program for both (same graph), not op by op
    np.testing.assert_array_equal(same(back, r), same(net, r))
    assert meta == {"radius": 0.3}
    with pytest.raises(FileNotFoundError, match="no saved model"):
        load_model(tmp_path / "missing")
    (tmp_path / "m" / "spec.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupted"):
        load_model(tmp_path / "m")
    save_model(tmp_path / "m2", net)
    spec = json.loads((tmp_path / "m2" / "spec.json").read_text())
    spec["spec"]["config"]["d_emb"] = 32
    (tmp_path / "m2" / "spec.json").write_text(json.dumps(spec))
    # named before any array is read (a failed restore leaves orbax's other reads pending)
    with pytest.raises(ValueError, match=r"does not match.*ap_embedding.*saved with shape"):
        load_model(tmp_path / "m2")


def test_bad_snapshots_are_clear_errors():
    net = _popt()
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 17\)"):
        net(jnp.zeros((2, 16)))
    with pytest.raises(ValueError, match="non-finite"):
        net(jnp.full((2, 17), jnp.nan))
    with pytest.raises(ValueError, match="d_emb"):
        POPTConfig(d_emb=30, n_head=4)
    with pytest.raises(ValueError, match="batch_size"):
        train(net, _data(50), TrainConfig(batch_size=500), progress=False)


def test_differential_inputs_cancel_the_cpo():
    r = _data(4).r
    shifted = dj.wrap(r + 1.234)
    np.testing.assert_allclose(differential_inputs(r), differential_inputs(shifted), atol=1e-12)
    assert differential_inputs(r).shape == (4, 32)


def test_hyperbola_intersection_with_the_true_integers_recovers_a_los_position():
    x = jnp.array([6.5, 5.0, 2.0])
    ap, lam = SCENE.ap_positions, float(SCENE.wavelength)
    d = jnp.linalg.norm(x[None, :] - ap, axis=-1)
    r = dj.wrap(2 * jnp.pi * d / lam + 0.7)  # LoS only: the hyperboloids are exact
    n = hyperbola.ambiguities(r, x, ap, lam)
    assert int(jnp.max(jnp.abs(n))) <= hyperbola.max_ambiguity(ap, lam)
    np.testing.assert_allclose(hyperbola.hyperboloid_residuals(x, r, n, ap, lam), 0.0, atol=1e-9)
    x0 = (x + jnp.array([0.1, -0.08, 0.05]))[None, :]
    np.testing.assert_allclose(hyperbola.intersect(r, n, ap, lam, x0), x, atol=1e-8)
    # a wrong integer moves the intersection by about a wavelength
    bad = hyperbola.intersect(r, n.at[3].add(1), ap, lam, x0)
    assert float(jnp.linalg.norm(bad - x)) > 1e-3


def test_ambiguity_classifier_labels_and_shapes():
    lam = float(SCENE.wavelength)
    n_max = hyperbola.max_ambiguity(SCENE.ap_positions, lam)
    clf = AmbiguityClassifier(
        17,
        MLPConfig.tiny(),
        ap_positions=SCENE.ap_positions,
        wavelength=lam,
        n_max=n_max,
        rngs=nnx.Rngs(0),
    )
    data = _data(6)
    assert clf(data.r).shape == (6, 16, 2 * n_max + 1)
    labels = clf.labels(data.r, data.x)
    assert labels.shape == (6, 16) and int(labels.min()) >= 0 and int(labels.max()) <= 2 * n_max
    assert np.isfinite(float(clf.loss(data.r, data.x, None)))


@pytest.mark.slow
def test_data_parallel_training_matches_one_device():
    """Forced 4 CPU devices: minibatches sharded, parameters replicated; same result."""
    script = textwrap.dedent(
        """
        import jax, numpy as np
        jax.config.update("jax_enable_x64", True)
        from flax import nnx
        import dmimo_jax as dj
        from dmimo_jax.learning import synthesize
        from dmimo_jax.learning.popt import POPT, POPTConfig
        from dmimo_jax.learning.train import train, TrainConfig
        assert jax.device_count() == 4
        scene = dj.paper_scene()
        data = synthesize(jax.random.key(0), dj.TwoRayModel(scene), 300)
        out, losses = [], []
        for devices in (jax.devices()[:1], jax.devices()):
            net = POPT(17, POPTConfig.tiny(), low=scene.ue_low, high=scene.ue_high, rngs=nnx.Rngs(0))
            res = train(net, data, TrainConfig(epochs=2, batch_size=48, val_fraction=0.2), devices=devices, progress=False)
            out.append(np.concatenate([np.ravel(p) for p in jax.tree.leaves(nnx.state(net, nnx.Param))]))
            losses.append([h["loss"] for h in res.history] + [h["val_error"] for h in res.history])
        rel = np.linalg.norm(out[0] - out[1]) / np.linalg.norm(out[0])
        print("result", rel, np.max(np.abs(np.subtract(*losses)) / np.abs(losses[0])))
        """
    )
    out = run_on_host_devices(script)
    # sharded reductions sum in another order: float32 rounding, which Adam's
    # normalized steps carry into the parameters at the 1e-4 level
    rel_params, rel_losses = map(float, out.split("result")[1].split())
    assert rel_params < 1e-3 and rel_losses < 1e-4, (rel_params, rel_losses)


def _cells_net(seed=0, hidden=(32, 32)):
    grid = cell_grid(SCENE, 3.0)
    return CellClassifier(17, CellConfig(hidden=hidden, top_k=2), cells=grid, rngs=nnx.Rngs(seed))


def _flat(model):
    return np.concatenate([np.ravel(p) for p in _params(model)])


def test_train_many_is_a_loop_of_train_in_one_program(tmp_path):
    """Three networks on three data sets, trained as one vmapped program, end where three
    train calls end (float32 rounding: a vmapped product sums in another order), each with
    its own history; a killed run resumes from its checkpoint to the same parameters."""
    datas = [_data(360, seed=s) for s in (1, 2, 3)]
    cfg = TrainConfig(epochs=2, batch_size=40, val_fraction=0.125, peak_lr=3e-3)
    loops = [train(_cells_net(), d, cfg, progress=False) for d in datas]
    many = train_many([_cells_net() for _ in datas], datas, cfg, progress=False)
    for one, res in zip(loops, many, strict=True):
        a, b = _flat(one.model), _flat(res.model)  # 2e-8 here; another data order: 3e-2
        assert np.linalg.norm(a - b) / np.linalg.norm(a) < 1e-6
        for h1, h2 in zip(one.history, res.history, strict=True):
            assert h2["epoch"] == h1["epoch"] and h2["lr"] == pytest.approx(h1["lr"], rel=1e-6)
            for key in ("loss", "val_loss", "val_error"):
                assert h2[key] == pytest.approx(h1[key], rel=1e-6), (key, h1, h2)
    # the networks learned different things (their own data), not one copy
    assert np.linalg.norm(_flat(many[0].model) - _flat(many[1].model)) > 1e-2

    def kill_after_first_epoch(epoch, rows):
        assert len(rows) == 3 and rows[0]["epoch"] == epoch + 1
        if epoch == 0:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_many([_cells_net() for _ in datas], datas, cfg, checkpoint_dir=tmp_path,
                   progress=False, on_epoch_end=kill_after_first_epoch)  # fmt: skip
    fresh = [_cells_net(seed=7) for _ in datas]  # another init: the checkpoint's must win
    resumed = train_many(fresh, datas, cfg, checkpoint_dir=tmp_path, progress=False)
    for res, again in zip(many, resumed, strict=True):
        assert [h["epoch"] for h in again.history] == [1, 2]
        np.testing.assert_array_equal(_flat(res.model), _flat(again.model))


def test_train_many_refuses_networks_of_two_graphs_and_data_of_two_sizes():
    cfg = TrainConfig(epochs=1, batch_size=40, val_fraction=0.125)
    d = _data(200)
    with pytest.raises(ValueError, match="one graph"):
        train_many([_cells_net(), _cells_net(hidden=(16, 16))], [d, d], cfg, progress=False)
    with pytest.raises(ValueError, match="one size"):
        train_many([_cells_net(), _cells_net()], [d, _data(240)], cfg, progress=False)
    with pytest.raises(ValueError, match="one length"):
        train_many([_cells_net(), _cells_net()], [d], cfg, progress=False)
    with pytest.raises(ValueError, match="non-empty"):
        train_many([], [], cfg, progress=False)
    with pytest.raises(ValueError, match="vmap_width"):
        train_many([_cells_net()], [d], cfg, progress=False, vmap_width=0)


@pytest.mark.slow
def test_train_many_sharded_over_devices_matches_one_device():
    """Forced 4 CPU devices: three networks (padded to four) sharded along the network
    axis end where one device leaves them."""
    script = textwrap.dedent(
        """
        import jax, numpy as np
        from flax import nnx
        import dmimo_jax as dj
        from dmimo_jax.estimators import cell_grid
        from dmimo_jax.learning import synthesize
        from dmimo_jax.learning.cells import CellClassifier, CellConfig
        from dmimo_jax.learning.train import train_many, TrainConfig
        assert jax.device_count() == 4
        scene = dj.paper_scene()
        datas = [synthesize(jax.random.key(s), dj.TwoRayModel(scene), 360) for s in (1, 2, 3)]
        cfg = TrainConfig(epochs=2, batch_size=40, val_fraction=0.125)
        out = []
        for devices in (jax.devices()[:1], jax.devices()):
            nets = [CellClassifier(17, CellConfig(hidden=(32, 32), top_k=2), cells=cell_grid(scene, 3.0),
                                   rngs=nnx.Rngs(0)) for _ in datas]
            train_many(nets, datas, cfg, devices=devices, progress=False)
            out.append([np.concatenate([np.ravel(p) for p in jax.tree.leaves(nnx.state(n, nnx.Param))])
                        for n in nets])
        print("result", max(np.linalg.norm(a - b) / np.linalg.norm(a) for a, b in zip(*out)))
        """
    )
    rel = float(run_on_host_devices(script).split("result")[1])
    assert rel < 1e-4, rel


def test_a_truncated_cached_set_is_refused_not_read_as_zeros(tmp_path):
    from dmimo_jax.learning import load_dataset, write_dataset

    write_dataset(tmp_path, jax.random.key(0), SCENE, 600, chunk_size=256, progress=False)
    f = tmp_path / "r.npy"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size // 2)
    with pytest.raises(ValueError, match=r"r\.npy is truncated"):
        write_dataset(tmp_path, jax.random.key(0), SCENE, 600, chunk_size=256, progress=False)
    with pytest.raises(ValueError, match=r"r\.npy is truncated"):
        load_dataset(tmp_path)
