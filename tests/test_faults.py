"""Faulty APs: the simulator's fault models (measure.inject_faults), the bound of the APs left
(bounds.subset_peb), fault exclusion (estimators.faults) and the Locator with it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import bounds, estimators
from dmimo_jax.measure import FAULT_KINDS, inject_faults
from tests.helpers import LOCATOR_BATCH as BATCH
from tests.helpers import LOCATOR_SHARED as SHARED
from tests.helpers import assert_rate_at_least
from tests.test_offline_online import MODEL, SCENE, _labeled, _offline


def test_subset_peb_is_the_bound_of_the_deployment_without_those_aps():
    """Excluding APs equals removing their rows and columns of the EFIM: the PEB of the
    scene with only the other APs."""
    x = jnp.asarray([4.0, 5.0, 1.5])
    mask = np.zeros(17, bool)
    mask[[2, 9, 11]] = True
    keep = ~mask
    sub = SCENE.replace(
        ap_positions=SCENE.ap_positions[keep], ap_phase_offsets=SCENE.ap_phase_offsets[keep]
    )
    expected = float(dj.peb(x, dj.TwoRayModel(sub)))
    got = float(bounds.subset_peb(x, MODEL, mask))
    assert got == pytest.approx(expected, rel=1e-9)
    assert float(bounds.subset_peb(x, MODEL, np.zeros(17, bool))) == pytest.approx(
        float(dj.peb(x, MODEL)), rel=1e-12
    )
    assert got > float(dj.peb(x, MODEL))  # fewer APs, a larger bound
    few = np.ones(17, bool)
    few[:3] = False
    assert float(bounds.subset_peb(x, MODEL, few)) == np.inf  # 3 APs cannot fix x and a CPO
    with pytest.raises(ValueError, match=r"excluded must be a bool mask of shape \(17,\)"):
        bounds.subset_peb(x, MODEL, np.zeros(16, bool))


def test_a_move_to_more_aps_is_chi_square_in_the_information_of_fewer():
    """Two linearized estimates at one position (eq. 14 with the CPO eliminated), from the
    K = 9 APs not excluded and from all 17, differ by N(0, F_K^-1 - F^-1): the statistic of
    their move in F_K averages 3 - tr(F^-1 F_K) and exceeds the chi-square (3 dof)
    quantile of a risk at most at that risk. The quantile is scipy's; a bad risk is
    refused by name."""
    from scipy.stats import chi2

    for risk in (0.5, 1e-3, 1e-12):
        assert bounds.position_chi2_quantile(risk) == pytest.approx(chi2.isf(risk, 3), rel=1e-12)
    for bad in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="risk must be a probability"):
            bounds.position_chi2_quantile(bad)
    x = jnp.asarray([4.0, 5.0, 1.5])
    _, h, variance = (np.asarray(a) for a in bounds.linearize(x, MODEL))
    excluded = np.arange(17) >= 9
    w_all = 1.0 / variance
    w_k = np.where(excluded, 0.0, w_all)

    def estimate(w, e):  # the weighted LS step with a common offset eliminated
        p = np.diag(w) - np.outer(w, w) / w.sum()
        f = h.T @ p @ h
        return np.linalg.solve(f, h.T @ p @ e.T).T, f

    e = np.random.default_rng(0).normal(size=(20_000, 17)) * np.sqrt(variance)
    dx_k, f_k = estimate(w_k, e)
    dx_all, f_all = estimate(w_all, e)
    d = dx_all - dx_k
    stat = np.einsum("ni,ij,nj->n", d, f_k, d)
    expected = 3.0 - np.trace(np.linalg.solve(f_all, f_k))
    assert 0.2 < expected < 2.9  # the extra APs add information, not all of it
    assert np.mean(stat) == pytest.approx(expected, rel=0.03)
    for risk in (0.1, 0.01):
        assert np.mean(stat > bounds.position_chi2_quantile(risk)) <= risk
    got = bounds.move_statistic_unchecked(x, x + jnp.asarray(d[0]), MODEL, jnp.asarray(excluded))
    assert float(got) == pytest.approx(stat[0], rel=1e-9)


def test_protection_level_bounds_the_error_at_its_risk():
    """The MLE of 2,000 snapshots from the truth, with APs 2 and 9 left out: the error exceeds
    the protection level at risk 0.05 in at most 5% of them (plus three binomial standard
    deviations); leaving APs out widens it; a large ML cost widens it by sqrt(cost / dof);
    bad risks and costs are refused."""
    num, risk = 2000, 0.05
    mask = np.zeros(17, bool)
    mask[[2, 9]] = True
    x, r, _ = _labeled(num=num, seed=21)
    fit = jax.vmap(
        lambda xi, ri: estimators.mle.refine_excluding(xi, ri, MODEL, jnp.asarray(mask), 5)
    )(x, r)
    err = np.linalg.norm(np.asarray(fit.x) - np.asarray(x), axis=1)
    level = np.asarray(
        jax.vmap(lambda xi: bounds.protection_level_unchecked(xi, MODEL, jnp.asarray(mask), risk))(
            fit.x
        )
    )
    assert np.mean(err > level) <= risk + 3 * np.sqrt(risk * (1 - risk) / num)
    assert np.mean(err > 0.5 * level) > 0.01  # not vacuous: half of it is exceeded
    x0 = x[0]
    none = float(bounds.protection_level(x0, MODEL, np.zeros(17, bool), risk))
    assert float(bounds.protection_level(x0, MODEL, mask, risk)) > none
    dof = 17 - 2 - 4
    assert float(bounds.protection_level(x0, MODEL, mask, risk, cost=4.0 * dof)) == pytest.approx(
        2 * float(bounds.protection_level(x0, MODEL, mask, risk)), rel=1e-9
    )
    for bad in (0.0, 1.0, float("nan")):
        with pytest.raises(ValueError, match="risk must be a probability"):
            bounds.protection_level(x0, MODEL, mask, bad)
    with pytest.raises(ValueError, match="cost must be >= 0"):
        bounds.protection_level(x0, MODEL, mask, risk, cost=-1.0)


def test_fault_models_change_only_the_faulty_entries():
    x, r, _ = _labeled(num=6)
    mask = np.zeros((6, 17), bool)
    mask[:, 4] = True
    for kind in FAULT_KINDS:
        rf = np.asarray(inject_faults(jax.random.key(0), r, jnp.asarray(mask), kind))
        np.testing.assert_array_equal(rf[~mask], np.asarray(r)[~mask])
        assert np.all(np.abs(rf) <= np.pi) and np.all(rf[mask] != np.asarray(r)[mask])
    stuck = np.asarray(inject_faults(jax.random.key(0), r, jnp.asarray(mask[0]), "stuck"))
    assert np.ptp(stuck[:, 4]) == 0  # a stale value, held
    jump = np.asarray(inject_faults(jax.random.key(0), r, jnp.asarray(mask[0]), "jump"))
    step = np.angle(np.exp(1j * (jump[:, 4] - np.asarray(r)[:, 4])))
    assert np.ptp(step) < 1e-12 and np.pi / 2 <= abs(step[0]) <= np.pi
    with pytest.raises(ValueError, match="kind must be one of"):
        inject_faults(jax.random.key(0), r, jnp.asarray(mask), "dead")
    with pytest.raises(ValueError, match="faulty must be a bool mask"):
        inject_faults(jax.random.key(0), r, jnp.asarray(mask[:, :16]), "random")


def test_exclusion_from_the_right_lobe_names_the_faulty_aps():
    """Two APs with an offset jump: the answer of every AP fails the gate by orders of
    magnitude; the exclusion leaves out exactly those two and the re-fit is back within
    micrometres."""
    x, r, _ = _labeled(num=8, seed=3)
    faulty = np.zeros(17, bool)
    faulty[[3, 12]] = True
    rf = inject_faults(jax.random.key(1), r, jnp.asarray(faulty), "jump")
    fine = estimators.mle.refine_batch_unchecked(jnp.asarray(x), rf, MODEL, 10)
    assert np.all(np.asarray(fine.cost) > 1e4 * 13)
    out = jax.vmap(lambda ri, fi: estimators.exclude_faults(ri, fi, MODEL, 100.0, 3, 10))(rf, fine)
    assert np.all(np.asarray(out.passed))
    np.testing.assert_array_equal(np.asarray(out.excluded), np.broadcast_to(faulty, (8, 17)))
    err = np.linalg.norm(np.asarray(out.fine.x) - np.asarray(x), axis=1)
    assert np.all(err < 1e-3)
    # an answer under the gate is left as it was
    clean = estimators.mle.refine_batch_unchecked(jnp.asarray(x), r, MODEL, 10)
    same = jax.vmap(lambda ri, fi: estimators.exclude_faults(ri, fi, MODEL, 100.0, 3, 10))(r, clean)
    assert not np.any(np.asarray(same.excluded))
    np.testing.assert_array_equal(np.asarray(same.fine.x), np.asarray(clean.x))


def _trimmed_reference(rows, r, drop, iterations=2):
    """trimmed_coherence's contract in plain NumPy, one (row, snapshot) at a time: the
    ``drop`` least shares (a stable sort: equal shares in AP order) out, the direction again
    from the rest, ``iterations`` times; the score and the APs dropped."""
    m = r.shape[-1]
    score = np.zeros(rows.shape[:2])
    dropped = np.zeros((*rows.shape[:2], m), bool)
    for b in range(rows.shape[0]):
        for n in range(rows.shape[1]):
            z = np.exp(1j * r[b]) * (rows[b, n, :m] - 1j * rows[b, n, m:])
            keep = np.ones(m, bool)
            for _ in range(iterations):
                u = z[keep].sum()
                share = (z * np.conj(u)).real / max(abs(u), 1e-30)
                worst = np.argsort(share, kind="stable")[:drop]
                keep = share > share[worst[-1]]
            score[b, n] = (share.sum() - share[worst].sum()) / (m - drop)
            dropped[b, n, worst] = True
    return score, dropped


@pytest.mark.parametrize("drop", [1, 3])
def test_trimmed_coherence_is_its_contract_in_numpy(drop):
    """The trimmed coherence and the APs it drops equal a NumPy reading of its docstring
    (float64 throughout, to 1e-12), on random phasor rows and on rows whose APs share one
    phase (every share equal: which APs drop is decided by their order alone)."""
    rng = np.random.default_rng(7)
    m = 9
    theta = rng.uniform(-np.pi, np.pi, (2, 12, m))
    theta[1, :4] = 0.3  # every AP the same phase: all shares tie
    rows = np.concatenate([np.cos(theta), np.sin(theta)], -1)
    r = rng.uniform(-np.pi, np.pi, (2, m))
    r[1] = 0.0
    got, gone = estimators.faults.trimmed_coherence(
        jnp.asarray(rows), jnp.asarray(r), drop, with_dropped=True
    )
    want, want_gone = _trimmed_reference(rows, r, drop)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(np.asarray(gone), want_gone)


def test_trimmed_coherence_leaves_the_faulty_aps_out():
    """At the true phases with three APs' phases replaced by random ones, the coherence with
    three APs dropped is 1 (to float32) while the plain one falls to about (14/17)^2; a wrong
    grid point stays below; with nothing faulty both are 1; dropping never lowers it."""
    rng = np.random.default_rng(4)
    m, n = 17, 64
    theta = rng.uniform(-np.pi, np.pi, (n, m))
    rows = jnp.asarray(np.concatenate([np.cos(theta), np.sin(theta)], 1), jnp.float32)
    r = theta[0] + 0.7  # row 0 is the truth, with a common phase offset
    faulty = r.copy()
    faulty[[2, 7, 11]] = rng.uniform(-np.pi, np.pi, 3)
    both = jnp.asarray(np.stack([r, faulty]))
    trimmed = np.asarray(estimators.faults.trimmed_coherence(jnp.stack([rows, rows]), both, 3))
    z = np.exp(1j * (np.stack([r, faulty])[:, None, :] - theta[None]))
    plain = np.abs(z.sum(-1)) ** 2 / m**2
    np.testing.assert_allclose(trimmed[:, 0], 1.0, atol=1e-6)
    assert plain[1, 0] < 0.9 and plain[0, 0] == pytest.approx(1.0)
    assert np.all(trimmed[:, 1:] < 0.9)  # random rows: wrong positions
    assert np.all(trimmed >= np.sqrt(plain) - 1e-6)  # the share of the best 14 >= the mean's


def test_a_healthy_ap_dropped_by_the_trimming_rejoins():
    """Two APs with an offset jump and one healthy AP among the three suspects a trimmed
    start dropped: fitted without the three from a start 3 cm off, the healthy one rejoins
    and exactly the two faulty ones stay out; the re-fit with them out is back within a
    millimetre of the truth and passes the gate."""
    x, r, _ = _labeled(num=8, seed=3)
    faulty = np.zeros(17, bool)
    faulty[[3, 12]] = True
    rf = inject_faults(jax.random.key(1), r, jnp.asarray(faulty), "jump")
    suspects = jnp.asarray(faulty).at[8].set(True)
    refit = jax.vmap(lambda xi, ri, out: estimators.mle.refine_excluding(xi, ri, MODEL, out, 10))
    fit = refit(x + 0.03, rf, jnp.broadcast_to(suspects, (8, 17)))
    out = jax.vmap(lambda xi, ri: estimators.faults.still_out(xi, ri, MODEL, suspects, 100.0))(
        fit.x, rf
    )
    np.testing.assert_array_equal(np.asarray(out), np.broadcast_to(faulty, (8, 17)))
    again = refit(fit.x, rf, out)
    assert np.all(np.linalg.norm(np.asarray(again.x) - np.asarray(x), axis=1) < 1e-3)
    assert np.all(np.asarray(again.cost) < 100.0 * (17 - 2 - 4))


@pytest.fixture(scope="module")
def locator(tmp_path_factory):
    # the settings and batch size of tests/test_locator.py: one program, compiled once
    return dj.Locator.from_offline(
        _offline(tmp_path_factory.mktemp("cache"), kinds=("cells",)), "cells", **SHARED
    )


@pytest.mark.slow  # two compiles of the program (the slow tests' own, so cached for them)
def test_without_faults_the_locator_is_unchanged(locator):
    _, r, _ = _labeled(num=BATCH, seed=5)
    out = locator(r)
    off = locator.replace(max_excluded=0)(r)
    assert not np.any(np.asarray(out.excluded)) and out.excluded.shape == (BATCH, 17)
    np.testing.assert_allclose(np.asarray(out.x), np.asarray(off.x), atol=1e-9, rtol=0)
    with pytest.raises(ValueError, match="max_excluded"):
        locator.replace(max_excluded=13)


@pytest.mark.slow  # compiles the exclusion paths of the program for each fault model
@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_model_is_detected_and_excluded(locator, kind):
    """One faulty AP of 17 on 16 snapshots: every answer is either within a millimetre
    with the faulty AP excluded or rejected (flagged), never a confident wrong answer;
    found at a rate of at least 0.98 (within its sampling error over 16: tests.helpers)."""
    x, r, _ = _labeled(num=BATCH, seed=7)
    faulty = np.zeros((BATCH, 17), bool)
    faulty[np.arange(BATCH), np.random.default_rng(0).integers(0, 17, BATCH)] = True
    if kind in ("stuck", "jump"):
        faulty[:] = False
        faulty[:, 6] = True
    out = locator(inject_faults(jax.random.key(2), r, jnp.asarray(faulty), kind))
    err = np.linalg.norm(np.asarray(out.x) - np.asarray(x), axis=1)
    found = np.all(np.asarray(out.excluded) >= faulty, axis=1) & (err < 1e-3)
    rejected = np.asarray(out.rejected)
    assert np.all(found | rejected)
    assert_rate_at_least(found.sum(), found.size, 0.98, what="found")


@pytest.mark.slow  # runs the exclusion paths of the program (compiled by the test above)
@pytest.mark.parametrize("kind", ["jump", "blocked"])
def test_three_faulty_aps_are_found_through_the_trimmed_screen(locator, kind):
    """Three faulty APs of 17 on 16 snapshots (the same three with offset jumps; three drawn
    per snapshot when blocked): the whole-region screen's trimmed starts find them, so at
    least 0.98 of the answers (within the sampling error over 16) leave out every faulty AP
    and are within a millimetre, and the
    rest are flagged, never kept wrong. (This small world's plain screen finds most of them
    too; the paper-scale world where it does not is benchmarks/fault_tolerance.py's.)"""
    x, r, _ = _labeled(num=BATCH, seed=9)
    rng = np.random.default_rng(1)
    faulty = np.zeros((BATCH, 17), bool)
    if kind == "jump":
        faulty[:, [2, 9, 14]] = True
    else:
        for row in faulty:
            row[rng.choice(17, 3, replace=False)] = True
    out = locator(inject_faults(jax.random.key(3), r, jnp.asarray(faulty), kind))
    err = np.linalg.norm(np.asarray(out.x) - np.asarray(x), axis=1)
    found = np.all(np.asarray(out.excluded) >= faulty, axis=1) & (err < 1e-3)
    assert np.all(found | np.asarray(out.rejected))
    assert_rate_at_least(found.sum(), found.size, 0.98, what="found")


@pytest.mark.slow  # compiles the exclusion paths of the program
def test_an_offset_jump_is_healed_from_sixteen_snapshots(locator):
    """AP 6's phase jumps by 2 rad: the Locator excludes it in every snapshot; heal()
    estimates the jump from those 16 answers (to well within its standard error's scale)
    and corrects it, after which AP 6 rejoins and the errors on new snapshots with the same
    jump equal the fault-free ones; a dead AP (random phases) is reported, not healed."""
    faulty = np.zeros(17, bool)
    faulty[6] = True
    jump = jnp.where(jnp.asarray(faulty), 2.0, 0.0)
    x, r, _ = _labeled(num=BATCH, seed=11)
    out = locator(inject_faults(jax.random.key(0), r, jnp.asarray(faulty), "jump", jump=jump))
    assert np.all(np.asarray(out.excluded)[:, 6] | np.asarray(out.rejected))
    healed, report = locator.heal(
        inject_faults(jax.random.key(0), r, jnp.asarray(faulty), "jump", jump=jump), out
    )
    assert bool(report.healed[6]) and int(np.sum(report.healed)) == 1
    assert abs(float(report.offsets[6]) - 2.0) < 1e-3 and float(report.stderr[6]) < 1e-3
    x2, r2, _ = _labeled(num=BATCH, seed=12)
    after = healed(inject_faults(jax.random.key(1), r2, jnp.asarray(faulty), "jump", jump=jump))
    clean = locator(r2)
    assert not np.any(np.asarray(after.excluded))
    e_after = np.linalg.norm(np.asarray(after.x) - np.asarray(x2), axis=1)
    e_clean = np.linalg.norm(np.asarray(clean.x) - np.asarray(x2), axis=1)
    assert np.sqrt(np.mean(e_after**2)) <= 1.05 * np.sqrt(np.mean(e_clean**2))
    dead = inject_faults(jax.random.key(2), r, jnp.asarray(faulty), "random")
    _, report = locator.heal(dead, locator(dead))
    assert bool(report.dead[6]) and not np.any(np.asarray(report.healed))
    with pytest.raises(ValueError, match="min_coherence"):
        locator.heal(r, out, min_coherence=0.0)
