"""The one-program Locator at batch 1 to 4,096, next to the matched MLE, in one run.

The quickstart's world (the paper's scene, concrete, -10 dBm, L = 50 labeled snapshots,
the ``quick`` cell classifier, cached): for each batch size the median wall time of
``loc(r)`` (the checked call: one program, compiled before timing; each call another block
of the test snapshots) per snapshot, its
ratio to the batched cost of the largest batch, the first call's time (compilation), the same program under ``jax.jit`` (no
host checks), and the lambda/8 MLE (``estimators.exact_mle``: table EGS + refinement + the gate's
recheck, one program) at the batch sizes it can
afford on this machine; the RMSE against the truth for each. With ``--per-row N``, N more
single snapshots one by one (each's first call and its best of three), grouped by how many
of its candidate cells the screen read (its first cells alone, or all) and its status.

    python benchmarks/locator_latency.py --json out/locator_latency.json
    python benchmarks/locator_latency.py --quick      # batches 1, 16, 256
    python benchmarks/locator_latency.py --batches 1 --mle-max-batch 0 --per-row 256
    python benchmarks/locator_latency.py --batches 1 --mle-max-batch 0 --trace 50

With ``--trace N``, N more calls of one snapshot run under JAX's profiler, and the
largest events of its trace by name are reported per call (the program's kernels and
loops, the host's argument parsing; events nest, so they do not add up).
"""

from __future__ import annotations

import argparse
import itertools
import statistics

import jax

jax.config.update("jax_enable_x64", True)  # physics in float64; the networks stay float32

import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    device_name,
    labeled_snapshots,
    print_table,
    time_call,
    trace_seconds,
    write_json,
)

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import estimators as est  # noqa: E402
from dmimo_jax import pipeline  # noqa: E402
from dmimo_jax.benchmarking import check_options  # noqa: E402


