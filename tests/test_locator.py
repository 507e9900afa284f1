"""dmimo_jax.pipeline.locator: the Locator as one XLA program (jit, vmap, the transfer guard,
the capacity and its overflow, several devices, jax.export in a fresh process)."""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dmimo_jax import pipeline
from tests.helpers import LOCATOR_BATCH as BATCH
from tests.helpers import LOCATOR_LIGHT as LIGHT
from tests.helpers import LOCATOR_SHARED as SHARED
from tests.helpers import run_on_host_devices
from tests.test_offline_online import _labeled, _offline

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cache")
    return tmp, _offline(tmp, kinds=("popt", "cells"))


def _max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


# the settings and batch size shared with test_faults / test_offline_online (tests/helpers.py);
# fault exclusion runs under jit and vmap in test_jit_vmap_and_the_plain_call_agree


@pytest.mark.slow  # compiles the whole program several times (40-100 s here)
@pytest.mark.parametrize("kind", ["cells", "popt"])
def test_jit_vmap_and_the_plain_call_agree(trained, kind):
    _, off = trained
    r = _labeled(BATCH, seed=3)[1]
    # capacity 1: every rare row fits, so the traced calls have nothing to report. Fault
    # exclusion is traced under jit and vmap in the cells case; the popt case and the
    # programs of other shapes leave it out (LIGHT: half the compile; fault-free answers are
    # the same with or without it, so they are compared with the full program's)
    loc = pipeline.Locator.from_offline(off, kind, **(SHARED if kind == "cells" else LIGHT))
    out = loc(r)
    if kind == "cells":  # each a compile of the whole program: once is enough
        # jit closing over the Locator is the popt case's; here the Locator as an argument
        others = [jax.vmap(loc)(r), jax.jit(lambda lo, rr: lo(rr))(loc, r)]
    else:
        others = [jax.jit(loc)(r)]
    for other in others:
        assert _max_diff(other.x, out.x) < 1e-9
        np.testing.assert_array_equal(np.asarray(other.fallback), np.asarray(out.fallback))
        assert not bool(jnp.any(other.overflow))
    light = loc.replace(max_excluded=0)
    single = light(r[5])
    assert single.x.shape == (3,) and single.cost.shape == ()
    assert _max_diff(single.x, out.x[5]) < 1e-9
    if kind == "cells":  # vmap over Locators (batched leaves): each its own program
        two = jax.tree.map(lambda a: jnp.stack([a, a]), light)
        both = jax.vmap(lambda lo: lo(r[5]))(two)
        assert both.x.shape == (2, 3) and _max_diff(both.x, np.stack([out.x[5]] * 2)) < 1e-9


@pytest.mark.slow  # compiles the program with the Locator as an argument (about 25 s here)
@pytest.mark.newest  # CI's newest-versions leg runs it
def test_a_device_resident_batch_never_touches_the_host(trained):
    _, off = trained
    loc = jax.device_put(pipeline.Locator.from_offline(off, "cells", **LIGHT))  # its leaves too
    r = jax.device_put(_labeled(BATCH, seed=5)[1])
    run = jax.jit(lambda lo, rr: lo(rr))  # the program test_nan_complex_... compiles too
    jax.block_until_ready(run(loc, r))  # compiled outside the guard
    with jax.transfer_guard("disallow"):
        out = jax.block_until_ready(run(loc, r))
    assert out.x.shape == (BATCH, 3)


@pytest.mark.slow  # compiles the whole program several times (40-100 s here)
def test_rows_beyond_the_capacity_are_reported_then_run_again(trained):
    """min_mass above 1: every snapshot falls back to the whole region; a capacity of one
    row fits one of them per program, and the plain call re-runs the others through the
    program the batch ran (no second program)."""
    _, off = trained
    x, r, _ = _labeled(6, seed=6)
    tight = pipeline.Locator.from_offline(
        off, "cells", **{**LIGHT, "min_mass": 1.5, "capacity": 0.0}
    )
    assert tight.capacity_for(6) == 1
    traced = jax.jit(tight)(r)
    np.testing.assert_array_equal(np.asarray(traced.overflow), [False] + [True] * 5)
    roomy = tight.replace(capacity=1.0)
    want = roomy(r)
    assert not bool(jnp.any(want.overflow)) and bool(jnp.all(want.fallback))
    tight(r[:5])  # the bucket of 6 rows (16), compiled
    before = pipeline.Locator.compiled_programs()
    got = tight(r)  # the checked shell runs the rows that did not fit
    assert not bool(jnp.any(got.overflow))
    assert pipeline.Locator.compiled_programs() in (before, -1)
    assert _max_diff(got.x, want.x) < 1e-9
    assert float(np.max(np.linalg.norm(np.asarray(got.x) - np.asarray(x), axis=1))) < 1e-3


