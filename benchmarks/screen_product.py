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
whether the answers agree. With ``--hall SIDE`` too, the tiled stage of
``benchmarks/tiled_locator.py``'s hall (cached under ``--cache``) and its first tile's
Locator, at 256 rows and ``--big-batch``.

    python benchmarks/screen_product.py --json out/screen_product.json
    python benchmarks/screen_product.py --locator --json out/screen_product_locator.json
    python benchmarks/screen_product.py --locator --hall 40 --cache CACHE --json out/sp40.json
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


def quickstart_subjects(args):
    """The quickstart's Locator: ``{name: (call, snapshots, single)}`` at batch 1 and
    ``--big-batch``."""
    scene = dj.paper_scene(-10.0, "concrete")
    x, r, nv = labeled_snapshots(scene, 50, 0)
    off = pipeline.run_offline(x, r, nv, scene, kinds=("cells",), preset="quick", seed=0)
    loc = dj.Locator.from_offline(off, "cells")
    big = args.big_batch
    rt = np.asarray(labeled_snapshots(scene, big + args.singles, 1, salt=10_000)[1])
    return {"b1": (loc, rt[big:], True), "big": (loc, rt[:big], False)}


def hall_subjects(args):
    """The tiled stage of ``benchmarks/tiled_locator.py``'s hall of side ``--hall`` (its
    offline stage cached under ``--cache``) and the Locator of its first tile, each at 256
    rows and ``--big-batch`` (the hall's snapshots; the tile's own)."""
    import tiled_locator as halls

    ap = argparse.ArgumentParser()
    halls.hall_arguments(ap)
    hall = halls.hall_settings(ap.parse_args(["--cache", args.cache]))
    scene, tiling, _, off, _, _ = halls.hall_offline(args.hall, hall)
    loc = pipeline.TiledLocator.from_offline(off, tries=3)
    one, big = loc.locators[0], args.big_batch
    draw = lambda seed, model: np.asarray(  # noqa: E731
        dj.measure.labeled_snapshots(jax.random.key(seed), model, big).r
    )
    r = draw(3000, dj.TwoRayModel(scene))
    mine = draw(4000, dj.TwoRayModel(dj.tiles.tile_scene(scene, tiling, 0)))
    return {"tiled_256": (loc, r[:256], False), "tiled_big": (loc, r, False),
            "tile_256": (one, mine[:256], False), "tile_big": (one, mine, False)}  # fmt: skip


def locator_rows(subjects, args):
    """Each of ``subjects`` with ``SKINNY_BATCH`` at 16 and at 0, interleaved over
    ``--rounds`` (module docstring): one row per setting, each subject's best ms a snapshot
    (a single snapshot's: the median of ``--singles`` calls, each another snapshot), its
    ratio to the package's setting, and whether the batched subjects' answers agree (each
    subject's statuses equal, the largest position difference over them)."""
    settings, rows, answers = (phasors.SKINNY_BATCH, 0), {}, {}
    try:
        for _ in range(args.rounds):
            for skinny in settings:
                phasors.SKINNY_BATCH = skinny
                jax.clear_caches()  # the programs traced again with this orientation
                row = rows.setdefault(skinny, dict(skinny_batch=skinny, device=device_name()))
                for name, (call, r, single) in subjects.items():
                    call(r[:1] if single else r)  # compiled
                    if single:
                        times = []
                        for i in range(args.singles):
                            t0 = time.perf_counter()
                            jax.block_until_ready(call(r[i : i + 1]).x)
                            times.append(time.perf_counter() - t0)
                        ms = 1e3 * statistics.median(times)
                    else:
                        t0 = time.perf_counter()
                        answers[skinny, name] = jax.block_until_ready(call(r))
                        ms = 1e3 * (time.perf_counter() - t0) / r.shape[0]
                    row[f"{name}_ms"] = min(row.get(f"{name}_ms", np.inf), ms)
    finally:
        phasors.SKINNY_BATCH = settings[0]
        jax.clear_caches()
    pairs = [(answers[settings[0], n], answers[0, n]) for n in subjects if (0, n) in answers]
    same = all(np.array_equal(np.asarray(a.status), np.asarray(b.status)) for a, b in pairs)
    dx = max(float(np.max(np.abs(np.asarray(a.x) - np.asarray(b.x)))) for a, b in pairs)
    for row in rows.values():
        row["same_statuses"], row["max_dx_m"] = same, dx
        for name in subjects:
            row[f"{name}_over_package"] = row[f"{name}_ms"] / rows[settings[0]][f"{name}_ms"]
    return list(rows.values()), list(subjects)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aps", type=int, nargs="*", default=[17, 23, 35], help="K")
    ap.add_argument("--points", type=int, nargs="*", default=[2197, 35152], help="N")
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 4, 16, 32, 64, 256])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--locator", action="store_true", help="the quickstart's Locator instead")
    ap.add_argument("--hall", type=float, default=None,
                    help="with --locator: a hall of this side instead (tiled_locator.py's)")  # fmt: skip
    ap.add_argument("--cache", default=None, help="with --hall: its offline stage's cache")
    ap.add_argument("--singles", type=int, default=40, help="with --locator: batch-1 calls")
    ap.add_argument("--big-batch", type=int, default=4096, help="with --locator")
    ap.add_argument("--rounds", type=int, default=3, help="with --locator: interleaved")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    for name in ("calls", "singles", "big_batch", "rounds"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.locator:
        subjects = hall_subjects(args) if args.hall else quickstart_subjects(args)
        rows, names = locator_rows(subjects, args)
        columns = [("skinny_batch", "SKINNY_BATCH", "d")]
        for name in names:
            columns += [
                (f"{name}_ms", f"{name} ms", ".4f"),
                (f"{name}_over_package", "ratio", ".2f"),
            ]
        columns += [("same_statuses", "same statuses", ""), ("max_dx_m", "max dx m", ".1e")]
        print_table(rows, columns)
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
