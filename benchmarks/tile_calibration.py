"""The GP at building scale: the shared GP of Sec. III fitted per tile on local training pairs
(:func:`dmimo_jax.tiles.fit_tiles`) against the dense fit (:func:`dmimo_jax.gp.fit` on every
label and every AP), side by side in one run, on halls of the paper's AP density.

Per world (:func:`dmimo_jax.datasets.hall_scene`) and seed: L labeled snapshots at the
paper's label density (``--labels-per-m2``, 0.5: 50 per 100 m^2) at -10 dBm from the
scene's two-ray physics (the correct ITU permittivity, unknown to the GP), the tiling
(tiles of ``--tile`` m, the ``"bound"`` rule at ``--factor``; each tile's GP on the labels
within ``--margin`` m of it, :func:`dmimo_jax.tiles.label_count`), and

* the tiled calibration: seconds, peak RSS, the hyperparameters;
* each model's error at ``--num`` test positions (its mean phase against the physics at the
  tile's APs, the common part, a CPO, removed; RMS over the APs, median and p90 over the
  positions), next to the LoS model's (no GP);
* the exact MLE over tiles on the fitted tiles' tables (:func:`dmimo_jax.tiles.tiled_egs`,
  ``fine="tile"``): RMSE over the all-AP PEB and over the tile's K-AP PEB, p99 over the
  PEB, the share within lambda/8 (the right lobe: the next one is about lambda/2 away; a
  GP's model error of the order of the phase noise puts answers beyond 5 PEB without a
  wrong lobe);
* where L x M is at most ``--dense-max-pairs`` (the dense fit of 180 labels x 68 APs of the
  20 m hall passed 20 GB of memory on a 24 GB machine): the dense fit's seconds, its model error, and
  the all-AP EGS on its tables (:func:`dmimo_jax.egs` + :func:`dmimo_jax.refine_batch`);

and the fitted growth exponents (cost proportional to area^p) over the worlds. Peak RSS is
the process's high-water mark so far (worlds run smallest first).

    python benchmarks/tile_calibration.py --json out/tile_calibration.json
    python benchmarks/tile_calibration.py --sizes 10 20 --seeds 0 1
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import peak_rss_mb, print_table, write_json  # noqa: E402
from scaling import exponents, subset_pebs  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import gp, tiles  # noqa: E402
from dmimo_jax.datasets import hall_scene  # noqa: E402
from dmimo_jax.estimators import phasor_table, search_grid  # noqa: E402


def model_errors(means, truth, xs, aps):
    """Per position: the RMS over its APs ``aps[i]`` of ``means[i]`` minus the physics'
    mean phase, their common part (absorbed by the CPO) removed, rad."""
    out = []
    for mean, x, a in zip(means, xs, aps, strict=True):
        d = np.asarray(mean) - np.asarray(truth.mean(x))[a]
        d = np.angle(np.exp(1j * (d - np.angle(np.mean(np.exp(1j * d))))))
        out.append(np.sqrt(np.mean(d**2)))
    return np.asarray(out)


def tile_of(tiling, xs):
    """The tile holding each position (the first on a shared edge)."""
    xs = np.asarray(xs)[:, None, :2]
    inside = np.all((xs >= tiling.low[None, :, :2]) & (xs <= tiling.high[None, :, :2]), axis=2)
    return np.argmax(inside, axis=1)


def world_row(side, seed, args):
    scene = hall_scene(side, seed=seed)
    truth = dj.TwoRayModel(scene)
    spacing = float(scene.wavelength) / 4
    lobe = float(scene.wavelength) / 8
    num_labels = int(
        round(args.labels_per_m2 * float(np.prod(np.asarray(scene.ue_high - scene.ue_low)[:2])))
    )
    row = dict(
        side_m=side, seed=seed, area_m2=side * side, num_aps=scene.num_aps, labels=num_labels
    )
    tiling = tiles.tile_aps(scene, args.tile, factor=args.factor)
    per_tile = tiles.label_count(tiling, scene, num_labels, args.margin)
    per_tile = min(max(per_tile, args.min_labels_per_tile), num_labels)
    row.update(tiles=tiling.num_tiles, k=tiling.num_aps, labels_per_tile=per_tile)
    lab = dj.measure.labeled_snapshots(jax.random.key(1000 + seed), truth, num_labels)
    test = dj.measure.labeled_snapshots(jax.random.key(2000 + seed), truth, args.num)
    t0 = time.perf_counter()
    fits = tiles.fit_tiles(
        lab.x, lab.r, lab.variance, scene, tiling, num_labels=per_tile, progress=args.progress
    )
    jax.block_until_ready(fits.models)
    row["tiled_fit_s"] = time.perf_counter() - t0
    row["tiled_fit_rss_mb"] = peak_rss_mb()
    home = tile_of(tiling, test.x)
    means = [fits.tile(t).mean(x) for t, x in zip(home, test.x, strict=True)]
    err = model_errors(means, truth, test.x, tiling.aps[home])
    los = [gp.los_phase(x, scene)[tiling.aps[t]] for t, x in zip(home, test.x, strict=True)]
    los_err = model_errors(los, truth, test.x, tiling.aps[home])
    row.update(
        tiled_model_err_median=float(np.median(err)),
        tiled_model_err_p90=float(np.quantile(err, 0.9)),
        los_model_err_median=float(np.median(los_err)),
    )
    t0 = time.perf_counter()
    tables = tiles.tile_tables(scene, tiling, spacing, models=fits.models)
    jax.block_until_ready(tables.tables.data)
    row["tables_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = tiles.tiled_egs(test.r, scene, tiling, tables=tables, fine="tile")
    jax.block_until_ready(out.x)
    row["tiled_ms_per_snapshot"] = 1e3 * (time.perf_counter() - t0) / args.num
    del tables
    e = np.linalg.norm(np.asarray(out.x) - np.asarray(test.x), axis=1)
    peb_all = np.asarray(dj.peb_map(test.x, truth))
    excluded = np.ones((args.num, scene.num_aps), bool)
    for i, t in enumerate(np.asarray(out.tile)):
        excluded[i, tiling.aps[t]] = False
    peb_k = np.asarray(subset_pebs(test.x, truth, jnp.asarray(excluded)))
    rmse = float(np.sqrt(np.mean(e**2)))
    row.update(
        tiled_rmse_over_peb=rmse / float(np.mean(peb_all)),
        tiled_rmse_over_k_peb=rmse / float(np.mean(peb_k)),
        tiled_p99_over_peb=float(np.quantile(e / peb_all, 0.99)),
        tiled_right_lobe=float(np.mean(e < lobe)),
    )
    if num_labels * scene.num_aps <= args.dense_max_pairs:
        t0 = time.perf_counter()
        fit = gp.fit(lab.x, lab.r, lab.variance, scene)
        exact = gp.GPPhaseModel.from_fit(fit, lab.x, lab.r, lab.variance, scene)
        dense = gp.TabulatedGPModel.from_model(exact)  # with eq. (27)'s variance, as the tiles
        jax.block_until_ready(dense.values)
        row["dense_fit_s"] = time.perf_counter() - t0
        row["dense_fit_rss_mb"] = peak_rss_mb()
        every = np.broadcast_to(np.arange(scene.num_aps), (args.num, scene.num_aps))
        derr = model_errors([dense.mean(x) for x in test.x], truth, test.x, every)
        row.update(
            dense_model_err_median=float(np.median(derr)),
            dense_model_err_p90=float(np.quantile(derr, 0.9)),
        )
        table = phasor_table(dense, search_grid(dense, spacing, "ue"))
        found = dj.egs(test.r, dense, table)
        del table
        x = dj.refine_batch(found.x, test.r, dense, num_steps=25).x
        de = np.linalg.norm(np.asarray(x) - np.asarray(test.x), axis=1)
        row["dense_rmse_over_peb"] = float(np.sqrt(np.mean(de**2)) / np.mean(peb_all))
        row["dense_p99_over_peb"] = float(np.quantile(de / peb_all, 0.99))
        row["dense_right_lobe"] = float(np.mean(de < lobe))
    print(row, flush=True)
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="*", default=[10.0, 20.0, 40.0], help="m")
    ap.add_argument("--seeds", type=int, nargs="*", default=[0])
    ap.add_argument("--tile", type=float, default=5.0, help="tile side, m")
    ap.add_argument(
        "--margin", type=float, default=tiles.LABEL_MARGIN, help="labels this far around a tile, m"
    )
    ap.add_argument("--factor", type=float, default=2.0, help="the tiles' bound factor")
    ap.add_argument("--labels-per-m2", type=float, default=0.5, help="the paper's: 0.5")
    ap.add_argument("--num", type=int, default=64, help="test snapshots per world")
    ap.add_argument("--min-labels-per-tile", type=int, default=16)
    ap.add_argument("--dense-max-pairs", type=int, default=4000, help="dense fit up to L*M")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = [world_row(side, seed, args) for side in args.sizes for seed in args.seeds]
    print_table(
        rows,
        [
            ("side_m", "side m", ".0f"),
            ("seed", "seed", "d"),
            ("num_aps", "M", "d"),
            ("labels", "L", "d"),
            ("k", "K", "d"),
            ("labels_per_tile", "n", "d"),
            ("tiled_fit_s", "tiled fit s", ".1f"),
            ("dense_fit_s", "dense fit s", ".1f"),
            ("tiled_model_err_median", "tiled err rad", ".2e"),
            ("dense_model_err_median", "dense err rad", ".2e"),
            ("los_model_err_median", "LoS err rad", ".2e"),
            ("tiled_rmse_over_peb", "tiled RMSE/PEB", ".2f"),
            ("tiled_rmse_over_k_peb", "RMSE/K-PEB", ".2f"),
            ("dense_rmse_over_peb", "dense RMSE/PEB", ".2f"),
            ("tiled_p99_over_peb", "p99/PEB", ".1f"),
            ("tiled_right_lobe", "right lobe", ".3f"),
            ("tiled_fit_rss_mb", "RSS MiB", ".0f"),
        ],
    )
    first = [r for r in rows if r["seed"] == args.seeds[0]]
    fit = exponents(first, ["tiled_fit_s", "dense_fit_s", "tables_s", "tiled_ms_per_snapshot"])
    print("growth exponents (cost ~ area^p):", {k: round(v, 2) for k, v in fit.items()})
    write_json(args.json, dict(rows=rows, exponents=fit, settings=vars(args)))


if __name__ == "__main__":
    main()