@pytest.mark.slow  # compiles the program with the Locator as an argument (about 25 s here)
@pytest.mark.newest  # CI's newest-versions leg runs it
def test_nan_complex_and_empty_batches(trained):
    _, off = trained
    loc = pipeline.Locator.from_offline(off, "cells", **LIGHT)
    r = np.asarray(_labeled(BATCH, seed=7)[1])
    bad = r.copy()
    bad[2, 3] = np.nan
    with pytest.raises(ValueError, match="r must be finite|r contains|finite"):
        loc(bad)
    with pytest.raises(ValueError, match="complex"):
        loc(np.exp(1j * r))
    empty = loc(np.zeros((0, 17)))
    assert empty.x.shape == (0, 3) and empty.overflow.shape == (0,)
    # traced, the check cannot run: the NaN row is rejected, never a silent answer
    out = jax.jit(lambda lo, rr: lo(rr))(loc, bad)
    assert bool(out.rejected[2]) and int(jnp.sum(out.rejected)) == 1


def test_settings_are_checked_and_replace_keeps_the_stage(trained):
    _, off = trained
    loc = pipeline.Locator.from_offline(off, "cells", num_cells=4)
    with pytest.raises(ValueError, match="capacity must be a fraction"):
        loc.replace(capacity=2.0)
    with pytest.raises(ValueError, match="not a setting"):
        loc.replace(kind="popt")
    assert loc.replace(min_mass=0.0).settings.min_mass == 0.0 and loc.settings.num_cells == 4
    leaves, tree = jax.tree_util.tree_flatten(loc)
    again = jax.tree_util.tree_unflatten(tree, leaves)
    assert again.settings == loc.settings
    # the default kind fits run_offline's defaults: the one trained, "cells" among several
    assert pipeline.Locator.from_offline(off, num_cells=4).settings.kind == "cells"
    only_popt = off._replace(estimators={"popt": off.estimators["popt"]})
    assert pipeline.Locator.from_offline(only_popt).settings.kind == "popt"


@pytest.mark.slow  # compiles the whole program several times (40-100 s here)
def test_the_program_shards_over_four_host_devices(trained):
    tmp, _ = trained
    script = textwrap.dedent(
        f"""
        import sys, pathlib
        sys.path.insert(0, {ROOT!r})
        import jax
        jax.config.update("jax_enable_x64", True)
        import numpy as np
        from dmimo_jax import pipeline
        from tests.test_offline_online import _labeled, _offline
        assert len(jax.devices()) == 4, jax.devices()
        off = _offline(pathlib.Path({str(tmp)!r}), kinds=("popt", "cells"))
        loc = pipeline.Locator.from_offline(off, "cells", **{LIGHT!r})
        r = _labeled({BATCH}, seed=3)[1]
        one = loc(r)
        out = pipeline.sharded(loc)(r)
        assert len(out.x.sharding.device_set) == 4
        print(float(np.max(np.abs(np.asarray(out.x) - np.asarray(one.x)))))
        """
    )
    out = run_on_host_devices(script)
    assert float(out.strip().splitlines()[-1]) < 1e-9


