"""The learned online stage over tiles: a hall of the paper's AP density located tile by tile
(:class:`dmimo_jax.pipeline.tiled.TiledLocator`), its cost per snapshot next to one tile's
Locator in the same run.

Per world (:func:`dmimo_jax.datasets.hall_scene`, tiles of ``--tile`` m by the ``"bound"``
rule at ``--factor``; labels at ``--labels-per-m2`` from the two-ray truth; each tile's GP by
:func:`dmimo_jax.tiles.fit_tiles` on the labels within ``--margin`` m of it
(:func:`dmimo_jax.tiles.label_count`); every tile's offline stage and the tile classifier
by :func:`dmimo_jax.pipeline.tiled.run_offline_tiled` with a cell classifier of
``--tile-samples`` samples per tile):

* the offline stage's seconds (GP fits, the tiles' stages, the tile classifier) and peak RSS;
* the bytes of the tiles' tables (phasor and cell tables: what the online stage holds);
* with ``--ring``, each tile's ring of APs (``round(ring * K)`` nearest its centre) and its
  GP (the tiles' hyperparameters, conditioned on the ring's APs): the answers refined on it
  (:class:`~dmimo_jax.pipeline.tiled.TiledLocator`), its seconds and peak RSS, and the
  same tiles' answers without it side by side (the ``*_no_ring`` columns);
* on ``--num`` test snapshots of the truth: RMSE over the all-AP PEB (eq. 13) and over the
  K-AP PEB of the answering tile (accepted rows), p99 over the PEB, the share within 5 PEB
  (the right lobe), the share accepted by the cost gate and accepted beyond 5 PEB, the tile classifier's first tile right, rows
  answered by another tile than the classifier's first;
* ms per snapshot at batch 256, ``--big-batch`` and batch 1 (median over single
  snapshots), of the tiled stage on snapshots of the whole hall and of one tile's Locator
  (the tile answering most test rows) on snapshots of its own tile at its K APs, every
  batch of distinct snapshots (the ratio ``tiled_over_tile_*``: what tiling adds; the big
  batch's share rejected, ``big_rejected``: its rows that reach the rescues), the batches timed
  side by side, interleaved ``--repeats`` times, each the best of its repeats; and the
  programs compiled (each shared by every tile: per batch bucket, the Locator's and the
  shared screen's first pass);
* with ``--compare-gate-tries N``, the same batches with ``gate_tries=N`` (the tiles a row
  tries by the gate alone before the rescues of its others), timed in the same
  interleaving, and their big batch's share rejected;
* with ``--tile-by-tile``, the same batches with the first pass tile by tile
  (``shared_screen=False``: no ``TiledLocator.screen``), timed in the same interleaving,
  and whether its tiles and statuses are the same.

    python benchmarks/tiled_locator.py --sizes 20 --json out/tiled_locator.json
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import tempfile
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import peak_rss_mb, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import tiles  # noqa: E402
from dmimo_jax.datasets import hall_scene  # noqa: E402
from dmimo_jax.pipeline import tiled, tiled_screen  # noqa: E402

# the PEB of the APs not excluded at each position: the package's O(M) subset bound, vmapped
subset_pebs = jax.jit(jax.vmap(dj.bounds.subset_peb_unchecked, in_axes=(0, None, 0)))


def median_single_ms(fn, r, count):
    """The median of ``count`` single-snapshot calls (each another row), ms."""
    fn(r[:1])  # compiled
    times = []
    for i in range(1, count + 1):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(r[i : i + 1]).x)
        times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def batch_ms(fn, r, warm=True):
    """ms per snapshot of one call on the batch ``r`` (compiled first, unless not ``warm``)."""
    if warm:
        jax.block_until_ready(fn(r).x)
    t0 = time.perf_counter()
    jax.block_until_ready(fn(r).x)
    return 1e3 * (time.perf_counter() - t0) / r.shape[0]


def hall_labels(scene, tiling, args):
    """The hall's labeled snapshots (``--labels-per-m2`` of the two-ray truth) and the labels
    per tile (:func:`dmimo_jax.tiles.label_count` at ``--margin``)."""
    area = float(np.prod(np.asarray(scene.ue_high - scene.ue_low)[:2]))
    num_labels = int(round(args.labels_per_m2 * area))
    truth = dj.TwoRayModel(scene)
    lab = dj.measure.labeled_snapshots(jax.random.key(1000 + args.seed), truth, num_labels)
    return lab, tiles.label_count(tiling, scene, num_labels, args.margin)


def hall_ring(scene, tiling, models, args):
    """``(ring, seconds)``: each tile's ring of ``round(--ring * K)`` APs (at most M) and
    its :func:`dmimo_jax.tiles.fit_tiles` on the tile's labels at the hyperparameters of the
    tiles' ``models``; ``(None, 0)`` for ``--ring 0``."""
    if not args.ring:
        return None, 0.0
    size = min(int(round(args.ring * tiling.num_aps)), scene.num_aps)
    wide = tiles.tile_aps(scene, args.tile, rule="nearest", num_aps=size)
    lab, per_tile = hall_labels(scene, tiling, args)
    t0 = time.perf_counter()
    ring = tiles.fit_tiles(lab.x, lab.r, lab.variance, scene, wide, num_labels=per_tile,
                           params=models.params, progress=args.progress)  # fmt: skip
    jax.block_until_ready(ring.models)
    return (wide, ring), time.perf_counter() - t0


