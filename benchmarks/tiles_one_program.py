"""Every tile in one program: three ways to run the tiled stage's first pass, timed side by
side with the way the package runs it (one call per tile) and one tile's Locator alone.

The first pass of :class:`dmimo_jax.pipeline.tiled.TiledLocator` runs each snapshot in its
most likely tile by the cost gate alone (the tiles' Locators without rescues), one call per
tile: a batch spread over T tiles is T small calls. Tiles of one size share one tree and
shape, so their Locators stack into one pytree (leaves with a leading tile axis), and one
program could serve the whole batch. On the hall of ``benchmarks/tiled_locator.py`` (its
options, its cache), per batch of the test snapshots repeated, ms per snapshot of:

* ``tile by tile``: each tile's rows in its own call (what the package ran before the shared
  screen, and runs with ``shared_screen=False``);
* ``all tiles``: ``jax.vmap(Locator.program)`` over the stacked Locators, each tile's rows
  padded to the most any tile has (a power of 2); its answers' largest difference from tile
  by tile is printed (the same computation);
* ``jobs``: the rows in jobs of ``--job-width`` rows of one tile, the program vmapped over
  the jobs with each job's Locator indexed out of the stacked leaves (``a[t]``: XLA
  materializes each job's copy of the tables that the loops read); only batches up to
  ``--jobs-max``;
* ``one tile``: the tile with the most rows, its own Locator on as many of its own rows.

Then a tile's Locator indexed out of the stacked leaves inside a program (``a[t]``, ``t``
traced), against its own Locator, at batches 1, 4 and 16: what one program for every tile
costs per call where the tables are read in loops.

    python benchmarks/tiles_one_program.py --cache out/tiled-cache --json out/tiles_one_program.json
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import print_table, write_json  # noqa: E402
from tiled_locator import hall_arguments, hall_offline, hall_settings  # noqa: E402

from dmimo_jax.pipeline import Locator, tiled  # noqa: E402


@partial(jax.jit, static_argnums=2)
def all_tiles(stacked, r, capacity, counts):
    """(T, n, K) rows, tile t's in its Locator: one program over every tile."""
    return jax.vmap(Locator.program, in_axes=(0, 0, None, 0))(stacked, r, capacity, counts)


def index(stacked, t):
    return jax.tree.map(lambda a: a[t], stacked)


@partial(jax.jit, static_argnums=3)
def jobs(stacked, job_tile, r, capacity, counts):
    """(J, w, K) rows, job j's in tile ``job_tile[j]``'s Locator, indexed per job."""
    one = lambda t, rj, n: Locator.program(index(stacked, t), rj, capacity, n)
    return jax.vmap(one)(job_tile, r, counts)


@partial(jax.jit, static_argnums=3)
def indexed(stacked, t, r, capacity, count):
    """Tile ``t``'s program with its Locator indexed out of the stacked leaves."""
    return Locator.program(index(stacked, t), r, capacity, count)


