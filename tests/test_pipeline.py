"""The offline/online pipeline (Fig. 1): GP -> safeguard window -> refinement."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import dmimo_jax as dj
from dmimo_jax import gp, pipeline
from dmimo_jax.estimators import phasor_table, refine_batch, search_grid
from dmimo_jax.learning import synthesize
from dmimo_jax.learning.hi import AmbiguityClassifier
from dmimo_jax.learning.mlp import MLPConfig
from dmimo_jax.learning.popt import POPT, POPTConfig
from tests.helpers import xla_optimized

SCENE = dj.paper_scene(-10.0, "concrete")
TRUTH = dj.TwoRayModel(SCENE)


@pytest.fixture(scope="module")
def gp_model():
    key_x, key_cpo, key_n = jax.random.split(jax.random.key(11), 3)
    x = dj.sample_positions(key_x, 50, SCENE)
    r = dj.simulate_phases_batch(key_n, TRUTH, x, dj.random_cpos(key_cpo, 50))
    return pipeline.fit_phase_model(x, r, jax.vmap(TRUTH.variance)(x), SCENE)


@pytest.fixture(scope="module")
def screen(gp_model):
    # the mean-only table: what pipeline.locate builds when no screen is given (the
    # variance table is tested in tests/test_candidates.py and tests/test_bad_input.py)
    with xla_optimized():  # tabulating: run time, not compilation
        return gp.TabulatedGPModel.from_model(gp_model, variance=False)


def _noise_free(num, seed=3):
    x = dj.sample_positions(jax.random.key(seed), num, SCENE)
    cpo = dj.random_cpos(jax.random.key(seed + 1), num)
    r = jax.vmap(lambda xi, c: dj.wrap(TRUTH.mean(xi) + c))(x, cpo)
    return x, r


def _off_by(x, dist, seed=5):
    u = jax.random.normal(jax.random.key(seed), x.shape)
    return x + dist * u / jnp.linalg.norm(u, axis=1, keepdims=True)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_tabulated_gp_mean_matches_the_exact_gp(gp_model, screen):
    x = dj.sample_positions(jax.random.key(0), 200, SCENE)
    d = jax.vmap(screen.mean)(x) - jax.vmap(gp_model.mean)(x)
    assert float(jnp.max(jnp.abs(d))) < 5e-4  # rad, vs sigma_f ~ 0.5 rad
    assert float(jnp.sqrt(jnp.mean(d**2))) < 5e-5


@pytest.mark.slow
def test_online_pipeline_recovers_noise_free_positions_from_10_cm_off(gp_model, screen):
    x, r = _noise_free(16)
    coarse = lambda _: _off_by(x, 0.10)
    out = pipeline.locate(r, coarse, gp_model, screen=screen, radius=0.25)
    np.testing.assert_allclose(out.coarse, _off_by(x, 0.10))
    err = np.linalg.norm(np.asarray(out.fine - x), axis=1)
    assert err.max() < 1e-3, err  # only the GP's modeling error is left


@pytest.mark.slow
def test_the_window_keeps_refinement_in_the_right_basin(gp_model, screen):
    x, r = _noise_free(16, seed=8)
    x0 = _off_by(x, 0.30)
    out = pipeline.locate(r, lambda _: x0, gp_model, screen=screen, radius=0.45)
    assert np.linalg.norm(np.asarray(out.fine - x), axis=1).max() < 1e-3
    # refinement alone from 30 cm off ends in a neighbouring minimum for most snapshots
    # (measured with the analytic model over 64 UEs: 100% right at 10 cm, 64% at 20 cm,
    # 19% at 30 cm, 0% at 50 cm)
    alone = refine_batch(x0, r, gp_model)
    assert np.mean(np.linalg.norm(np.asarray(alone.x - x), axis=1) > 1e-2) > 0.5


@pytest.mark.slow
def test_window_as_wide_as_the_table_is_the_global_search(gp_model, screen):
    x, r = _noise_free(8, seed=21)
    table = phasor_table(screen, search_grid(SCENE, float(SCENE.wavelength) / 4, region="ue"))
    far = _off_by(x, 3.0)
    xs = pipeline.window_search(r, screen, far, radius=10.0, table=table)
    assert np.linalg.norm(np.asarray(xs - x), axis=1).max() < 5e-3
    # the same coarse estimates with a small window cannot reach the truth
    xs_small = pipeline.window_search(r, screen, far, radius=0.3)
    assert np.linalg.norm(np.asarray(xs_small - x), axis=1).min() > 1.0


def test_search_radius_covers_the_validation_errors():
    x, r = _noise_free(32)
    est = lambda _: _off_by(x, 0.2)
    assert pipeline.search_radius(est, r, x) == pytest.approx(0.3)
    assert pipeline.search_radius(lambda _: x, r, x) == pytest.approx(0.1)  # the minimum


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_learned_estimators_plug_into_the_online_stage(gp_model, screen):
    data = synthesize(jax.random.key(0), TRUTH, 4)
    popt = POPT(17, POPTConfig.tiny(), low=SCENE.ue_low, high=SCENE.ue_high, rngs=nnx.Rngs(0))
    x0 = pipeline.coarse_estimate(popt, data.r)
    assert x0.shape == (4, 3) and x0.dtype == jnp.float64
    lam = float(SCENE.wavelength)
    clf = AmbiguityClassifier(
        17,
        MLPConfig.tiny(),
        ap_positions=SCENE.ap_positions,
        wavelength=lam,
        n_max=40,
        rngs=nnx.Rngs(0),
    )
    hi = pipeline.HIEstimator(clf, SCENE)
    assert pipeline.coarse_estimate(hi, data.r).shape == (4, 3)
    out = pipeline.locate(data.r, popt, gp_model, screen=screen, radius=0.1)
    assert out.fine.shape == (4, 3) and bool(jnp.all(jnp.isfinite(out.cost)))


def test_bad_input_is_a_clear_error(screen):
    popt = POPT(17, POPTConfig.tiny(), low=SCENE.ue_low, high=SCENE.ue_high, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="r must have shape"):
        pipeline.coarse_estimate(popt, jnp.zeros((2, 16)))
    with pytest.raises(ValueError, match="non-finite"):
        pipeline.coarse_estimate(popt, jnp.full((2, 17), jnp.nan))
    r = jnp.zeros((2, 17))
    with pytest.raises(ValueError, match="x_coarse"):
        pipeline.window_search(r, screen, jnp.full((2, 3), jnp.nan), radius=0.2)
    with pytest.raises(ValueError, match="radius"):
        pipeline.window_search(r, screen, jnp.ones((2, 3)), radius=0.0)
    with pytest.raises(ValueError, match="kind"):
        pipeline.train_estimator("cnn", None, SCENE)
    with pytest.raises(ValueError, match="GPPhaseModel"):
        gp.TabulatedGPModel.from_model(TRUTH)


def test_a_window_too_wide_without_a_table_is_a_clear_error(screen):
    with pytest.raises(ValueError, match="table="):
        pipeline.window_search(
            jnp.zeros((1, 17)), screen, jnp.ones((1, 3)), radius=75.0, spacing=0.01
        )


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_stored_phase_model_fits_once_then_reloads_the_same_bits(tmp_path, monkeypatch):
    """A resumed run_offline must synthesize from the model it started with: a refit can
    differ in the last bits (GPU reductions), and the synthetic set's fingerprint with it."""
    from dmimo_jax.learning.data import model_fingerprint

    key_x, key_cpo, key_n = jax.random.split(jax.random.key(12), 3)
    x = dj.sample_positions(key_x, 8, SCENE)
    r = dj.simulate_phases_batch(key_n, TRUTH, x, dj.random_cpos(key_cpo, 8))
    nv = jax.vmap(TRUTH.variance)(x)
    path = tmp_path / "gp.npz"
    first = pipeline.stored_phase_model(path, x, r, nv, SCENE, num_restarts=1, num_steps=5)
    assert path.is_file()

    def no_refit(*args, **kwargs):
        raise AssertionError("the stored GP must be loaded, not refitted")

    monkeypatch.setattr(gp, "fit", no_refit)
    again = pipeline.stored_phase_model(path, x, r, nv, SCENE)
    assert model_fingerprint(again) == model_fingerprint(first)
    np.testing.assert_array_equal(again.mean(x[0]), first.mean(x[0]))
    with pytest.raises(ValueError, match="another GP"):  # a file of another deployment
        pipeline.stored_phase_model(path, x[:5], r[:5], nv[:5], SCENE)