def hall_offline(side, args):
    """The hall of side ``side`` m, its tiles, labels, test snapshots and tiled offline stage
    (cached under ``args.cache``): ``(scene, tiling, test, off, row, models)``, ``row`` the
    world's columns so far (sizes, GP fit and offline seconds), ``models`` the tiles' GP."""
    scene = hall_scene(side, seed=args.seed)
    truth = dj.TwoRayModel(scene)
    tiling = tiles.tile_aps(scene, args.tile, factor=args.factor)
    lab, per_tile = hall_labels(scene, tiling, args)
    row = dict(side_m=side, num_aps=scene.num_aps, tiles=tiling.num_tiles, k=tiling.num_aps,
               worst_ratio=float(tiling.ratio.max()), labels=len(lab.x), labels_per_tile=per_tile)  # fmt: skip
    test = dj.measure.labeled_snapshots(jax.random.key(2000 + args.seed), truth, args.num)
    t0 = time.perf_counter()
    models = tiles.fit_tiles(lab.x, lab.r, lab.variance, scene, tiling, num_labels=per_tile,
                             progress=args.progress)  # fmt: skip
    jax.block_until_ready(models.models)
    row["fit_s"] = time.perf_counter() - t0
    cells = tiled.TILE_CELLS  # its training; the width and the set size are flags
    cells = dataclasses.replace(cells, num_samples=args.tile_samples,
                                network=dataclasses.replace(cells.network, hidden=args.hidden))  # fmt: skip
    net = tiled.TILE_CLASSIFIER
    net = dataclasses.replace(net, num_samples=args.net_samples,
                              network=dataclasses.replace(net.network, hidden=args.net_hidden),
                              train=dataclasses.replace(net.train, epochs=args.net_epochs))  # fmt: skip
    t0 = time.perf_counter()
    off = tiled.run_offline_tiled(lab.x, lab.r, lab.variance, scene, tiling, models,
                                  preset="quick", cells=cells, classifier=net, cache_dir=args.cache,
                                  seed=args.seed, progress=args.progress)  # fmt: skip
    row["offline_s"] = time.perf_counter() - t0
    return scene, tiling, test, off, row, models


