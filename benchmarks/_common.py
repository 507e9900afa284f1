"""Shared helpers for the benchmark scripts: device name, memory and the printed table; the
timer, the JSON record and the simulated labeled set are the package's
(:mod:`dmimo_jax.benchmarking`, :func:`dmimo_jax.measure.labeled_snapshots`)."""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import resource
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import jax

from dmimo_jax.benchmarking import (  # noqa: F401  (re-used by the scripts)
    machine,
    summarize,
    time_call,
    write_json,
)


def device_name() -> str:
    """JAX's first device, ``platform:kind`` (as the JSON records' machine names it)."""
    return machine()["device"]


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (Linux ru_maxrss is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, str]]) -> None:
    """``columns``: (key, header, format spec)."""
    widths = [max(len(h), 12) for _, h, _ in columns]
    print("  ".join(h.rjust(w) for (_, h, _), w in zip(columns, widths, strict=True)))
    for row in rows:
        cells = []
        for (key, _, spec), w in zip(columns, widths, strict=True):
            v = row.get(key)
            cells.append(("-" if v is None else format(v, spec)).rjust(w))
        print("  ".join(cells))


def labeled_snapshots(scene: Any, num: int, seed: int, salt: int = 0, model: Any = None):
    """``num`` snapshots of the true channel (``model``, default the scene's two-ray model):
    positions, phases, noise variances, from :func:`dmimo_jax.measure.labeled_snapshots` with
    the key ``salt + seed`` (``salt`` separates training draws, 0, from test draws)."""
    import dmimo_jax as dj

    x, r, variance, _ = dj.measure.labeled_snapshots(
        jax.random.key(salt + seed), scene if model is None else model, num
    )
    return x, r, variance


def trace_seconds(fn: Callable[[], Any], top: int = 20) -> list[tuple[str, float, int]]:
    """``fn()`` run under JAX's profiler: the ``top`` event names of its trace by total
    seconds, as ``(name, seconds, count)``, Python's own frames left out. They name what
    XLA does (its compiler's passes and code generation during a compile, each kernel of a
    program during a call); events nest (a pass inside its pipeline, a kernel inside its
    loop), so the totals do not add up to the wall time, and the names are those of the
    installed XLA."""
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder, create_perfetto_trace=True):
            fn()
        paths = list(pathlib.Path(folder).rglob("perfetto_trace.json.gz"))
        if len(paths) != 1:
            raise RuntimeError(f"JAX's profiler wrote {len(paths)} perfetto traces, expected one")
        events = json.loads(gzip.decompress(paths[0].read_bytes()))["traceEvents"]
    seconds, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and not e["name"].startswith("$"):
            seconds[e["name"]] += e["dur"] * 1e-6
            count[e["name"]] += 1
    return [(name, s, count[name]) for name, s in seconds.most_common(top)]
