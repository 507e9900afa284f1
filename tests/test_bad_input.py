"""Bad and edge inputs: a clear error naming the argument, or a correct finite answer.

Each case failed before (a silent NaN, a plausible wrong number, a mixed dataset or an
obscure error) and is kept here so that it cannot come back.
"""

import json
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import estimators, gp
from dmimo_jax.learning import SyntheticBatch, TrainConfig, load_dataset, train, write_dataset

SCENE = dj.paper_scene()
MODEL = dj.TwoRayModel(SCENE)
X = jnp.array([6.5, 5.0, 2.0])
R = dj.simulate_phases(jax.random.key(0), MODEL, X, 0.3)


def _scene(num_aps, **changes):
    ap = np.asarray(SCENE.ap_positions)[:num_aps]
    return SCENE.replace(ap_positions=ap, **changes)


# ----------------------------------------------------------------------------- 1. UE at an AP


@pytest.mark.parametrize(
    "call",
    [
        lambda x: dj.effective_amplitude(x, SCENE),
        lambda x: dj.peb(x, SCENE),
        lambda x: dj.refine(x, R, SCENE),
        lambda x: dj.simulate_phases(jax.random.key(0), SCENE, x, 0.0),
    ],
)
def test_ue_at_an_ap_is_refused(call):
    at_ap = SCENE.ap_positions[3]
    with pytest.raises(ValueError, match="coincides with AP 3"):
        call(at_ap)


# ----------------------------------------------------------------------------- 2. too few APs


@pytest.mark.parametrize(
    "call",
    [
        lambda s: dj.peb(X, s),
        lambda s: dj.egs(jnp.zeros(s.num_aps), s, 0.5, region="ue"),
        lambda s: dj.refine(X, jnp.zeros(s.num_aps), s),
    ],
)
@pytest.mark.parametrize("num_aps", [1, 3])
def test_too_few_aps_for_a_position_and_a_cpo(call, num_aps):
    with pytest.raises(ValueError, match="at least 4 APs"):
        call(_scene(num_aps))


def test_singular_fim_gives_an_infinite_peb():
    """APs on one line: in the vertical plane through it, mirror symmetry leaves the
    perpendicular coordinate unobservable (singular FIM): the PEB is inf, not NaN."""
    ap = np.array([[1.0 + i, 5.0, 4.0] for i in range(6)])
    scene = SCENE.replace(ap_positions=ap)
    assert np.isinf(float(dj.peb(jnp.array([3.2, 5.0, 2.0]), scene)))
    assert np.isfinite(float(dj.peb(jnp.array([3.2, 6.0, 2.0]), scene)))


# ----------------------------------------------------------------------------- 3. the CPO


@pytest.mark.parametrize(
    "cpo, match",
    [(np.nan, "cpo must be finite"), (np.zeros(17), r"cpo must be a scalar"), (np.inf, "finite")],
)
def test_single_snapshot_cpo_is_checked(cpo, match):
    with pytest.raises(ValueError, match=match):
        dj.simulate_phases(jax.random.key(0), MODEL, X, cpo)
    with pytest.raises(ValueError, match=match):
        dj.received_signal(jax.random.key(0), SCENE, X, cpo)


# ----------------------------------------------------------------------------- 4. datasets


def _write(path, model=MODEL, num=40, region=None, chunk=16):
    return write_dataset(
        path, jax.random.key(1), model, num, chunk_size=chunk, region=region, progress=False
    )


@pytest.mark.parametrize(
    "change",
    [
        dict(model=dj.TwoRayModel(dj.paper_scene(material="wood"))),
        dict(region=(jnp.array([4.0, 4.0, 1.0]), jnp.array([5.0, 5.0, 2.0]))),
        dict(chunk=8),
    ],
    ids=["model", "region", "chunking"],
)
def test_write_dataset_refuses_to_resume_another_request(tmp_path, change):
    _write(tmp_path / "d", num=40)
    meta = json.loads((tmp_path / "d" / "meta.json").read_text())
    meta["done"] = 16  # as if interrupted after one chunk
    (tmp_path / "d" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="different dataset"):
        _write(tmp_path / "d", **change)


@pytest.mark.parametrize("damage", ["empty_meta", "garbage_meta", "truncated_r"])
def test_corrupt_dataset_is_refused_with_its_path(tmp_path, damage):
    path = _write(tmp_path / "d")
    if damage == "empty_meta":
        (path / "meta.json").write_text("")
    elif damage == "garbage_meta":
        (path / "meta.json").write_text("{not json")
    else:
        data = (path / "r.npy").read_bytes()
        (path / "r.npy").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=str(path)):
        load_dataset(path)
    if damage != "truncated_r":
        with pytest.raises(ValueError, match=str(path)):
            _write(path)