def hall_arguments(ap):
    """The options that name a hall and its offline stage (``benchmarks/tiles_one_program.py``
    takes them too); ``--cache`` defaults to a temporary folder."""
    ap.add_argument("--tile", type=float, default=5.0, help="tile side, m")
    ap.add_argument("--factor", type=float, default=2.0, help="the tiles' bound factor")
    ap.add_argument("--labels-per-m2", type=float, default=0.5)
    ap.add_argument(
        "--margin",
        type=float,
        default=tiles.LABEL_MARGIN,
        help="each tile's GP: labels this far around it, m",
    )
    ap.add_argument("--tile-samples", type=int, default=200_000, help="per tile's classifier")
    ap.add_argument("--hidden", type=int, nargs="*", default=[512, 512, 512])
    ap.add_argument("--net-samples", type=int, default=600_000, help="the tile classifier's")
    ap.add_argument("--net-hidden", type=int, nargs="*", default=[1024, 1024, 1024])
    ap.add_argument(
        "--net-epochs", type=int, default=tiled.TILE_CLASSIFIER.train.epochs,
        help="the tile classifier's epochs",
    )  # fmt: skip
    ap.add_argument("--num", type=int, default=512, help="test snapshots")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=pathlib.Path, default=None, help="default: a temporary one")
    ap.add_argument("--progress", action="store_true")


def hall_settings(args):
    """``args`` completed: tuples of widths, a temporary cache folder if none was named."""
    args.hidden, args.net_hidden = tuple(args.hidden), tuple(args.net_hidden)
    if args.cache is None:
        args.cache = pathlib.Path(tempfile.mkdtemp(prefix="tiled-"))
    return args


def scores(out, x, peb, tiling, truth):
    """The answers ``out`` of the test rows (true positions ``x``, all-AP PEB ``peb``): RMSE
    of the accepted rows over the all-AP and the answering tile's K-AP PEB, p99 over the
    PEB, the shares within 5 PEB, accepted, and accepted beyond 5 PEB."""
    err = np.linalg.norm(np.asarray(out.x) - x, axis=1)
    excluded = np.ones((len(x), truth.num_aps), bool)
    for i, t in enumerate(out.tile):
        excluded[i, tiling.aps[t]] = False
    peb_k = np.asarray(subset_pebs(x, truth, excluded))
    ok = ~np.asarray(out.rejected)
    return dict(
        rmse_over_peb=float(np.sqrt(np.mean(err[ok] ** 2)) / np.mean(peb[ok])),
        rmse_over_k_peb=float(np.sqrt(np.mean(err[ok] ** 2)) / np.mean(peb_k[ok])),
        p99_over_peb=float(np.quantile(err / peb, 0.99)),
        right_lobe=float(np.mean(err < 5 * peb)),
        accepted=float(np.mean(ok)),
        accepted_wrong=float(np.mean(ok & (err >= 5 * peb))),
    )


