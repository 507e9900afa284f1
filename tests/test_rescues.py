"""dmimo_jax.pipeline.rescues: the cost gate as a loop of rescues, the outcome as one status,
the integrity rules (never more than max_excluded APs out, never an answer without a
redundant AP), and the Locator's batch buckets (any batch runs one of a few programs)."""

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dmimo_jax as dj
from dmimo_jax import pipeline
from dmimo_jax.estimators import RefineResult
from dmimo_jax.pipeline.gate import run_gate
from dmimo_jax.pipeline.rescues import Answer, GateState, Rescue, Status, final_status
from tests.helpers import LOCATOR_SHARED as SHARED
from tests.test_offline_online import _labeled, _offline


@pytest.fixture(scope="module")
def loc(tmp_path_factory):
    off = _offline(tmp_path_factory.mktemp("cache"), kinds=("cells",))
    return pipeline.Locator.from_offline(off, "cells", **SHARED)


def _state(loc, x, cost, excluded, pending):
    b = x.shape[0]
    fine = RefineResult(x, jnp.zeros(b), cost, jnp.zeros(b, jnp.int32))
    answer = Answer(x, fine, excluded)
    zeros = jnp.zeros(b, jnp.int32)
    return GateState(answer, pending, jnp.zeros(b, bool), zeros, jnp.int32(b))


def test_final_status_names_each_outcome(loc):
    """Rejected where still pending, overflow where a rescue had no room, unverified where
    fewer than one redundant AP is left or more APs are out than the noise-fit bound allows
    (10 of 17: three redundant, yet noise fits), else the status the gate gave."""
    x = jnp.zeros((5, 3)) + 5.0
    excluded = jnp.zeros((5, 17), bool).at[3, :13].set(True)  # 4 APs left: no redundancy
    excluded = excluded.at[4, :10].set(True).at[0, :2].set(True)
    pending = jnp.array([False, True, False, False, False])
    state = _state(loc, x, jnp.ones(5), excluded, pending)
    status = [Status.EXCLUDED, Status.LOCATED, Status.OVERFLOW, Status.LOCATED, Status.EXCLUDED]
    state = state._replace(status=jnp.array(status, jnp.int32))
    got = [Status(int(v)) for v in final_status(loc, state)]
    want = [Status.EXCLUDED, Status.REJECTED, Status.OVERFLOW, Status.UNVERIFIED]
    assert got == [*want, Status.UNVERIFIED]


@dataclasses.dataclass(frozen=True)
class MoveToOrigin(Rescue):
    """A rescue defined here, not in the package: the gate runs it without an edit."""

    status = Status.RECOVERED

    def takes(self, loc, state):
        return jnp.ones_like(state.pending)

    def run(self, loc, r, answer):
        fine = answer.fine._replace(x=jnp.zeros_like(answer.fine.x), cost=jnp.zeros_like(r[:, 0]))
        return answer._replace(fine=fine)


def test_a_new_rescue_is_one_object(loc):
    custom = loc.replace(rescues=(MoveToOrigin(),))
    x = jnp.ones((3, 3))
    state = _state(
        custom, x, jnp.full(3, 1e9), jnp.zeros((3, 17), bool), jnp.array([1, 0, 1], bool)
    )
    r = jnp.zeros((3, 17))
    out = jax.jit(run_gate, static_argnums=3)(custom, r, state, 2)
    np.testing.assert_array_equal(np.asarray(out.answer.fine.x[:, 0]), [0.0, 1.0, 0.0])
    np.testing.assert_array_equal(np.asarray(out.status), [Status.RECOVERED, 0, Status.RECOVERED])
    assert not bool(jnp.any(out.pending))
    with pytest.raises(ValueError, match="rescues must be"):
        loc.replace(rescues=(object(),))
    with pytest.raises(ValueError, match=r"rescues must not repeat a rescue, got MoveToOrigin"):
        loc.replace(rescues=(MoveToOrigin(), *loc.settings.rescues, MoveToOrigin()))