_DIE_IN_META = """
import json, os, pathlib, signal, sys
import jax
jax.config.update("jax_enable_x64", True)
import dmimo_jax as dj
import dmimo_jax.learning.data as data_mod
real = data_mod.write_json_atomic
def dying(target, obj):
    if obj.get("done", 0) >= 16:  # the first finished chunk: die half-way through its metadata
        tmp = pathlib.Path(str(target) + ".tmp")
        tmp.write_text(json.dumps(obj)[:5])
        os.kill(os.getpid(), signal.SIGKILL)
    real(target, obj)
data_mod.write_json_atomic = dying
data_mod.write_dataset(sys.argv[1], jax.random.key(1), dj.TwoRayModel(dj.paper_scene()), 40,
                       chunk_size=16, progress=False)
"""


def test_a_kill_while_writing_metadata_leaves_a_resumable_dataset(tmp_path):
    path = tmp_path / "d"
    proc = subprocess.run(
        [sys.executable, "-c", _DIE_IN_META, str(path)], capture_output=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    meta = json.loads((path / "meta.json").read_text())  # the old metadata is intact
    assert meta["done"] == 0
    _write(path)  # resumes
    whole = _write(tmp_path / "ref")
    for k in ("x", "r", "cpo"):
        np.testing.assert_array_equal(np.load(path / f"{k}.npy"), np.load(whole / f"{k}.npy"))


# ----------------------------------------------------------------------------- 5. training


def _tiny_data(bad=False):
    rng = np.random.default_rng(0)
    r = rng.uniform(-np.pi, np.pi, (90, 17)).astype(np.float32)
    if bad:
        r[50, 3] = np.nan
    return SyntheticBatch(x=rng.uniform(1.0, 3.0, (90, 3)), r=r, cpo=np.zeros(90))


def test_training_refuses_non_finite_data():
    from flax import nnx

    from dmimo_jax.learning import POPT, POPTConfig

    net = POPT(17, POPTConfig.tiny(), low=[0, 0, 0], high=[9, 9, 3], rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=r"data\.r .*non-finite"):
        train(net, _tiny_data(bad=True), TrainConfig(epochs=1, batch_size=20), progress=False)


@pytest.mark.parametrize("field", ["weight_decay", "peak_lr", "pct_start", "val_fraction"], ids=str)
def test_train_config_refuses_nan(field):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**{field: float("nan")})


# ----------------------------------------------------------------------------- 6. GP inputs


@pytest.fixture(scope="module")
def gp_model():
    x = dj.sample_positions(jax.random.key(2), 6, SCENE)
    r = dj.simulate_phases_batch(jax.random.key(3), MODEL, x, jnp.zeros(6))
    nv = jax.vmap(MODEL.variance)(x)
    fit = gp.fit(x, r, nv, SCENE, num_steps=3)
    return gp.GPPhaseModel.from_fit(fit, x, r, nv, SCENE), (x, r, nv)


@pytest.mark.parametrize(
    "x, match", [(jnp.array([1.0, np.nan, 2.0]), "finite"), (jnp.array([1.0, 1.0, -1.0]), "z > 0")]
)
def test_gp_model_checks_positions(gp_model, x, match):
    model, _ = gp_model
    for fn in (model.mean, model.variance):
        with pytest.raises(ValueError, match=match):
            fn(x)


def test_gp_parameters_are_checked(gp_model):
    _, (x, r, nv) = gp_model
    bad = gp.GPParams.from_natural(1.0, 0.0, 1.0, 1.0)  # ell1_sq = 0
    with pytest.raises(ValueError, match="params"):
        gp.GPPhaseModel.from_data(bad, jnp.zeros(6), x, r, nv, SCENE)
    nan = gp.GPParams(*(jnp.asarray(np.nan) for _ in range(4)))
    with pytest.raises(ValueError, match="init"):
        gp.fit(x, r, nv, SCENE, init=nan)


def test_gp_fit_refuses_a_covariance_too_large_up_front():
    x = jnp.tile(jnp.array([[5.0, 5.0, 2.0]]), (3000, 1))
    r = jnp.zeros((3000, 17))
    with pytest.raises(ValueError, match="GiB"):
        gp.fit(x, r, jnp.ones((3000, 17)), SCENE)