def world_row(side, args):
    scene, tiling, test, off, row, models = hall_offline(side, args)
    truth = dj.TwoRayModel(scene)
    row["offline_rss_mb"] = peak_rss_mb()
    row["tile_net_miss"] = float(off.info["val_top_k_miss"])
    row["tiles_cell_miss_mean"] = float(
        np.mean([o.info["cells"]["val_top_k_miss"] for o in off.tiles])
    )
    ring, row["ring_fit_s"] = hall_ring(scene, tiling, models, args)
    row["ring_k"] = 0 if ring is None else ring[0].num_aps
    row["ring_rss_mb"] = peak_rss_mb()
    loc = tiled.TiledLocator.from_offline(off, tries=args.tries, gate_tries=args.gate_tries,
                                          ring=ring)  # fmt: skip
    leaves = [jax.tree.leaves(lc.table) for lc in loc.locators]  # the cells' table too
    row["tables_mb"] = sum(a.nbytes for ls in leaves for a in ls) / 2**20
    r, x = np.asarray(test.r), np.asarray(test.x)
    programs = lambda: dj.Locator.compiled_programs() + tiled_screen.compiled_programs()  # noqa: E731
    before = programs()
    t0 = time.perf_counter()
    out = loc(r)
    row["first_call_s"] = time.perf_counter() - t0
    row["programs"] = programs() - before
    peb = np.asarray(dj.peb_map(x, truth))
    row.update(scores(out, x, peb, tiling, truth))
    first = loc.ranked_tiles(r)[:, 0]
    home = np.all((x[:, None, :2] >= tiling.low[None, :, :2]) &
                  (x[:, None, :2] <= tiling.high[None, :, :2]), axis=2)  # fmt: skip
    row["first_tile_right"] = float(np.mean(home[np.arange(len(x)), first]))
    row["second_tile"] = float(np.mean(out.rank > 0))
    ok = ~np.asarray(out.rejected)
    if ring is not None:  # the same tiles without the ring, side by side
        plain = dataclasses.replace(loc, ring=None, ring_aps=None)
        bare = scores(plain(r), x, peb, tiling, truth)
        row.update({f"{k}_no_ring": v for k, v in bare.items()})
    # cost per snapshot: the tiled stage on snapshots of the whole hall against one tile's
    # Locator on snapshots of its own tile (a room's Locator on its room), every batch of
    # distinct snapshots (repeated rows read the same cells from the caches and flatter
    # one tile: docs/locality_measurements.md, "The ratio to one tile, measured again")
    t = int(np.bincount(out.tile[ok]).argmax())
    one = loc.locators[t]
    big = args.big_batch
    home = dj.TwoRayModel(tiles.tile_scene(scene, tiling, t))  # its K APs, its box
    mine = np.asarray(dj.measure.labeled_snapshots(jax.random.key(4000 + args.seed), home,
                                                   max(big, len(r))).r)  # fmt: skip
    bigr = np.asarray(dj.measure.labeled_snapshots(jax.random.key(3000 + args.seed), truth, big).r)
    row["big_rejected"] = float(np.mean(np.asarray(loc(bigr).rejected)))
    b = min(256, len(r))
    row["tiled_ms_b1"] = median_single_ms(loc, r, args.singles)
    row["tile_ms_b1"] = median_single_ms(one, mine, args.singles)
    bigm = mine[:big]
    timed = {"tiled_ms_b256": (loc, r[:b]), "tile_ms_b256": (one, mine[:b]),
             "tiled_ms_big": (loc, bigr), "tile_ms_big": (one, bigm)}  # fmt: skip
    if ring is not None:
        timed["tiled_ms_big_no_ring"] = (plain, bigr)
    if args.tile_by_tile:  # the first pass tile by tile (no shared screen), side by side
        apart = dataclasses.replace(loc, screen=None)
        both = apart(r)
        row["apart_same_tiles_statuses"] = bool(
            np.array_equal(both.tile, out.tile) and np.array_equal(both.status, out.status)
        )
        row["apart_max_dx_m"] = float(np.max(np.abs(np.asarray(both.x) - np.asarray(out.x))))
        timed.update(tiled_ms_b256_apart=(apart, r[:b]), tiled_ms_big_apart=(apart, bigr))
    other = args.compare_gate_tries
    if other is not None:  # the same batches with another gate_tries, side by side
        alt = dataclasses.replace(loc, gate_tries=other)
        row[f"big_rejected_gate{other}"] = float(np.mean(np.asarray(alt(bigr).rejected)))
        timed.update({f"tiled_ms_b256_gate{other}": (alt, r[:b]),
                      f"tiled_ms_big_gate{other}": (alt, bigr)})  # fmt: skip
    # side by side: every timing once per repeat, interleaved, each the best of its repeats
    for i in range(args.repeats):
        for key, (fn, rows) in timed.items():
            row[key] = min(row.get(key, np.inf), batch_ms(fn, rows, warm=i == 0))
    row["tiled_over_tile_big"] = row["tiled_ms_big"] / row["tile_ms_big"]
    row["tiled_over_tile_b256"] = row["tiled_ms_b256"] / row["tile_ms_b256"]
    if other is not None:
        row[f"gate{other}_over_tile_big"] = row[f"tiled_ms_big_gate{other}"] / row["tile_ms_big"]
    if args.tile_by_tile:
        row["shared_over_apart_big"] = row["tiled_ms_big"] / row["tiled_ms_big_apart"]
        row["shared_over_apart_b256"] = row["tiled_ms_b256"] / row["tiled_ms_b256_apart"]
    row["peak_rss_mb"] = peak_rss_mb()
    print(row, flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="*", default=[20.0], help="hall sides, m")
    hall_arguments(ap)
    ap.add_argument("--tries", type=int, default=2, help="tiles tried with the rescues")
    ap.add_argument(
        "--gate-tries", type=int, default=8, help="tiles tried by the gate alone (at most)"
    )  # fmt: skip
    ap.add_argument(
        "--compare-gate-tries", type=int, default=None,
        help="also time the batches with this gate_tries, side by side",
    )  # fmt: skip
    ap.add_argument(
        "--ring", type=float, default=0.0,
        help="refine on each tile's ring of this many times K APs (0: none)",
    )  # fmt: skip
    ap.add_argument("--singles", type=int, default=20, help="single-snapshot calls timed")
    ap.add_argument("--big-batch", type=int, default=4096, help="the large batch timed")
    ap.add_argument(
        "--repeats", type=int, default=3,
        help="batch timings interleaved this many times, each the best of them",
    )  # fmt: skip
    ap.add_argument(
        "--tile-by-tile", action="store_true",
        help="also time the first pass tile by tile (shared_screen=False), side by side",
    )  # fmt: skip
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    compare = args.compare_gate_tries
    if args.gate_tries < 1 or (compare is not None and compare < 1):
        ap.error("--gate-tries and --compare-gate-tries must be at least 1")
    args = hall_settings(args)
    rows = [world_row(side, args) for side in args.sizes]
    print_table(
        rows,
        [
            ("side_m", "side m", ".0f"),
            ("num_aps", "M", "d"),
            ("tiles", "tiles", "d"),
            ("k", "K", "d"),
            ("ring_k", "ring", "d"),
            ("offline_s", "offline s", ".0f"),
            ("tables_mb", "tables MiB", ".0f"),
            ("rmse_over_peb", "RMSE/PEB", ".2f"),
            ("rmse_over_peb_no_ring", "no ring", ".2f"),
            ("rmse_over_k_peb", "RMSE/K-PEB", ".2f"),
            ("right_lobe", "<5 PEB", ".3f"),
            ("right_lobe_no_ring", "no ring", ".3f"),
            ("accepted", "accepted", ".3f"),
            ("accepted_wrong", "acc. >5 PEB", ".3f"),
            ("accepted_wrong_no_ring", "no ring", ".3f"),
            ("first_tile_right", "tile right", ".3f"),
            ("tiled_ms_b256", "tiled ms b256", ".2f"),
            ("tile_ms_b256", "1 tile ms b256", ".2f"),
            ("tiled_ms_b1", "tiled ms b1", ".2f"),
            ("tile_ms_b1", "1 tile ms b1", ".2f"),
            ("tiled_ms_big", "tiled ms big", ".2f"),
            ("tile_ms_big", "1 tile ms big", ".2f"),
            ("tiled_over_tile_big", "ratio big", ".2f"),
            ("tiled_ms_big_no_ring", "no ring", ".2f"),
            ("tiled_ms_big_apart", "tile by tile", ".2f"),
            ("programs", "programs", "d"),
            ("peak_rss_mb", "RSS MiB", ".0f"),
        ],
    )
    write_json(args.json, dict(rows=rows, settings={k: str(v) for k, v in vars(args).items()}))


if __name__ == "__main__":
    main()