@pytest.mark.newest  # the Locator's program, every status (CI's newest leg)
def test_the_program_gives_a_status_per_row_and_the_booleans_are_its_views(loc):
    """Fault-free rows are accepted; an offset jump on one AP is left out, that AP alone;
    random phases on every AP are rejected."""
    x, r, _ = _labeled(8, seed=11)
    clean = np.asarray(loc(r).status)
    assert np.all(clean <= Status.RECOVERED)  # every fault-free row accepted
    i, j = np.flatnonzero(clean == Status.LOCATED)[:2]  # rows whose first answer passes
    r = np.array(r)
    r[i, 6] = np.angle(np.exp(1j * (r[i, 6] + 2.0)))  # a jump on AP 6
    r[j] = np.random.default_rng(0).uniform(-np.pi, np.pi, 17)  # no AP agrees
    out = loc(r)
    status = np.asarray(out.status)
    # left out from the first answer (excluded) or by the whole-region search (recovered)
    assert status[i] in (Status.EXCLUDED, Status.RECOVERED)
    assert bool(out.excluded[i, 6]) and int(out.excluded[i].sum()) == 1
    assert status[j] == Status.REJECTED and bool(out.rejected[j]) and not bool(out.accepted[j])
    err = np.linalg.norm(np.asarray(out.x) - np.asarray(x), axis=1)
    assert np.all(err[np.asarray(out.accepted)] < 1e-3)
    np.testing.assert_array_equal(np.asarray(out.rejected), status == Status.REJECTED)
    np.testing.assert_array_equal(
        np.asarray(out.fallback), np.asarray(out.unsure) | (status == Status.RECOVERED)
    )


def _largest_allowed(loc):
    """The most exclusions the test world's noise-fit bound allows at fit_risk 1e-3."""
    return loc.settings.most_excluded


def test_max_excluded_that_lets_noise_pass_is_refused(loc):
    """The noise-fit bound (bounds.noise_fit_probability) decides how many APs may be left
    out: the largest value it allows is accepted, one more is refused naming the bound, and
    M - 4 (no redundant AP) never passes; the default stays 3 where the bound allows it."""
    top = _largest_allowed(loc)
    assert 3 <= top < 17 - 5  # 17 APs at the test world's power: some, not all
    assert loc.settings.noise_fit[12] > 0.5  # one redundant AP left: noise fits somewhere
    assert loc.settings.max_excluded == 3
    assert loc.replace(max_excluded=top).settings.max_excluded == top
    for bad in (top + 1, 12, 13):
        with pytest.raises(ValueError, match="max_excluded"):
            loc.replace(max_excluded=bad)
    # a higher risk allows more, never beyond M - 5
    wider = loc.replace(fit_risk=0.5)
    assert _largest_allowed(wider) >= top


@pytest.mark.slow  # two more programs (max_excluded at the bound, and 1)
def test_never_more_exclusions_than_allowed_nor_an_answer_without_redundancy(loc):
    """Random phases on every AP with max_excluded at the largest the bound allows: no row
    leaves out more, and none is accepted; random phases on two APs with max_excluded=1:
    at most one out."""
    top = _largest_allowed(loc)
    noise = jnp.asarray(np.random.default_rng(1).uniform(-np.pi, np.pi, (16, 17)))
    out = loc.replace(max_excluded=top)(noise)
    k = np.asarray(out.excluded).sum(axis=1)
    assert k.max() <= top
    assert not np.any(np.asarray(out.accepted))
    x, r, _ = _labeled(16, seed=12)
    r = np.array(r)
    r[:, [3, 9]] = np.random.default_rng(2).uniform(-np.pi, np.pi, (16, 2))
    one = loc.replace(max_excluded=1)(r)
    assert int(np.asarray(one.excluded).sum(axis=1).max()) <= 1


@pytest.mark.slow  # five programs: the unpadded one and the buckets 1, 4, 16, 64
def test_any_batch_runs_one_of_the_buckets_and_gives_each_rows_answer(loc):
    """Batches of 1 to 20 rows: each row's answer equals the unpadded program's (one batch
    of 20, run by jax.jit without the buckets), and at most the buckets up to 64 compile
    (no row overflows, so no re-run)."""
    _, r, _ = _labeled(20, seed=13)
    want = jax.jit(lambda lo, rr: lo.program(rr, 20))(loc, r)
    before = pipeline.Locator.compiled_programs()
    for n in (1, 2, 3, 5, 8, 13, 16, 17, 20):
        got = loc(r[:n])
        assert float(jnp.max(jnp.abs(got.x - want.x[:n]))) < 1e-9
        np.testing.assert_array_equal(np.asarray(got.status), np.asarray(want.status[:n]))
    if before >= 0:
        assert pipeline.Locator.compiled_programs() - before <= 4  # buckets 1, 4, 16, 64
    assert pipeline.bucket_for(5) == 16 and pipeline.BUCKETS[-1] == 4096


