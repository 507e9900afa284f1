"""dmimo_jax.pipeline.rescues: the cost gate as a loop of rescues, the outcome as one status,
the integrity rules (never more than max_excluded APs out, never an answer without a
redundant AP), and the Locator's batch buckets (any batch runs one of a few programs)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmimo_jax import pipeline
from dmimo_jax.estimators import RefineResult
from dmimo_jax.pipeline.rescues import Answer, GateState, Rescue, Status, final_status, run_gate
from tests.helpers import LOCATOR_SHARED as SHARED
from tests.test_offline_online import _labeled, _offline


@pytest.fixture(scope="module")
def loc(tmp_path_factory):
    off = _offline(tmp_path_factory.mktemp("cache"), kinds=("cells",))
    return pipeline.Locator(off, "cells", **SHARED)


def _state(loc, x, cost, excluded, pending):
    b = x.shape[0]
    fine = RefineResult(x, jnp.zeros(b), cost, jnp.zeros(b, jnp.int32))
    answer = Answer(x, fine, excluded)
    zeros = jnp.zeros(b, jnp.int32)
    return GateState(answer, pending, jnp.zeros(b, bool), zeros, jnp.int32(b))


def test_final_status_names_each_outcome(loc):
    """Rejected where still pending, overflow where a rescue had no room, unverified where
    fewer than one redundant AP is left, else the status the gate gave."""
    x = jnp.zeros((4, 3)) + 5.0
    excluded = jnp.zeros((4, 17), bool).at[3, :13].set(True)  # 4 APs left: no redundancy
    state = _state(loc, x, jnp.ones(4), excluded, jnp.array([False, True, False, False]))
    status = [Status.EXCLUDED, Status.LOCATED, Status.OVERFLOW, Status.LOCATED]
    state = state._replace(status=jnp.array(status, jnp.int32))
    got = [Status(int(v)) for v in final_status(loc, state)]
    assert got == [Status.EXCLUDED, Status.REJECTED, Status.OVERFLOW, Status.UNVERIFIED]


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


@pytest.mark.slow  # two more programs (max_excluded 12 and 1)
def test_never_more_exclusions_than_allowed_nor_an_answer_without_redundancy(loc):
    """Random phases on every AP with max_excluded at its largest (M - 5 = 12): no row leaves
    out more than allowed, and every accepted answer keeps at least one redundant AP; random
    phases on two APs with max_excluded=1: at most one out."""
    noise = jnp.asarray(np.random.default_rng(1).uniform(-np.pi, np.pi, (16, 17)))
    wide = loc.replace(max_excluded=12)
    with pytest.raises(ValueError, match="max_excluded"):
        loc.replace(max_excluded=13)
    out = wide(noise)
    k = np.asarray(out.excluded).sum(axis=1)
    assert k.max() <= 12
    accepted = np.asarray(out.accepted)
    assert np.all(17 - k[accepted] - 4 >= 1)  # the contract (implied by k <= 12 = M - 5)
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


@pytest.mark.slow  # the program of max_excluded=12 (shared with the test above in one process)
@pytest.mark.xfail(strict=True, reason="open (issue 67): the exclusion search fits noise")
def test_noise_is_rejected_even_when_many_exclusions_are_allowed(loc):
    """Random phases on every AP must not be accepted, whatever max_excluded allows. With
    max_excluded=12 (one redundant AP left) the search over which APs to leave out finds a
    subset that fits noise within the gate: 31-38 of 64 such snapshots were accepted
    (measured over four seeds; 0 of 64 at max_excluded=3). A gate that accounts for the
    subsets tried would close it; strict, so the fix turns this test red until it is
    unmarked."""
    noise = jnp.asarray(np.random.default_rng(1).uniform(-np.pi, np.pi, (16, 17)))
    out = loc.replace(max_excluded=12)(noise)
    assert not bool(jnp.any(out.accepted))