# ----------------------------------------------------------------------------- 7. LM settings


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(damping=np.nan), "damping"),
        (dict(damping=-1.0), "damping"),
        (dict(num_steps=-1), "num_steps"),
        (dict(num_steps=2.5), "num_steps"),
    ],
)
def test_levenberg_marquardt_settings_are_checked(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dj.refine(X + 0.01, R, SCENE, **kwargs)
    with pytest.raises(ValueError, match=match):
        dj.refine_batch((X + 0.01)[None], R[None], SCENE, **kwargs)


def test_coarse_to_fine_checks_its_settings():
    table = estimators.phasor_table(SCENE, estimators.search_grid(SCENE, 0.5, region="ue"))
    with pytest.raises(ValueError, match="num_steps"):
        dj.coarse_to_fine(R, SCENE, table, num_steps=-3)
    grid = estimators.search_grid(SCENE, 0.5, region="ue")
    with pytest.raises(ValueError, match="PhasorTable"):
        dj.coarse_to_fine(R, SCENE, grid)


# ----------------------------------------------------------------------------- 8. Fresnel


def test_fresnel_refuses_unphysical_permittivity():
    for eps in (0.0, 0.5 + 0j, 4.0 + 1.0j, np.nan):
        with pytest.raises(ValueError, match="eps_r"):
            dj.reflection_coefficient(0.5, eps)


def test_fresnel_without_an_interface_is_zero_with_finite_gradient():
    for pol in ("TE", "TM"):
        for c in (0.0, 1e-9, 0.3, 1.0):
            assert abs(complex(dj.reflection_coefficient(c, 1.0 + 0j, pol))) < 1e-12
        g = jax.grad(lambda c, p=pol: jnp.abs(dj.reflection_coefficient(c, 1.0 + 0j, p)) ** 2)(0.0)
        assert np.isfinite(float(g))


# ----------------------------------------------------------------------------- 9. small checks


def test_efim_from_variance_refuses_non_positive_variance():
    with pytest.raises(ValueError, match="variance"):
        dj.efim_from_variance(jnp.zeros(17))


def test_noise_and_sampler_arguments_are_checked():
    with pytest.raises(ValueError, match="noise_figure_db"):
        dj.thermal_noise_power(180e3, noise_figure_db=np.nan)
    with pytest.raises(ValueError, match="height"):
        dj.sample_ap_positions(jax.random.key(0), 4, height=np.nan)


# ----------------------------------------------------------------------------- obscure errors


def test_egs_accepts_a_jax_scalar_spacing():
    out = dj.egs(R, SCENE, SCENE.wavelength * 2, region="ue")
    assert out.x.shape == (1, 3)


def test_efim_and_exact_simulation_accept_a_two_ray_model():
    np.testing.assert_allclose(dj.efim(X, MODEL), dj.efim(X, SCENE))
    a = dj.simulate_phases_exact(jax.random.key(0), MODEL, X, 0.1)
    np.testing.assert_array_equal(a, dj.simulate_phases_exact(jax.random.key(0), SCENE, X, 0.1))


def test_empty_batches_return_empty_results():
    table = estimators.phasor_table(SCENE, estimators.search_grid(SCENE, 0.5, region="ue"))
    empty = jnp.zeros((0, 17))
    assert dj.egs(empty, SCENE, 0.5, region="ue").x.shape == (0, 3)
    assert dj.egs(empty, SCENE, table).x.shape == (0, 3)
    assert dj.coarse_to_fine(empty, SCENE, table).x.shape == (0, 3)


@pytest.mark.parametrize(
    "call, match",
    [
        (
            lambda: dj.window_search(
                R[None], MODEL, X[None], radius=0.2, region=(jnp.ones(3) * 5, jnp.ones(3))
            ),
            "region",
        ),
        (lambda: SCENE.replace(ue_high=jnp.array([9.5, 9.5])), r"ue_high must have shape \(3,\)"),
        (lambda: SCENE.replace(room_size=jnp.array([-10.0, 10.0, 4.0])), "room_size"),
        (lambda: dj.sample_positions(jax.random.key(0), -1, SCENE), "num"),
        (lambda: dj.random_cpos(jax.random.key(0), -1), "num"),
        (lambda: dj.ls_cost(X, jnp.zeros(16), SCENE), r"r must have shape \(17,\)"),
        (lambda: dj.refine(X, R, SCENE, num_steps=2.5), "num_steps"),
    ],
)
def test_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_relative_permittivity_accepts_numpy_scalars():
    a = dj.relative_permittivity("concrete", np.float32(8e8))
    assert a == pytest.approx(dj.relative_permittivity("concrete", 8e8), rel=1e-6)


def test_float32_mode_warns_where_float64_matters():
    code = (
        "import warnings, jax.numpy as jnp, dmimo_jax as dj\n"
        "warnings.simplefilter('error')\n"
        "try:\n    dj.peb(jnp.array([6.5, 5.0, 2.0]), dj.paper_scene())\n"
        "except UserWarning as w:\n    print('warned:', w)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "warned:" in out.stdout and "float64" in out.stdout, out.stdout + out.stderr