def test_a_new_batch_size_compiles_its_padding_and_unpadding_alone(loc, caplog):
    """Batches of 6 and 7 device rows after one of 5 (all of bucket 16): the Locator's
    program is not compiled again, and each new size compiles at most two small programs
    (its padding and its results' first rows, each one program whatever the leaves), not
    an eager slice per leaf and operation (20 for the two before)."""
    _, r, _ = _labeled(7, seed=21)
    r = jax.device_put(r)
    rows = jax.block_until_ready([r[:6], r[:7]])  # sliced before counting
    loc(r[:5])
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        got = [loc(rr) for rr in rows]
    compiled = [m for m in caplog.messages if m.startswith("Finished XLA compilation")]
    assert len(compiled) <= 4, compiled
    assert not [m for m in compiled if "jit(program)" in m], compiled
    np.testing.assert_array_equal(np.asarray(got[1].x[:6]), np.asarray(got[0].x))
    assert got[0].x.shape == (6, 3) and got[1].status.shape == (7,)


def test_a_batch_over_the_largest_bucket_is_cut_and_joined_by_one_program(caplog):
    """Parts of a batch over the largest size (here sizes (2, 4): 9 rows run 4 + 4 + 1,
    10 rows 4 + 4 + 2): each new size compiles one program that cuts and joins every leaf
    (a slice and a concatenation per leaf before: 4 leaves, 5 programs), and the rows are
    the unpadded ones in order."""
    from dmimo_jax.pipeline.batches import run_in_buckets

    def run(padded, n):  # a result of four leaves, row i holding r's row i
        p = jnp.asarray(padded)
        return {"a": p, "b": p[:, 0], "c": p.sum(1), "d": p[:, :2] > 0}

    r = np.arange(30.0).reshape(10, 3)
    run_in_buckets(run, r[:9], (2, 4))  # the run's own programs compiled first
    run_in_buckets(run, r[:10], (2, 4))
    with jax.log_compiles(True), caplog.at_level(logging.WARNING):
        got = [run_in_buckets(run, r[:n], (2, 4)) for n in (5, 6, 7)]
    compiled = [m for m in caplog.messages if m.startswith("Finished XLA compilation")]
    assert len(compiled) <= 3, compiled  # 5: (4, 1), 6: (4, 2), 7: (4, 3), one each
    for n, out in zip((5, 6, 7), got, strict=True):
        want = run(r[:n], n)
        for key in want:
            np.testing.assert_array_equal(np.asarray(out[key]), np.asarray(want[key]))


def test_locator_entry_points_refuse_bad_input_by_name(loc):
    """Snapshots that are not phases (bool, str), a table that is not this Locator's,
    batch_sizes and devices that are not what they say: a ValueError naming the argument.
    An empty batch is the empty result under the call, jax.jit and jax.vmap alike."""
    from dmimo_jax.estimators import phasor_table, search_grid

    for bad in (np.zeros((2, 17), bool), np.full((2, 17), "a")):
        with pytest.raises(ValueError, match="r must be real wrapped phases"):
            loc(bad)
    for table in (None, "x"):
        with pytest.raises(ValueError, match="table must be a PhasorTable"):
            loc.with_table(table)
    scene16 = loc.screen_model.scene
    scene16 = scene16.replace(
        ap_positions=np.asarray(scene16.ap_positions)[:16],
        ap_phase_offsets=np.asarray(scene16.ap_phase_offsets)[:16],
    )
    other = phasor_table(dj.TwoRayModel(scene16), search_grid(scene16, 0.5))
    with pytest.raises(ValueError, match="table must tabulate this Locator's 17 APs"):
        loc.with_table(other)
    with pytest.raises(ValueError, match="batch_sizes must be a tuple of positive ints"):
        pipeline.export_locator(loc, "unused", batch_sizes=5)
    for devices in ("cpu", [], [jax.devices()[0]] * 2):
        with pytest.raises(ValueError, match="devices must"):
            pipeline.sharded(loc, devices=devices)
    empty = jnp.zeros((0, 17))
    for out in (loc(empty), jax.jit(loc)(empty), jax.vmap(loc)(empty)):
        assert out.x.shape == (0, 3) and out.status.shape == (0,)
    # stage by stage: a NaN start was refined into a NaN answer, silently, and certify
    # took any shape of screened
    x, r, _ = _labeled(2, seed=3)
    nan = np.where(np.arange(2)[:, None] == 1, np.nan, np.asarray(x))
    with pytest.raises(ValueError, match="screened must be finite"):
        loc.fine_stage(r, nan)
    zeros = jnp.zeros(2)  # refused before any program runs: none compiled here
    fine = RefineResult(jnp.asarray(x), zeros, zeros, jnp.zeros(2, jnp.int32))
    with pytest.raises(ValueError, match="screened must be finite"):
        loc.certify(r, nan, fine)
    with pytest.raises(ValueError, match=r"screened must have shape \(2, 3\)"):
        loc.certify(r, x[:1], fine)
    with pytest.raises(ValueError, match="fine must be fine_stage's RefineResult"):
        loc.certify(r, x, fine.x)


