"""Locality at building scale: halls of the paper's AP density (17 per 100 m^2) from 10 m to
40 m, all-AP against tiles of K APs each, side by side in one run.

Per world (:func:`dmimo_jax.datasets.hall_scene`; the 10 m hall has the paper's 17 APs on
a jittered grid, not its layout): the tiling (:func:`dmimo_jax.tiles.tile_aps`, tiles of
``--tile`` m, the ``"bound"`` rule at ``--factor``: K and each tile's worst bound ratio),

* the exhaustive search's phasor table at lambda/4: all-AP bytes (grid x 2M x 4) against
  the tiles' (sum over tiles of grid x 2K x 4) and one tile's;
* ``peb_map`` per position: eq. (14) with the dense (M, M) EFIM (eq. 13b, as before) against
  the O(M) form (:func:`dmimo_jax.bounds.fim_from_jacobian`, what ``peb_map`` runs now);
* the exact MLE over tiles (:func:`dmimo_jax.tiles.tiled_egs`, tables prebuilt): the
  tables' build seconds, ms per snapshot at ``--num`` snapshots, RMSE over the all-AP PEB
  and over the tile's K-AP PEB, p99 error over the PEB, the share within 5 PEB (the right
  lobe); next to the all-AP EGS (``dmimo_jax.egs`` on its table, refined) where that
  table is under ``--max-table-gb``;
* peak RSS;

and the fitted growth exponents (cost proportional to area^p) over the worlds, and between
each world and the next (the local exponent: K grows with the hall until far APs stop adding
to the all-AP bound).

Worlds too large to run here (``--tiling-sizes``, 80 and 160 m by default) are measured in
what sets their tables' size: the tiling (K, each tile's own need, seconds) and the bytes of
every table, counted from their grids as the size guards count them, not allocated.

    python benchmarks/scaling.py --json out/scaling.json
    python benchmarks/scaling.py --sizes 10 20 --num 32 --tiling-sizes
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import peak_rss_mb, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import tiles  # noqa: E402
from dmimo_jax.bounds import efim_from_variance, linearize, peb_from_fim  # noqa: E402
from dmimo_jax.datasets import hall_scene  # noqa: E402
from dmimo_jax.estimators import phasor_table, search_grid  # noqa: E402


@jax.jit
def dense_pebs(xs, model):
    """Eq. (14) through the dense (M, M) EFIM (what peb_map computed before)."""

    def one(x):
        _, h, var = linearize(x, model)
        return peb_from_fim(h.T @ efim_from_variance(var) @ h)

    return jax.vmap(one)(xs)


@jax.jit
def subset_pebs(xs, model, excluded):
    return jax.vmap(dj.bounds.subset_peb_unchecked, in_axes=(0, None, 0))(xs, model, excluded)


def timed(fn, repeats=3):
    jax.block_until_ready(fn())
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def table_bytes(model, spacing, region="ue"):
    return search_grid(model, spacing, region).size * 2 * model.num_aps * 4


def tiling_row(side, args):
    """A world's tiling and the bytes of its tables (counted, not allocated)."""
    scene = hall_scene(side, seed=args.seed)
    model = dj.TwoRayModel(scene)
    spacing = float(scene.wavelength) / 4
    row = dict(side_m=side, area_m2=side * side, num_aps=scene.num_aps)
    t0 = time.perf_counter()
    tiling = tiles.tile_aps(scene, args.tile, factor=args.factor)
    row.update(
        tiles=tiling.num_tiles,
        k=tiling.num_aps,
        need_median=float(np.median(tiling.need)),
        need_p90=float(np.quantile(tiling.need, 0.9)),
        worst_ratio=float(tiling.ratio.max()),
        tiling_s=time.perf_counter() - t0,
    )
    subs = [dj.TwoRayModel(tiles.tile_scene(scene, tiling, t)) for t in range(tiling.num_tiles)]
    row["all_table_bytes"] = table_bytes(model, spacing)
    tile_bytes = [table_bytes(s, spacing) for s in subs]
    row["tiled_table_bytes"] = int(np.sum(tile_bytes))
    row["one_tile_bytes"] = int(max(tile_bytes))
    return scene, model, spacing, tiling, row


def world_row(side, args):
    scene, model, spacing, tiling, row = tiling_row(side, args)
    # peb_map per position: dense EFIM against O(M), same positions
    xs = dj.sample_positions(jax.random.key(3), args.peb_points, scene)
    t_dense = timed(lambda: dense_pebs(xs, model))
    t_fast = timed(lambda: dj.peb_map(xs, model))
    row["peb_dense_us"] = 1e6 * t_dense / args.peb_points
    row["peb_us"] = 1e6 * t_fast / args.peb_points
    # the exact MLE over tiles
    x, r, _, _ = dj.measure.labeled_snapshots(jax.random.key(args.seed + 1), model, args.num)
    t0 = time.perf_counter()
    tables = tiles.tile_tables(scene, tiling, spacing)
    jax.block_until_ready(tables.tables.data)
    row["tables_s"] = time.perf_counter() - t0
    run = lambda: tiles.tiled_egs(r, scene, tiling, tables=tables).x  # noqa: E731
    row["tiled_ms_per_snapshot"] = 1e3 * timed(run, args.repeats) / args.num
    out = tiles.tiled_egs(r, scene, tiling, tables=tables)
    tables = None  # freed before the all-AP table
    err = np.linalg.norm(np.asarray(out.x) - np.asarray(x), axis=1)
    peb_all = np.asarray(dj.peb_map(x, model))
    excluded = np.ones((args.num, scene.num_aps), bool)
    for i, t in enumerate(np.asarray(out.tile)):
        excluded[i, tiling.aps[t]] = False
    peb_k = np.asarray(subset_pebs(x, model, jnp.asarray(excluded)))
    row.update(
        rmse_over_peb=float(np.sqrt(np.mean(err**2)) / np.mean(peb_all)),
        rmse_over_k_peb=float(np.sqrt(np.mean(err**2)) / np.mean(peb_k)),
        p99_over_peb=float(np.quantile(err / peb_all, 0.99)),
        right_lobe=float(np.mean(err < 5 * peb_all)),
        certified=float(np.mean(np.asarray(out.certified))),
    )
    if row["all_table_bytes"] <= args.max_table_gb * 2**30:
        table = phasor_table(model, search_grid(model, spacing, "ue"))

        def plain():
            found = dj.egs(r, model, table)
            return dj.refine_batch(found.x, r, model, num_steps=25).x

        row["all_ms_per_snapshot"] = 1e3 * timed(plain, args.repeats) / args.num
        del table
    row["peak_rss_mb"] = peak_rss_mb()
    print(row, flush=True)
    return row


