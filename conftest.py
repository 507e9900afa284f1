"""Test configuration (also picked up by the doctests in dmimo_jax/ and docs/).

Physics, bounds and estimation are tested in float64; implicit rank promotion is an
error so that a silent (M,) vs (M, 1) broadcast cannot hide a bug.
"""

import os
import pathlib
import re
import time


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


# XLA:CPU also splits each program's machine code into parts that it generates on parallel
# threads; for this suite's thousands of small programs, on workers that already keep both
# cores busy, the split costs more than it saves. In one part (split count 1) the test
# command took 169-170 s cold against 182-186 s, the slow tier 636 s against 677 s
# (jaxlib 0.10.2; docs/performance.md). On jaxlib 0.12 it measured no gain (242 s against
# 237 s), so it goes with the emitters' flag. The package leaves XLA's default: its large
# programs compile faster split (the Locator's: 3.6 s against 4.3-5.1 s in one part).
if _jaxlib_version() < (0, 11):
    os.environ["XLA_FLAGS"] = " ".join(
        [
            os.environ.get("XLA_FLAGS", ""),
            "--xla_cpu_use_fusion_emitters=false",
            "--xla_cpu_parallel_codegen_split_count=1",
        ]
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


# Every compiled XLA:CPU program that is alive holds about 28 memory mappings (its code and
# buffers; measured the same on jax 0.10-0.12), and the package's jitted functions keep one
# program per shape they were called with, so a long test process accumulates them. Linux
# refuses a process more than vm.max_map_count mappings (65,530 by default); XLA's compile
# then fails and the process dies in it (a segmentation fault or an abort in
# backend_compile_and_load: the slow tier in one process on jax 0.11 / 0.12 at 64,948
# mappings). So after a test that leaves the process above half that limit, the compiled
# programs are dropped (jax.clear_caches: later tests compile again, or load from the
# persistent cache below). Counting costs a read of /proc/self/maps (1.6 / 4.9 ms at 5,000 /
# 15,000 mappings), so a process counts after a test at most every MAPS_EVERY_S seconds: in
# that time it compiles a few hundred programs at most, far below the half left. Not Linux:
# nothing to count, nothing done.
_MAPS = pathlib.Path("/proc/self/maps")
_MAX_MAPS = pathlib.Path("/proc/sys/vm/max_map_count")
MAPS_EVERY_S = 5.0
_NEXT_COUNT = pytest.StashKey[float]()


def _map_budget():
    try:
        return int(_MAX_MAPS.read_text()) // 2
    except (OSError, ValueError):
        return None


_MAP_BUDGET = _map_budget()


@pytest.fixture(autouse=True)
def _free_compiled_programs_near_the_map_limit(request):
    yield
    stash, now = request.config.stash, time.monotonic()
    if _MAP_BUDGET is None or now < stash.get(_NEXT_COUNT, 0.0):
        return
    stash[_NEXT_COUNT] = now + MAPS_EVERY_S
    if _MAPS.read_bytes().count(b"\n") > _MAP_BUDGET:
        jax.clear_caches()


# The test order comes from a measurement the suite records: every run stores each test's
# seconds (setup, call and teardown) in pytest's cache (.pytest_cache, key DURATIONS_KEY),
# and the next run starts the longest first: the test command (xdist `--dist loadfile`,
# `--no-loadscope-reorder`: one file at a time, in collection order) by each file's sum,
# the slow tier (`--dist load`) test by test. So a long file never starts last and keeps
# one core busy after the other is idle. Nothing measured yet (a fresh clone, CI): the
# collection order. A stale entry only costs balance, never a result. (A committed
# measurement for fresh clones, longest first, was measured worse: the test command 247 s
# against 230 s in the collection order, 466 s of CPU against 425 s, back to back on an
# empty compilation cache.)
DURATIONS_KEY = "dmimo_jax/durations"


def _file_of(nodeid):
    return nodeid.split("::")[0]


def pytest_collection_modifyitems(config, items):
    cache = getattr(config, "cache", None)
    seconds = cache.get(DURATIONS_KEY, {}) if cache is not None else {}
    if config.getoption("markexpr", "") == "slow":
        # the modules run on one worker first (the largest units of work: see below)
        shared = shared_fixture_files(config.rootpath, {_file_of(i.nodeid) for i in items})

        def key(item):
            return _file_of(item.nodeid) not in shared, -seconds.get(item.nodeid, 0.0)

    else:
        per_file = {}
        for nodeid, s in seconds.items():
            per_file[_file_of(nodeid)] = per_file.get(_file_of(nodeid), 0.0) + s
        key = lambda item: -per_file.get(_file_of(item.nodeid), 0.0)  # noqa: E731
    items.sort(key=key)  # stable: unmeasured tests keep their collection order, last


# The slow tier runs test by test (`--dist load`), but where a module's tests share a module
# fixture (a trained Locator, a fitted GP, the tiles' offline stage: 10-35 s each), each
# worker that runs one of them builds it: the slow tier's setups were 255 s of its 2,034 s,
# about a third of them a second worker's build. So the tests of such a module run on one
# worker, as one unit of work; every other test is a unit of its own.
# scope= anywhere among the decorator's arguments (params=[...] before it included)
_MODULE_FIXTURE = re.compile(
    r"@pytest\.fixture\((?:[^()]|\([^()]*\))*?\bscope=[\"'](module|session)[\"']"
)


def shared_fixture_files(root, files):
    """The test files among ``files`` (paths relative to ``root``, as in node ids) that define
    a module or session fixture."""
    shared = set()
    for name in files:
        path = pathlib.Path(root) / name
        if path.suffix == ".py" and path.is_file() and _MODULE_FIXTURE.search(path.read_text()):
            shared.add(name)
    return shared


def pytest_xdist_make_scheduler(config, log):
    """``--dist load`` with the tests of :func:`shared_fixture_files` kept together."""
    if config.getoption("dist", None) != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.shared = {}  # file -> whether it defines a module fixture, for this run

        def _split_scope(self, nodeid):
            name = _file_of(nodeid)
            if name not in self.shared:
                self.shared[name] = name in shared_fixture_files(config.rootpath, {name})
            return name if self.shared[name] else nodeid

    return SharedFixtureScheduling(config, log)


class _Durations:
    """Collects each test's seconds on the controller (xdist forwards the workers'
    reports) and merges them into the cache when the session ends."""

    def __init__(self):
        self.seconds = {}

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session):
        cache = getattr(session.config, "cache", None)
        if cache is None or not self.seconds:
            return
        merged = dict(cache.get(DURATIONS_KEY, {}))
        merged.update({k: round(v, 3) for k, v in self.seconds.items()})
        cache.set(DURATIONS_KEY, merged)


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(_Durations(), "dmimo_jax_durations")


# docs/hooks/ holds the docs build's MkDocs hooks and griffe extension: they import the docs
# extra (griffe), which the test command does not install, and hold no doctests
collect_ignore = ["docs/hooks"]