def median_time(fn, repeats):
    """Median seconds of ``repeats`` calls after the first (compilation): time_call's."""
    return statistics.median(time_call(fn, repeats)[1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--batches", type=int, nargs="*", default=None)
    ap.add_argument("--mle-max-batch", type=int, default=256)
    ap.add_argument(
        "--per-row", type=int, default=0,
        help="also time this many single snapshots one by one, grouped by the screen's tier",
    )  # fmt: skip
    ap.add_argument("--trace", type=int, default=0, help="profile this many one-snapshot calls")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    check_options(0, per_row=args.per_row, trace=args.trace)
    batches = args.batches or ([1, 16, 256] if args.quick else [1, 16, 256, 4096])
    scene = dj.paper_scene(-10.0, "concrete")
    x, r, nv = labeled_snapshots(scene, 50, 0)
    off = pipeline.run_offline(x, r, nv, scene, kinds=("cells",), preset="quick", seed=0)
    loc = dj.Locator.from_offline(off, "cells")
    jitted = jax.jit(loc)
    model = dj.TwoRayModel(scene)
    table = est.phasor_table(model, est.search_grid(scene, float(scene.wavelength) / 8))
    top = max(batches)
    xt, rt = labeled_snapshots(scene, top, 1, salt=10_000)[:2]
    xt, rt = np.asarray(xt), np.asarray(rt)
    rows = []
    for b in batches:
        rb = jax.device_put(rt[:b])
        repeats = 20 if b <= 16 else 5 if b <= 256 else 2
        # each timed call a batch of other snapshots (one snapshot is not every snapshot:
        # a row a rescue takes costs several times one that passes the gate at once)
        blocks = [jax.device_put(rt[i * b : (i + 1) * b]) for i in range(min(repeats, top // b))]
        turn = itertools.cycle(blocks)
        # the first call (compilation and one run), then the timed ones
        first, times = time_call(lambda turn=turn: loc(next(turn)), repeats)
        t_call = statistics.median(times)
        out = loc(rb)
        err = np.linalg.norm(np.asarray(out.x) - xt[:b], axis=1)
        t_jit = median_time(lambda turn=turn: jitted(next(turn)), repeats)
        row = dict(
            batch=b,
            locator_ms=1e3 * t_call / b,
            jit_ms=1e3 * t_jit / b,
            first_call_s=first,
            rmse_m=float(np.sqrt(np.mean(err**2))),
            overflow=int(np.sum(np.asarray(out.overflow))),
            fallback=int(np.sum(np.asarray(out.fallback))),
        )
        if b <= args.mle_max_batch:

            def mle(rb=rb):  # one program too (estimators.exact_mle)
                return est.exact_mle(rb, model, table).x

            xm = mle()
            row["mle_ms"] = 1e3 * median_time(mle, max(1, repeats // 4)) / b
            row["mle_rmse_m"] = float(
                np.sqrt(np.mean(np.linalg.norm(np.asarray(xm) - xt[:b], axis=1) ** 2))
            )
            row["mle_over_locator"] = row["mle_ms"] / row["locator_ms"]
        rows.append(row)
        print(f"batch {b}: {row}", flush=True)
    largest = rows[-1]["locator_ms"]
    for row in rows:
        row["vs_largest_batch"] = row["locator_ms"] / largest
        row["device"] = device_name()
    print_table(
        rows,
        [
            ("batch", "batch", "d"),
            ("locator_ms", "Locator ms/snap", ".4f"),
            ("jit_ms", "jit(loc) ms/snap", ".4f"),
            ("vs_largest_batch", f"x batch {top}", ".2f"),
            ("first_call_s", "first call s", ".1f"),
            ("mle_ms", "MLE ms/snap", ".3f"),
            ("mle_over_locator", "MLE / Locator", ".1f"),
            ("rmse_m", "RMSE m", ".3e"),
            ("overflow", "overflow", "d"),
        ],
    )
    if args.per_row:
        rows += per_row(loc, labeled_snapshots(scene, args.per_row, 2, salt=20_000)[1])
    if args.trace:
        rows.append(traced_calls(loc, rt[:1], args.trace))
    write_json(args.json, rows)


def traced_calls(loc, r, calls: int) -> dict:
    """``calls`` calls of ``loc`` on the one snapshot ``r`` (1, M) under JAX's profiler
    (compiled and warmed first): the 25 largest events by name, ms per call."""
    r = jax.device_put(r)
    for _ in range(5):
        jax.block_until_ready(loc(r).x)

    def run():
        for _ in range(calls):
            jax.block_until_ready(loc(r).x)

    events = trace_seconds(run, top=25)
    print(f"one snapshot under the profiler, {calls} calls: ms per call, calls per call, event")
    for name, s, n in events:
        print(f"{1e3 * s / calls:9.4f} {n / calls:6.1f}  {name[:90]}")
    return dict(trace_calls=calls, trace_ms_per_call=[(name, 1e3 * s / calls, n / calls)
                                                      for name, s, n in events])  # fmt: skip


def per_row(loc, r):
    """Single snapshots ``r`` one by one through ``loc``, each called four times: its first
    call (the table rows it screens not yet in the caches) and the best of the next three,
    grouped by the screen's tier (its first cells alone, all its candidate cells, or the
    whole region: the Locator's own screen says which) and the status; one row per group."""
    screen = loc.screen(r, loc.coarse(r))
    narrow, whole = np.asarray(screen.narrow), np.asarray(screen.fallback)
    status = np.asarray(loc(r).status)  # each row's status is its own (batch or alone)
    loc(r[:1])  # compiled
    first, warm = [], []
    for i in range(r.shape[0]):
        row = jax.device_put(np.asarray(r[i : i + 1]))
        cold, times = time_call(lambda row=row: loc(row), 3)
        first.append(cold)
        warm.append(min(times))
    first, warm = 1e3 * np.asarray(first), 1e3 * np.asarray(warm)
    out = []
    tiers = (("first cells", narrow), ("all cells", ~narrow & ~whole), ("whole region", whole))
    for tier, mask in tiers:
        for st in np.unique(status[mask]):
            m = mask & (status == st)
            out.append(dict(per_row=tier, status=int(st), rows=int(m.sum()),
                            share=float(m.mean()), first_call_ms=float(np.median(first[m])),
                            warm_ms=float(np.median(warm[m]))))  # fmt: skip
    print_table(out, [("per_row", "screened", "s"), ("status", "status", "d"),
                      ("rows", "rows", "d"), ("share", "share", ".3f"),
                      ("first_call_ms", "first call ms", ".3f"), ("warm_ms", "warm ms", ".3f")])  # fmt: skip
    return out


if __name__ == "__main__":
    main()
