"""dmimo_jax.estimators.exact: the exact MLE as one program equals EGS + refinement."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import estimators as est

SCENE = dj.paper_scene(-10.0, convention="itu").replace(
    ue_low=jnp.array([5.0, 5.0, 1.5]), ue_high=jnp.array([5.6, 5.6, 1.9])
)
MODEL = dj.TwoRayModel(SCENE)


@pytest.fixture(scope="module")
def table():
    return est.phasor_table(MODEL, est.search_grid(SCENE, float(SCENE.wavelength) / 4, "ue"))


def _snapshots(num, seed):
    k_x, k_c, k_n = jax.random.split(jax.random.key(seed), 3)
    x = dj.sample_positions(k_x, num, SCENE)
    return x, dj.simulate_phases_batch(k_n, MODEL, x, dj.random_cpos(k_c, num))


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_one_program_equals_egs_then_refine(table):
    x, r = _snapshots(6, 0)
    out = est.exact_mle(r, MODEL, table)
    coarse = est.egs(r, MODEL, table)
    fine = dj.refine_batch(coarse.x, r, MODEL)
    np.testing.assert_allclose(np.asarray(out.coarse), np.asarray(coarse.x), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.asarray(out.x), np.asarray(fine.x), rtol=0, atol=1e-9)
    assert float(np.max(np.linalg.norm(np.asarray(out.x) - np.asarray(x), axis=1))) < 1e-3
    assert not bool(jnp.any(out.rejected)) and not bool(jnp.any(out.overflow))
    one = est.exact_mle(r[2], MODEL, table)
    assert one.x.shape == (3,) and float(jnp.max(jnp.abs(one.x - out.x[2]))) < 1e-9


def test_bad_input_is_refused(table):
    _, r = _snapshots(2, 1)
    with pytest.raises(ValueError, match="r must"):
        est.exact_mle(r[:, :16], MODEL, table)
    with pytest.raises(ValueError, match="capacity must be a fraction"):
        est.exact_mle(r, MODEL, table, capacity=3.0)
    with pytest.raises(ValueError, match="at least one snapshot"):
        est.exact_mle(np.zeros((0, 17)), MODEL, table)