def test_the_program_compiler_options_follow_jaxlib_and_change_no_answer():
    """The Locator's program compiles with XLA's elemental CPU emitters on jaxlib < 0.11
    (the option newer jaxlib removed: nothing then), jitted with them a function gives what
    plain ``jax.jit`` gives, called from the host or inside any transformation, and nothing
    global changes."""
    from importlib.metadata import version

    jaxlib = tuple(int(p) for p in version("jaxlib").split(".")[:2])
    expected = {"xla_cpu_use_fusion_emitters": False} if jaxlib < (0, 11) else {}
    assert dict(pipeline.PROGRAM_COMPILER_OPTIONS) == expected
    f = lambda x: jnp.sin(3.0 * x) * jnp.exp(-x)
    x = jnp.linspace(0.0, 2.0, 33)
    pj = pipeline.program_jit(f)
    want = jax.jit(f)(x)
    np.testing.assert_allclose(pj(x), want, rtol=1e-14, atol=1e-15)
    # inside a transformation the plain jit runs (XLA takes options on top-level jits only):
    # a trace closing over concrete arguments, jax.eval_shape, jax.grad, jax.vmap
    np.testing.assert_allclose(jax.jit(lambda: pj(x))(), want, rtol=1e-14, atol=1e-15)
    assert jax.eval_shape(lambda: pj(x)).shape == x.shape
    grad = jax.grad(lambda y: jnp.sum(f(y)))(x)
    np.testing.assert_allclose(jax.grad(lambda y: jnp.sum(pj(y)))(x), grad, rtol=1e-13)
    np.testing.assert_allclose(jax.vmap(pj)(x[:, None]), want[:, None], rtol=1e-14, atol=1e-15)
    assert pj.cache_size() >= 1 or pj.cache_size() == -1
    # lowered and compiled ahead of time (benchmarks/compile_time.py), with the options
    compiled = pj.lower(x).compile()
    np.testing.assert_allclose(compiled(x), want, rtol=1e-14, atol=1e-15)
    with pytest.raises(TypeError):
        pipeline.PROGRAM_COMPILER_OPTIONS["xla_cpu_use_fusion_emitters"] = True  # read-only


def test_jit_cache_size_counts_each_jits_programs_and_says_when_unknown():
    """jit_cache_size: the programs of plain jits and ProgramJits summed (one per shape), -1
    where one of them does not report its cache."""
    f, g = jax.jit(lambda x: x + 1.0), pipeline.program_jit(lambda x: 2.0 * x)
    if getattr(f, "_cache_size", None) is None:
        pytest.skip("this JAX does not report a jit's cache")
    for n in (2, 3):
        f(jnp.zeros(n))
    g(jnp.zeros(4))
    assert pipeline.jit_cache_size(f) == 2
    assert pipeline.jit_cache_size(f, g) == 2 + g.cache_size() and g.cache_size() >= 1
    assert pipeline.jit_cache_size(f, object()) == -1
