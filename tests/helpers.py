"""Dtype-keyed tolerances in one place (as in tinygp's test_utils), the XLA setting for
the few long computations in the suite, and the Locator settings its tests share."""

import contextlib

import jax
import numpy as np

# The Locator's program takes about 20 s to compile with the suite's XLA settings, and its
# tests would compile it dozens of times. They share what they can through the persistent
# compilation cache (conftest.py): the same settings and batch size compile to the same
# program in every test file, worker and subprocess. LOCATOR_LIGHT leaves fault exclusion
# out (half the compile time) for tests of a transformation or of composition, where no AP
# is faulty (fault-free answers are the same with or without it: tests/test_faults.py).
LOCATOR_SHARED = {"num_cells": 4, "first_cells": 2, "capacity": 1.0}
LOCATOR_LIGHT = {**LOCATOR_SHARED, "max_excluded": 0}
LOCATOR_BATCH = 16

_RTOL = {np.dtype("float32"): 5e-4, np.dtype("float64"): 1e-10}


def assert_allclose(actual, desired, *, rtol=None, atol=0.0, err_msg=""):
    actual = np.asarray(actual)
    desired = np.asarray(desired)
    if rtol is None:
        dt = np.result_type(actual.real.dtype, desired.real.dtype)
        rtol = _RTOL.get(np.dtype(dt), 1e-10)
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol, err_msg=err_msg)


@contextlib.contextmanager
def xla_optimized():
    """Compile with XLA's optimization passes inside the block (the suite compiles without
    them, ``conftest.py``): for fixtures and tests whose run time, not their compilation,
    is what costs (building tables, long scans).

    It applies to what is first compiled inside: a function compiled before for the same
    shapes keeps its executable (JAX's in-memory caches are not keyed on the setting);
    clearing them on entry costs more than it saves (docs/performance.md).
    """
    previous = jax.config.values["jax_disable_most_optimizations"]
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", previous)


@contextlib.contextmanager
def shared_folder(tmp_path_factory, name):
    """A folder of this run that every xdist worker sees (``name`` under the parent of the
    workers' own base folders; the base folder itself without xdist), held under an
    exclusive file lock while the block runs: the first worker to come fills it, the others
    wait, then find it filled. For a module fixture whose build the package caches on disk
    (``--dist load`` spreads a module's tests over both workers, and each would build it).
    Where ``fcntl`` is missing (Windows), each worker has a folder of its own."""
    import os

    base = tmp_path_factory.getbasetemp()
    try:
        import fcntl
    except ImportError:
        fcntl = None
    if fcntl is not None and os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # pytest-N/: the parent of popen-gw0/, popen-gw1/
    folder = base / name
    folder.mkdir(exist_ok=True)
    if fcntl is None:
        yield folder
        return
    with open(base / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield folder
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def assert_rate_at_least(successes, num, rate, *, alpha=0.01, what="successes"):
    """A success rate stated with its sampling error, not a count that moves with XLA
    versions and backends: fail only where ``successes`` of ``num`` would be rarer than
    ``alpha`` if the true rate were ``rate`` (the binomial tail P(X <= successes) < alpha).
    With 16 trials at a rate of 0.98 and alpha 0.01, 14 passes and 13 fails."""
    import scipy.stats

    tail = float(scipy.stats.binom.cdf(int(successes), int(num), rate))
    assert tail >= alpha, (
        f"{what}: {int(successes)} of {int(num)}, below a rate of {rate} at the {alpha} level "
        f"(P(X <= {int(successes)}) = {tail:.2g})"
    )


def run_on_host_devices(script, *, count=4):
    """Run the Python source ``script`` in a fresh process with ``count`` host devices on
    the CPU (even where a GPU is the default platform), the suite's XLA flags kept
    (conftest.py: the same compiler settings as the other tests), from the repository root;
    assert it succeeded and return its stdout."""
    import os
    import pathlib
    import subprocess
    import sys

    flags = os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={count}"
    env = dict(os.environ, XLA_FLAGS=flags.strip(), JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=pathlib.Path(__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
