"""The learned stage of a floor too large to run whole on this machine, measured on a sample of
its tiles: the tiles' GP fits and offline stages over the host's devices, each sampled
tile's Locator on test snapshots inside it.

The floor (:func:`dmimo_jax.datasets.hall_scene` of side ``--side``, the paper's AP
density; 5 m tiles by the ``"bound"`` rule at ``--factor``) and its labels at
``--labels-per-m2`` from the two-ray truth are built whole; ``--sample`` tiles spread over
it (the first, the last and evenly between: corners, edges and the interior) are then run
as a building of their own (:meth:`dmimo_jax.tiles.Tiling.take`): their GP fits
(:func:`dmimo_jax.tiles.fit_tiles`, the tiles split over ``jax.devices()``), their offline
stages (:func:`dmimo_jax.pipeline.tile_offlines`, ``--together`` classifiers a program,
sharded over the devices) and, per tile, its :class:`dmimo_jax.Locator` on its K APs over
``--num`` test snapshots drawn uniformly in the tile. The tile classifier (which ranks the
tiles) is not trained: each row goes to its own tile (the 20 and 40 m halls'
``benchmarks/tiled_locator.py`` measures the classifier: it names the right tile first for
95% of the rows).

With ``--ring``, each sampled tile's answers are then refined on its ring of
``round(--ring * K)`` APs nearest its centre (:func:`dmimo_jax.pipeline.refine_on_ring`,
the ring's GP at the tiles' hyperparameters: what :class:`dmimo_jax.pipeline.TiledLocator`
does with ``ring``), the same rows without it reported beside (``*_no_ring``).

Reported: the tiling's time and K, seconds and peak RSS of each stage, the whole floor's
tile stages extrapolated from the sample's time per tile (labelled so), and over the
sampled tiles' rows: RMSE over the all-AP PEB (eq. 13) and over the tile's K-AP PEB
(accepted rows), p99 over the PEB, the share within 5 PEB and the share accepted.

    XLA_FLAGS=--xla_force_host_platform_device_count=4 \\
        python benchmarks/floor_sample.py --json out/floor_sample.json
    python benchmarks/floor_sample.py --side 20 --sample 2 --num 32   # a smoke run
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
from scaling import subset_pebs  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import pipeline, tiles  # noqa: E402
from dmimo_jax.datasets import hall_scene  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", type=float, default=80.0, help="the floor's side, m")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample", type=int, default=8, help="tiles run")
    ap.add_argument("--tile", type=float, default=5.0, help="tile side, m")
    ap.add_argument("--factor", type=float, default=2.0, help="the tiles' bound factor")
    ap.add_argument("--labels-per-m2", type=float, default=0.5)
    ap.add_argument("--margin", type=float, default=tiles.LABEL_MARGIN, help="GP labels, m")
    ap.add_argument("--tile-samples", type=int, default=200_000, help="per tile's classifier")
    ap.add_argument("--hidden", type=int, nargs="*", default=[512, 512, 512])
    ap.add_argument("--together", type=int, default=4, help="classifiers trained as one")
    ap.add_argument("--num", type=int, default=64, help="test snapshots per sampled tile")
    ap.add_argument("--ring", type=float, default=0.0, help="refine on rings of this x K APs")
    ap.add_argument("--cache", type=pathlib.Path, default=None, help="default: a temporary one")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    cache = args.cache or pathlib.Path(tempfile.mkdtemp(prefix="floor-"))
    devices = jax.devices()
    scene = hall_scene(args.side, seed=args.seed)
    truth = dj.TwoRayModel(scene)
    row = dict(side_m=args.side, seed=args.seed, num_aps=scene.num_aps, devices=len(devices))
    t0 = time.perf_counter()
    tiling = tiles.tile_aps(scene, args.tile, factor=args.factor)
    row.update(tile_aps_s=time.perf_counter() - t0, tiles=tiling.num_tiles, k=tiling.num_aps)
    sample = np.unique(np.round(np.linspace(0, tiling.num_tiles - 1, args.sample)).astype(int))
    part = tiling.take(sample)
    area = float(np.prod(np.asarray(scene.ue_high - scene.ue_low)[:2]))
    num_labels = int(round(args.labels_per_m2 * area))
    lab = dj.measure.labeled_snapshots(jax.random.key(1000 + args.seed), truth, num_labels)
    per_tile = tiles.label_count(part, scene, num_labels, args.margin)
    row.update(labels=num_labels, labels_per_tile=per_tile, sampled=sample.tolist())

    t0 = time.perf_counter()
    models = tiles.fit_tiles(lab.x, lab.r, lab.variance, scene, part, num_labels=per_tile,
                             devices=devices, progress=args.progress)  # fmt: skip
    jax.block_until_ready(models.models)
    row.update(fit_s=time.perf_counter() - t0, fit_rss_mb=peak_rss_mb())
    cells = pipeline.TILE_CELLS  # its training; the width and the set size are flags
    cells = dataclasses.replace(cells, num_samples=args.tile_samples,
                                network=dataclasses.replace(cells.network, hidden=tuple(args.hidden)))  # fmt: skip
    t0 = time.perf_counter()
    offs = pipeline.tile_offlines(lab.x, lab.r, lab.variance, scene, part, models, cells=cells,
                                  cache_dir=cache, seed=args.seed, together=args.together,
                                  devices=devices, progress=args.progress)  # fmt: skip
    row.update(offline_s=time.perf_counter() - t0, offline_rss_mb=peak_rss_mb())
    # the tile stages scale with the tiles; the fits' hyperparameters and compiles do not
    row["tile_stages_s_extrapolated"] = row["offline_s"] / part.num_tiles * tiling.num_tiles

    ring = None
    if args.ring:
        size = min(int(round(args.ring * tiling.num_aps)), scene.num_aps)
        wide = tiles.tile_aps(scene, args.tile, rule="nearest", num_aps=size).take(sample)
        t0 = time.perf_counter()
        ring = tiles.fit_tiles(lab.x, lab.r, lab.variance, scene, wide, num_labels=per_tile,
                               params=models.params, devices=devices, progress=args.progress)  # fmt: skip
        jax.block_until_ready(ring.models)
        pipeline.checked_ring((wide, ring), part)  # the tiles' K APs first, as refine_on_ring reads
        row.update(ring_k=size, ring_fit_s=time.perf_counter() - t0, ring_rss_mb=peak_rss_mb())

    errs, plain_errs, pebs, peb_ks, accepted = [], [], [], [], []
    for i, off in enumerate(offs):
        key = jax.random.key(2000 + 7919 * args.seed + int(sample[i]))
        low, high = part.low[i], part.high[i]
        x = np.asarray(low + (high - low) * jax.random.uniform(key, (args.num, 3)), float)
        test = dj.measure.labeled_snapshots(jax.random.fold_in(key, 1), truth, args.num, x=x)
        aps, r = part.aps[i], np.asarray(test.r)
        loc = dj.Locator.from_offline(off)
        out = loc(r[:, aps])
        answer = np.array(out.x, float)
        plain_errs.append(np.linalg.norm(answer - x, axis=1))
        if ring is not None:  # the accepted answers with no AP left out, as TiledLocator
            fine = np.asarray(out.accepted) & ~np.asarray(out.excluded).any(axis=1)
            answer[fine] = pipeline.refine_on_ring(
                answer[fine], r[np.ix_(fine, wide.aps[i])], ring.tile(i), part.num_aps,
                cost_gate=loc.settings.cost_gate,
            )[0]  # fmt: skip
        errs.append(np.linalg.norm(answer - x, axis=1))
        pebs.append(np.asarray(dj.peb_map(x, truth)))
        excluded = np.ones((args.num, scene.num_aps), bool)
        excluded[:, aps] = False
        peb_ks.append(np.asarray(subset_pebs(x, truth, excluded)))
        accepted.append(np.asarray(out.accepted))
    peb, peb_k, ok = (np.concatenate(v) for v in (pebs, peb_ks, accepted))

    def stats(errs, suffix=""):  # over the accepted rows of every sampled tile
        err = np.concatenate(errs)
        rmse = float(np.sqrt(np.mean(err[ok] ** 2)))
        return {
            f"rmse_over_peb{suffix}": rmse / float(np.mean(peb[ok])),
            f"rmse_over_k_peb{suffix}": rmse / float(np.mean(peb_k[ok])),
            f"p99_over_peb{suffix}": float(np.quantile(err / peb, 0.99)),
            f"within_5_peb{suffix}": float(np.mean(err < 5 * peb)),
            f"per_tile_rmse_over_peb{suffix}": [
                float(np.sqrt(np.mean(e[a] ** 2)) / np.mean(p[a]))
                for e, p, a in zip(errs, pebs, accepted, strict=True)
            ],
        }

    row.update(stats(errs), accepted=float(np.mean(ok)), peak_rss_mb=peak_rss_mb())
    if ring is not None:
        row.update(stats(plain_errs, "_no_ring"))
    print(row, flush=True)
    print_table(
        [row],
        [
            ("side_m", "side m", ".0f"),
            ("num_aps", "M", "d"),
            ("tiles", "tiles", "d"),
            ("k", "K", "d"),
            ("devices", "devices", "d"),
            ("labels_per_tile", "n", "d"),
            ("fit_s", "fit s", ".0f"),
            ("offline_s", "offline s", ".0f"),
            ("tile_stages_s_extrapolated", "all tile stages s (extrap.)", ".0f"),
            ("ring_k", "ring", "d"),
            ("rmse_over_peb", "RMSE/PEB", ".2f"),
            ("rmse_over_peb_no_ring", "no ring", ".2f"),
            ("rmse_over_k_peb", "RMSE/K-PEB", ".2f"),
            ("p99_over_peb", "p99/PEB", ".1f"),
            ("within_5_peb", "<5 PEB", ".3f"),
            ("accepted", "accepted", ".3f"),
            ("peak_rss_mb", "RSS MiB", ".0f"),
        ],
    )
    write_json(args.json, dict(rows=[row], settings={k: str(v) for k, v in vars(args).items()}))


if __name__ == "__main__":
    main()