def local_exponents(rows, keys):
    """p between each world and the next: {key: [p(w0 -> w1), p(w1 -> w2), ...]}."""
    out = {}
    for key in keys:
        ps = []
        for a, b in zip(rows, rows[1:], strict=False):
            if a.get(key) and b.get(key):
                ps.append(float(np.log(b[key] / a[key]) / np.log(b["area_m2"] / a["area_m2"])))
        out[key] = ps
    return out


def exponents(rows, keys):
    """p of cost = c * area^p, fitted by least squares on log-log over the worlds."""
    area = np.log([r["area_m2"] for r in rows])
    out = {}
    for key in keys:
        vals = [r.get(key) for r in rows]
        if len(rows) >= 2 and all(v is not None and v > 0 for v in vals):
            out[key] = float(np.polyfit(area, np.log(vals), 1)[0])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=float, nargs="*", default=[10.0, 20.0, 40.0], help="m")
    ap.add_argument(
        "--tiling-sizes", type=float, nargs="*", default=[80.0, 160.0],
        help="worlds measured by their tiling and tables' bytes only, m",
    )  # fmt: skip
    ap.add_argument("--tile", type=float, default=5.0, help="tile side, m")
    ap.add_argument("--factor", type=float, default=2.0, help="the tiles' bound factor")
    ap.add_argument("--num", type=int, default=64, help="test snapshots per world")
    ap.add_argument("--peb-points", type=int, default=2048, help="positions of peb_map")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-table-gb", type=float, default=2.0, help="all-AP EGS up to this")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = [world_row(side, args) for side in args.sizes]
    larger = []
    for side in args.tiling_sizes:
        larger.append(tiling_row(side, args)[-1])
        print(larger[-1], flush=True)
    print_table(
        rows,
        [
            ("side_m", "side m", ".0f"),
            ("num_aps", "M", "d"),
            ("tiles", "tiles", "d"),
            ("k", "K", "d"),
            ("need_median", "need med", ".0f"),
            ("worst_ratio", "K/all PEB", ".2f"),
            ("all_table_bytes", "all table B", ".3g"),
            ("tiled_table_bytes", "tiles B", ".3g"),
            ("peb_dense_us", "PEB dense us", ".1f"),
            ("peb_us", "PEB O(M) us", ".1f"),
            ("tables_s", "tables s", ".1f"),
            ("tiled_ms_per_snapshot", "tiled ms", ".1f"),
            ("all_ms_per_snapshot", "all-AP ms", ".1f"),
            ("rmse_over_peb", "RMSE/PEB", ".2f"),
            ("rmse_over_k_peb", "RMSE/K-PEB", ".2f"),
            ("right_lobe", "right lobe", ".3f"),
            ("peak_rss_mb", "RSS MiB", ".0f"),
        ],
    )
    keys = ["all_table_bytes", "tiled_table_bytes", "peb_dense_us", "peb_us", "tables_s",
            "tiled_ms_per_snapshot", "all_ms_per_snapshot"]  # fmt: skip
    fit = exponents(rows, keys)
    print("growth exponents (cost ~ area^p):", {k: round(v, 2) for k, v in fit.items()})
    if larger:
        print_table(
            larger,
            [
                ("side_m", "side m", ".0f"),
                ("num_aps", "M", "d"),
                ("tiles", "tiles", "d"),
                ("k", "K", "d"),
                ("need_median", "need med", ".0f"),
                ("need_p90", "need p90", ".0f"),
                ("worst_ratio", "K/all PEB", ".2f"),
                ("tiling_s", "tiling s", ".1f"),
                ("all_table_bytes", "all table B", ".3g"),
                ("tiled_table_bytes", "tiles B", ".3g"),
            ],
        )
    every = sorted(rows + larger, key=lambda r: r["area_m2"])
    bytes_keys = ["all_table_bytes", "tiled_table_bytes", "k", "need_median", "tiling_s"]
    local = local_exponents(every, bytes_keys)
    print(
        "local exponents, world to world:", {k: [round(p, 2) for p in v] for k, v in local.items()}
    )
    write_json(
        args.json,
        dict(rows=rows, larger=larger, exponents=fit, local_exponents=local, settings=vars(args)),
    )


if __name__ == "__main__":
    main()
