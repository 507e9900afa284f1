"""The screen's product in its two orientations, side by side: what sets
``estimators.phasors.SKINNY_BATCH``.

Every screen ranks a block of table points by their squared coherence with B snapshots,
one float32 product of the points' phasor rows (N, 2K) with the snapshots' weights
(2K, 2B) (``estimators.phasors.squared_coherence``). It can be written ``rows @ weights``
(tall and skinny: N x 2B, transposed after) or ``weights^T rows^T`` (2B x N); the sums are
the same to float32 rounding, the time is not. For K APs of the worlds measured (17: the
paper's room; 23 and 35: the 20 m and 40 m halls' tiles), N the points of one cell
(2,197: a cell screen's block) and of 16 cells (35,152: one row's screen), and B from 1 to
256: each orientation's time (best of 7 passes of ``--calls`` calls, interleaved) and
their ratio. With ``--locator``, the quickstart's Locator (``run_offline(kinds=("cells",),
preset="quick")``, cached) at batch 1 (the median of ``--singles`` calls, each another
snapshot) and at ``--big-batch``, with the package's orientation (``SKINNY_BATCH`` 16) and
with the wide one everywhere (0), interleaved over ``--rounds``: each setting's best, and
whether the answers agree.

    python benchmarks/screen_product.py --json out/screen_product.json
    python benchmarks/screen_product.py --locator --json out/screen_product_locator.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics in float64; the products are float32

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, labeled_snapshots, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import pipeline  # noqa: E402
from dmimo_jax.estimators import phasors  # noqa: E402


def skinny(rows, weights):
    """``rows @ weights``, then the squared sums transposed (B, N)."""
    b = weights.shape[1] // 2
    z = rows @ weights
    return (z[:, :b] ** 2 + z[:, b:] ** 2).T


def wide(rows, weights):
    """``weights^T rows^T`` (2B, N), then the squared sums (B, N)."""
    b = weights.shape[1] // 2
    z = jnp.einsum("mb,cm->bc", weights, rows)
    return z[:b] ** 2 + z[b:] ** 2


def best_ms(fn, args, calls, passes=7):
    """The best of ``passes`` passes of ``calls`` calls, ms a call (compiled first)."""
    jax.block_until_ready(fn(*args))
    best = np.inf
    for _ in range(passes):
        t0 = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        best = min(best, (time.perf_counter() - t0) / calls)
    return 1e3 * best


def locator_rows(args):
    """The quickstart's Locator with ``SKINNY_BATCH`` at 16 and at 0, interleaved (module
    docstring): one row per setting, ms a snapshot at batch 1 and ``--big-batch``."""
    scene = dj.paper_scene(-10.0, "concrete")
    x, r, nv = labeled_snapshots(scene, 50, 0)
    off = pipeline.run_offline(x, r, nv, scene, kinds=("cells",), preset="quick", seed=0)
    loc = dj.Locator.from_offline(off, "cells")
    big = args.big_batch
    rt = np.asarray(labeled_snapshots(scene, big + args.singles, 1, salt=10_000)[1])
    settings, rows, answers = (phasors.SKINNY_BATCH, 0), {}, {}
    try:
        for _ in range(args.rounds):
            for skinny in settings:
                phasors.SKINNY_BATCH = skinny
                jax.clear_caches()  # the programs traced again with this orientation
                loc(rt[:1]), loc(rt[:big])  # compiled
                times = []
                for i in range(args.singles):
                    t0 = time.perf_counter()
                    jax.block_until_ready(loc(rt[big + i : big + i + 1]).x)
                    times.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                answers[skinny] = jax.block_until_ready(loc(rt[:big]))
                batch = (time.perf_counter() - t0) / big
                row = rows.setdefault(skinny, dict(skinny_batch=skinny, device=device_name(),
                                                   b1_ms=np.inf, big_ms=np.inf))  # fmt: skip
                row["b1_ms"] = min(row["b1_ms"], 1e3 * statistics.median(times))
                row["big_ms"] = min(row["big_ms"], 1e3 * batch)
    finally:
        phasors.SKINNY_BATCH = settings[0]
        jax.clear_caches()
    a, b = answers[settings[0]], answers[0]
    for row in rows.values():
        row["big_batch"] = big
        row["same_statuses"] = bool(np.array_equal(np.asarray(a.status), np.asarray(b.status)))
        row["max_dx_m"] = float(np.max(np.abs(np.asarray(a.x) - np.asarray(b.x))))
        row["b1_over_package"] = row["b1_ms"] / rows[settings[0]]["b1_ms"]
        row["big_over_package"] = row["big_ms"] / rows[settings[0]]["big_ms"]
    return list(rows.values())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aps", type=int, nargs="*", default=[17, 23, 35], help="K")
    ap.add_argument("--points", type=int, nargs="*", default=[2197, 35152], help="N")
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 4, 16, 32, 64, 256])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--locator", action="store_true", help="the quickstart's Locator instead")
    ap.add_argument("--singles", type=int, default=40, help="with --locator: batch-1 calls")
    ap.add_argument("--big-batch", type=int, default=4096, help="with --locator")
    ap.add_argument("--rounds", type=int, default=3, help="with --locator: interleaved")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    for name in ("calls", "singles", "big_batch", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.locator:
        rows = locator_rows(args)
        print_table(
            rows,
            [
                ("skinny_batch", "SKINNY_BATCH", "d"),
                ("b1_ms", "ms b1", ".3f"),
                ("big_ms", "ms/snap big", ".4f"),
                ("b1_over_package", "b1 / package", ".2f"),
                ("big_over_package", "big / package", ".2f"),
                ("same_statuses", "same statuses", ""),
                ("max_dx_m", "max dx m", ".1e"),
            ],
        )
        write_json(args.json, rows)
        return
    rng = np.random.default_rng(0)
    fns = {"skinny": jax.jit(skinny), "wide": jax.jit(wide)}
    rows = []
    for k in args.aps:
        for n in args.points:
            table = jnp.asarray(rng.random((n, 2 * k)), jnp.float32)
            for b in args.batches:
                weights = jnp.asarray(rng.random((2 * k, 2 * b)), jnp.float32)
                a, w = fns["skinny"](table, weights), fns["wide"](table, weights)
                row = dict(aps=k, points=n, batch=b, device=device_name(),
                           max_rel_diff=float(jnp.max(jnp.abs(a - w) / jnp.abs(w))))  # fmt: skip
                for name, fn in fns.items():
                    row[f"{name}_ms"] = best_ms(fn, (table, weights), args.calls)
                row["wide_over_skinny"] = row["wide_ms"] / row["skinny_ms"]
                rows.append(row)
                print(row, flush=True)
    print_table(
        rows,
        [
            ("aps", "K", "d"),
            ("points", "N", "d"),
            ("batch", "B", "d"),
            ("skinny_ms", "rows@w ms", ".4f"),
            ("wide_ms", "w^T rows^T ms", ".4f"),
            ("wide_over_skinny", "ratio", ".2f"),
            ("max_rel_diff", "max rel diff", ".1e"),
        ],
    )
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