def test_the_batch_helpers_refuse_what_is_no_row_count_or_no_ascending_sizes():
    """Each of these was accepted (a count of -1 or 1.5 given a bucket, a negative head cut
    rows from the end, sizes out of order padded 5 rows to parts of 4 and 16) or raised an
    obscure error (an IndexError, max() of an empty sequence)."""
    from dmimo_jax.pipeline.batches import head_rows, padded_parts

    for n in (-1, 1.5, True):
        with pytest.raises(ValueError, match="n must be an int >= 0"):
            pipeline.bucket_for(n)
        with pytest.raises(ValueError, match="n must be an int >= 0"):
            pipeline.snug_parts(n)
    with pytest.raises(ValueError, match="n must be an int >= 0"):
        head_rows({"a": jnp.zeros(4)}, -1)
    for sizes in ((16, 4), (), (0, 4), (4, 4), (1.0, 4), 4):
        with pytest.raises(ValueError, match="sizes must be"):
            padded_parts(np.zeros((5, 3)), sizes)
        with pytest.raises(ValueError, match="sizes must be"):
            pipeline.bucket_for(3, sizes)
    # a rest below the smallest size is one part, padded to that size
    assert pipeline.snug_parts(2, (4, 16)) == [2]
    assert [(n, p.shape[0]) for n, p in padded_parts(np.zeros((2, 3)), (4, 16))] == [(2, 4)]
    assert pipeline.snug_parts(0) == [] and pipeline.bucket_for(0) == 1


@pytest.mark.slow  # exports the batch-4 program
def test_a_damaged_export_is_refused_naming_its_file(loc, tmp_path):
    pipeline.export_locator(loc, tmp_path, batch_sizes=(4,))
    loaded = pipeline.load_locator(tmp_path)
    assert loaded(np.zeros((0, 17))).x.shape == (0, 3)  # as the Locator's own call
    # a batch padded to the program's 4 rows: its own 3 rows back, the Locator's answers
    _, r, _ = _labeled(3, seed=22)
    got, want = loaded(r), loc(r)
    assert got.x.shape == (3, 3) and got.status.shape == (3,)
    np.testing.assert_allclose(np.asarray(got.x), np.asarray(want.x), rtol=0, atol=1e-9)
    np.testing.assert_array_equal(np.asarray(got.status), np.asarray(want.status))
    blob = tmp_path / "batch_4.stablehlo"
    good = blob.read_bytes()
    blob.write_bytes(good[:100])
    with pytest.raises(ValueError, match=r"batch_4\.stablehlo is damaged"):
        pipeline.load_locator(tmp_path)
    (tmp_path / "batch_4.stablehlo").write_bytes(good)
    arrays = tmp_path / "arrays.npz"
    arrays.write_bytes(arrays.read_bytes()[:1000])
    with pytest.raises(ValueError, match=r"arrays\.npz is damaged"):
        pipeline.load_locator(tmp_path)
    meta = tmp_path / "locator.json"
    meta.write_text(meta.read_text()[:50])
    with pytest.raises(ValueError, match=r"locator\.json is damaged"):
        pipeline.load_locator(tmp_path)
