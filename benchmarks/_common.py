"""Shared helpers for the benchmark scripts: timing, memory, table and JSON output."""

from __future__ import annotations

import json
import pathlib
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax


def device_name() -> str:
    d = jax.devices()[0]
    return f"{d.platform}:{getattr(d, 'device_kind', '')}".rstrip(":")


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, MiB (Linux ru_maxrss is KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def time_call(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
    """First call (compile + run) time, then ``repeats`` timed calls; results are blocked on."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return first, times


def summarize(times: Sequence[float]) -> dict[str, float]:
    return {
        "median_s": statistics.median(times),
        "std_s": statistics.stdev(times) if len(times) > 1 else 0.0,
        "min_s": min(times),
    }


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


def write_json(path: pathlib.Path | None, rows: list[dict[str, Any]]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1))
    print(f"wrote {path}")


def labeled_snapshots(scene: Any, num: int, seed: int, salt: int = 0, model: Any = None):
    """``num`` snapshots of the true channel (``model``, default the scene's two-ray model) in
    the scene's UE region: positions (num, 3), phases (num, M), noise variances (num, M);
    ``salt`` separates training draws (0) from test draws."""
    import dmimo_jax as dj

    k_x, k_cpo, k_noise = jax.random.split(jax.random.key(salt + seed), 3)
    truth = dj.TwoRayModel(scene) if model is None else model
    x = dj.sample_positions(k_x, num, scene)
    r = dj.simulate_phases_batch(k_noise, truth, x, dj.random_cpos(k_cpo, num))
    return x, r, jax.vmap(truth.variance)(x)