@pytest.mark.newest  # jax.export's serialized program (CI's newest leg)
@pytest.mark.slow  # compiles the whole program several times (40-100 s here)
def test_export_runs_in_a_fresh_process_and_a_second_reads_the_compiled_program(trained, tmp_path):
    _, off = trained
    loc = pipeline.Locator.from_offline(off, "cells", **LIGHT)
    r = np.asarray(_labeled(5, seed=8)[1])
    pipeline.export_locator(loc, tmp_path / "loc", batch_sizes=(1, 4))
    meta = json.loads((tmp_path / "loc" / "locator.json").read_text())
    assert meta["batch_sizes"] == [1, 4] and meta["num_aps"] == 17
    np.save(tmp_path / "r.npy", r)
    script = textwrap.dedent(
        f"""
        import jax
        jax.config.update("jax_enable_x64", True)
        import numpy as np
        from dmimo_jax.pipeline import load_locator, use_compilation_cache
        # the persistent cache's hits (a program read from it) and misses (a program compiled
        # and written to it: one that took over use_compilation_cache's 0.5 s)
        counts = dict(hits=0, misses=0)
        names = dict([("/jax/compilation_cache/cache_hits", "hits"),
                      ("/jax/compilation_cache/cache_misses", "misses")])

        def count(event, **kw):
            if event in names:
                counts[names[event]] += 1

        jax.monitoring.register_event_listener(count)
        use_compilation_cache({str(tmp_path / "xla")!r})
        loaded = load_locator({str(tmp_path / "loc")!r})
        r = np.load({str(tmp_path / "r.npy")!r})
        out = loaded(r)  # 5 rows: one program of 4, one of 1
        np.save({str(tmp_path / "x.npy")!r}, np.asarray(out.x))
        print(out.x.shape, loaded(r[0]).x.shape, "cache", counts["hits"], counts["misses"])
        """
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script],
            env=dict(os.environ, JAX_PLATFORMS="cpu"),
            capture_output=True,
            text=True,
            timeout=600,
            cwd=tmp_path,
        )
        for _ in range(2)  # the first fills the persistent cache, the second reads it
    ]
    for done in runs:
        assert done.returncode == 0, done.stderr[-3000:]
        assert "(5, 3) (3,)" in done.stdout
    # the first process compiles the Locator's programs and writes them (misses, no hit);
    # the second reads them and compiles nothing worth keeping (hits, no miss). Counted, not
    # timed: the seconds a hit "saved" are its compile time, which JAX records in whole
    # seconds, less its reading, which a loaded machine stretches (0.13 s in one CI run)
    hits, misses = zip(*(map(int, done.stdout.split()[-2:]) for done in runs), strict=True)
    assert hits[0] == 0 and misses[0] >= 1, (hits, misses)
    assert hits[1] >= 1 and misses[1] == 0, (hits, misses)
    want = loc(r).x  # each row's answer is the same in any batch (nothing overflows)
    assert _max_diff(np.load(tmp_path / "x.npy"), want) < 1e-9
    with pytest.raises(ValueError, match="no exported Locator"):
        pipeline.load_locator(tmp_path)


_TWO_PROCESSES = """
import sys, pathlib
sys.path.insert(0, {root!r})
pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
import jax
jax.config.update("jax_enable_x64", True)
jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.distributed.initialize(f"127.0.0.1:{{port}}", num_processes=2, process_id=pid)
import numpy as np
from jax.experimental import multihost_utils
from dmimo_jax import pipeline
from tests.test_offline_online import _labeled, _offline
off = _offline(pathlib.Path({cache!r}), kinds=("popt", "cells"))
loc = pipeline.Locator.from_offline(off, "cells", **{light!r})
r = np.asarray(_labeled({batch}, seed=3)[1])
half = {batch} // 2
mine = loc(r[pid * half : (pid + 1) * half])  # each process locates its shard
gathered = multihost_utils.process_allgather(np.asarray(mine.x))
assert jax.process_count() == 2
if pid == 0:
    np.save(out, np.asarray(gathered).reshape(-1, 3))
"""


@pytest.mark.slow  # two processes, each compiles the program
def test_two_processes_through_jax_distributed_equal_one(trained, tmp_path):
    import socket

    tmp, off = trained
    script = tmp_path / "two.py"
    script.write_text(_TWO_PROCESSES.format(root=ROOT, cache=str(tmp), light=LIGHT, batch=BATCH))
    out = tmp_path / "x.npy"
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    # the coordinator's port stays held by this socket until the children are done: the
    # coordinator (gRPC, SO_REUSEPORT) binds beside it, any other process is refused, so no
    # one can take the port between its choice and its use
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(("127.0.0.1", 0))
        port = str(held.getsockname()[1])
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), str(i), port, str(out)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in range(2)
        ]
        for p in procs:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
    loc = pipeline.Locator.from_offline(off, "cells", **LIGHT)
    want = loc(_labeled(BATCH, seed=3)[1])
    assert _max_diff(np.load(out), want.x) < 1e-9