def best_of(fn, repeats=3):
    """The fastest of ``repeats`` calls after one to compile, seconds."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return min(times)


def padded(rows, size):
    """``rows`` (n, K) padded to ``size`` by repeats of the last."""
    return np.concatenate([rows, np.repeat(rows[-1:], size - len(rows), axis=0)])


def batch_row(loc, quick, stacked, r, args):
    aps, num_tiles = loc.aps, len(quick)
    first = loc.ranked_tiles(r)[:, 0]
    counts = np.bincount(first, minlength=num_tiles)
    b = len(r)
    mine = [r[first == t][:, aps[t]] for t in range(num_tiles)]
    apart = lambda: [quick[t](mine[t]).x for t in range(num_tiles) if counts[t]]
    row = dict(batch=b, tiles_hit=int(np.sum(counts > 0)), most=int(counts.max()))
    row["tile_by_tile_ms"] = 1e3 * best_of(apart) / b
    width = 1 << int(np.ceil(np.log2(counts.max())))
    rt = np.stack([padded(m, width) if len(m) else np.zeros((width, aps.shape[1])) for m in mine])
    capacity = quick[0].capacity_for(width)
    call = lambda: all_tiles(stacked, rt, capacity, counts.astype(np.int32))
    row["all_tiles_ms"] = 1e3 * best_of(call) / b
    row["all_tiles_slots"] = num_tiles * width
    x_all = np.asarray(call().x)
    x_apart = apart()
    diffs = [np.abs(x_all[t, : counts[t]] - np.asarray(x)).max()
             for t, x in zip(np.flatnonzero(counts), x_apart, strict=True)]  # fmt: skip
    row["all_tiles_max_diff_m"] = float(max(diffs))
    if b <= args.jobs_max:
        w = args.job_width
        job_tile, job_rows = [], []
        for t in np.flatnonzero(counts):
            for s in range(0, counts[t], w):
                job_tile.append(t)
                job_rows.append(padded(mine[t][s : s + w], w))
        n = np.array([min(w, counts[t] - s) for t in np.flatnonzero(counts)
                      for s in range(0, counts[t], w)], np.int32)  # fmt: skip
        call = lambda: jobs(stacked, np.asarray(job_tile, np.int32), np.stack(job_rows),
                            quick[0].capacity_for(w), n)  # fmt: skip
        row["jobs_ms"] = 1e3 * best_of(call, repeats=1) / b
        row["jobs"] = len(job_tile)
    t = int(np.argmax(counts))
    own = np.resize(mine[t], (b, aps.shape[1]))
    row["one_tile_ms"] = 1e3 * best_of(lambda: quick[t](own).x) / b
    for name in ("tile_by_tile", "all_tiles", "jobs"):
        if f"{name}_ms" in row:
            row[f"{name}_over_one"] = row[f"{name}_ms"] / row["one_tile_ms"]
    print(row, flush=True)
    return row


def indexed_rows(loc, quick, stacked, r):
    first = loc.ranked_tiles(r)[:, 0]
    t = int(np.bincount(first).argmax())
    mine = r[first == t][:, loc.aps[t]]
    rows = []
    for b in (1, 4, 16):
        rb = mine[:b]
        cap = quick[t].capacity_for(b)
        call = lambda rb=rb, cap=cap: indexed(stacked, np.int32(t), rb, cap, np.int32(len(rb)))
        rows.append(dict(batch=b, indexed_ms=1e3 * best_of(call, 5),
                         own_ms=1e3 * best_of(lambda rb=rb: quick[t](rb).x, 5)))  # fmt: skip
        rows[-1]["indexed_over_own"] = rows[-1]["indexed_ms"] / rows[-1]["own_ms"]
        print(rows[-1], flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=float, default=20.0, help="hall side, m")
    hall_arguments(ap)
    ap.add_argument("--batches", type=int, nargs="*", default=[256, 4096])
    ap.add_argument("--job-width", type=int, default=16)
    ap.add_argument("--jobs-max", type=int, default=256, help="the largest batch run as jobs")
    ap.add_argument("--json", default=None)
    args = hall_settings(ap.parse_args(argv))
    _, _, test, off, world, _ = hall_offline(args.side, args)
    loc = tiled.TiledLocator.from_offline(off)
    quick = loc.quick
    stacked = jax.tree.map(lambda *a: jnp.stack(a), *quick)
    r = np.asarray(test.r)
    rows = [batch_row(loc, quick, stacked, np.resize(r, (b, r.shape[1])), args)
            for b in args.batches]  # fmt: skip
    print_table(rows, [("batch", "batch", "d"), ("tiles_hit", "tiles hit", "d"),
                       ("most", "most rows", "d"), ("tile_by_tile_ms", "tile by tile", ".3f"),
                       ("all_tiles_ms", "all tiles", ".3f"), ("all_tiles_slots", "slots", "d"),
                       ("jobs_ms", "jobs", ".3f"), ("one_tile_ms", "one tile", ".3f"),
                       ("tile_by_tile_over_one", "x one", ".2f"),
                       ("all_tiles_over_one", "all x one", ".2f"),
                       ("jobs_over_one", "jobs x one", ".2f")])  # fmt: skip
    small = indexed_rows(loc, quick, stacked, r)
    print_table(small, [("batch", "batch", "d"), ("indexed_ms", "indexed ms", ".2f"),
                        ("own_ms", "own ms", ".2f"), ("indexed_over_own", "ratio", ".2f")])  # fmt: skip
    write_json(args.json, dict(world=world, batches=rows, indexed=small,
                               settings={k: str(v) for k, v in vars(args).items()}))  # fmt: skip
    return rows, small


if __name__ == "__main__":
    main()
