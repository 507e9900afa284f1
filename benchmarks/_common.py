"""Shared helpers for the benchmark scripts: device name, memory and the printed table; the
timer, the JSON record and the simulated labeled set are the package's
(:mod:`dmimo_jax.benchmarking`, :func:`dmimo_jax.measure.labeled_snapshots`)."""

from __future__ import annotations

import resource
from collections.abc import Sequence
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
