"""Test configuration (also picked up by the doctests in dmimo_jax/ and docs/).

Physics, bounds and estimation are tested in float64; implicit rank promotion is an
error so that a silent (M,) vs (M, 1) broadcast cannot hide a bug.
"""

import os
import pathlib


# XLA's CPU fusion emitters cost ~50 ms per (tiny) compile on this 2-core machine, the
# older elemental emitter about half that, and most of this suite's time is compilation
# (one compile per new shape of every eager op): 15% off tests/test_mle.py +
# tests/test_candidates.py measured side by side (209 s vs 244 s). Tests only; the package
# never sets XLA flags. XLA aborts on a flag it does not know, and the XLA of jaxlib 0.11
# removed this one (the emitters are the only path there): it is set for older jaxlibs
# only, read from the installed metadata without importing jax. GPU runs: one process per
# xdist worker, so no preallocation.
def _jaxlib_version() -> tuple[int, ...]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return tuple(int(p) for p in version("jaxlib").split(".")[:2])
    except (PackageNotFoundError, ValueError):
        return (0, 0)


if _jaxlib_version() < (0, 11):
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_use_fusion_emitters=false"]
    ).strip()
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

# JAX's persistent compilation cache, tests only: the workers and the slow run compile
# many of the same functions (one scene, one model, the estimators at the same shapes),
# and an executable is keyed by its HLO, the XLA flags, the backend and the jax version,
# so a hit is the same program (it caches compiled code, never a result). Every compile
# is worth keeping here (most take 25-50 ms). `.ci/run` points it at a fresh directory
# shared by its two pytest runs; locally it defaults to .pytest_cache/. Measured:
# tests/test_mle.py + tests/test_candidates.py, one process, 153 s without, 146 s with an
# empty cache, 67 s with the cache from that run.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    str(pathlib.Path(__file__).parent / ".pytest_cache" / "jax-compilation-cache"),
)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

# XLA compiles without its optimization passes (level 0, no expensive LLVM passes): the
# same program, less optimized code. Most tests run small shapes, so compiling dominates
# and this pays; tests marked `optimized` (and fixtures in `tests.helpers.xla_optimized`)
# run long computations and compile with the passes (times: docs/performance.md).
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

from tests.helpers import xla_optimized  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(autouse=True)
def _xla_optimized_if_marked(request):
    """Tests marked ``optimized`` compile with XLA's optimization passes (see above)."""
    if request.node.get_closest_marker("optimized") is None:
        yield
    else:
        with xla_optimized():
            yield


# The longest files first. xdist's `--dist loadfile` hands each worker one file at a time
# in collection order (`--no-loadscope-reorder`; its default orders files by their number
# of tests), so a long file started last keeps one core busy after the other is idle.
# Seconds of one worker, `python -m pytest --junitxml=...` summed per file (2026-11-28, a
# fresh compilation cache, after the tests over about 6 s moved to the slow tier):
# a stale entry only costs balance, never a result. Files not listed run after these.
LONGEST_FILES = (
    "tests/test_tracking.py",  # 42 s
    "tests/test_candidates.py",  # 32 s
    "tests/test_bad_input.py",  # 27 s
    "tests/test_physics.py",  # 25 s
    "tests/test_gp.py",  # 23 s
    "tests/test_offline_online.py",  # 22 s (48 s before its Locator test moved to the slow tier)
    "tests/test_learning.py",  # 21 s
    "tests/test_calibration_deployment.py",  # 19 s
    "tests/test_mle.py",  # 18 s
    "tests/test_grid.py",  # 18 s
    "docs/index.md",  # 17 s
    "tests/test_calibration_surfaces.py",  # 17 s
    "tests/test_antenna.py",  # 16 s
    "tests/test_pipeline.py",  # 16 s
    "tests/test_datasets.py",  # 15 s
    "tests/test_faces.py",  # 15 s
    "tests/test_bounds.py",  # 15 s
    "tests/test_structure.py",  # 14 s
    "tests/test_meshes.py",  # 13 s
    "tests/test_image_source.py",  # 11 s
)


# The slow tests run with `--dist load` (test by test): the longest first, so that the last
# ones to start are short and both cores finish together (their seconds in the .ci/run of
# commit 4dc22d1, 2026-11-29; a stale entry only costs balance).
LONGEST_SLOW_TESTS = (
    "tests/test_locator.py::test_jit_vmap_and_the_plain_call_agree[cells]",  # 78 s
    "tests/test_receivers.py::test_complex_unlabeled_snapshots_noise_free_and_a_wrong_lobe_left_out",  # 70 s
    "tests/test_examples.py::test_deployment_example_with_unlabeled_snapshots",  # 66 s
    "tests/test_gp.py::test_nuts_posterior_runs_and_brackets_the_point_estimate",  # 63 s
    "tests/test_examples.py::test_tracking_example_quick_and_resumable",  # 62 s
    "tests/test_examples.py::test_quickstart_tiny",  # 62 s
    "tests/test_examples.py::test_deployment_example_tiny",  # 54 s
    "tests/test_examples.py::test_reacquisition_benchmark_quick",  # 52 s
    "tests/test_examples.py::test_unlabeled_calibration_benchmark_quick",  # 50 s
    "tests/test_examples.py::test_calibrate_material_example_tiny",  # 49 s
)


def pytest_collection_modifyitems(config, items):
    if config.getoption("markexpr", "") == "slow":
        rank = {nodeid: i for i, nodeid in enumerate(LONGEST_SLOW_TESTS)}
        items.sort(key=lambda item: rank.get(item.nodeid, len(rank)))
        return
    rank = {path: i for i, path in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


# docs/hooks/ holds the docs build's MkDocs hooks and griffe extension: they import the docs
# extra (griffe), which the test command does not install, and hold no doctests
collect_ignore = ["docs/hooks"]
