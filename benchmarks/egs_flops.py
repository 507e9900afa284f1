"""FLOPs and time of the exhaustive grid search (eq. 18), side by side with a plain baseline.

For each grid spacing delta in {lambda/2, lambda/4, lambda/8} over the paper's room box
(V = 10 x 10 x 4 m = 400 m^3) and P = -10 dBm (float64 physics):

  plain   : the table-free jitted grid search (``egs(r, model, grid)``: model phases and the
            LS cost at every point, chunked scan). The baseline for the speed-up ratio.
  table   : the paper's lookup table (``phasor_table``) with the certified float32
            coherence screen and exact float64 re-rank (``egs(r, model, table)``).
  hier-*  : beyond the paper, ``coarse_to_fine``: coarse table screen, then Levenberg-
            Marquardt from the best K points. ``agree_with_lambda8`` is the fraction of
            the random snapshots whose estimate is within 1 mm of lambda/8 EGS + refinement.

Columns: ``flops_paper`` = 57 * M * V / delta^3 per snapshot (the paper's count);
``flops_xla`` = what XLA's cost analysis reports for the compiled search per snapshot
(compiled as a single chunk, because XLA counts a loop body once; null where XLA gives
none); ``ms_per_snapshot_single`` (batch of 1) and ``ms_per_snapshot_batched`` (amortized
over ``batch``), medians over repeats after a separate compile call (``compile_s``);
``fine_rmse_m``: RMSE of search + refinement at the paper's test point (UE [6.5, 5, 2] m,
CPO pi/2, matched eps_r) over noise realizations, next to its PEB; ``peak_rss_mb``: the
process peak after the row (rows run from light to heavy, so it bounds the row).

    python benchmarks/egs_flops.py --quick                  # < 1 min: lambda/2, lambda/4
    python benchmarks/egs_flops.py --json out/egs.json      # full: + lambda/8, batch 1280
"""

from __future__ import annotations

import argparse
import pathlib
import time
from functools import partial

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    device_name,
    peak_rss_mb,
    print_table,
    summarize,
    time_call,
    write_json,
)
from tqdm import tqdm  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import estimators as est  # noqa: E402
from dmimo_jax.benchmarking import check_options, read_rows  # noqa: E402
from dmimo_jax.complexity import egs_flops_paper, egs_flops_xla  # noqa: E402

TEST_POINT = np.array([6.5, 5.0, 2.0])


def fixed_point_snapshots(scene, n: int, seed: int):
    """The paper's test: UE [6.5, 5, 2] m, CPO pi/2 at every AP, n noise realizations."""
    xs = jnp.broadcast_to(jnp.asarray(TEST_POINT)[None, :], (n, 3))
    cpo = jnp.full((n,), jnp.pi / 2)
    return dj.simulate_phases_batch(jax.random.key(seed), scene, xs, cpo)


def rmse(x) -> float:
    return float(np.sqrt(np.mean(np.sum((np.asarray(x) - TEST_POINT[None, :]) ** 2, axis=1))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="lambda/2 and lambda/4 only, small batch")
    ap.add_argument("--batch", type=int, default=None, help="snapshots per batched call")
    ap.add_argument("--realizations", type=int, default=None, help="noise draws at the test point")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument(
        "--divisors",
        type=int,
        nargs="+",
        default=None,
        help="the plain and table rows' spacings lambda/d (default 2 4 with --quick, else 2 4 8)",
    )
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    ap.add_argument("--resume", action="store_true", help="keep rows already in --json")
    args = ap.parse_args(argv)
    batch = args.batch or (64 if args.quick else 1280)
    n_real = args.realizations or (50 if args.quick else 200)
    repeats = args.repeats or (3 if args.quick else 5)
    divisors = tuple(args.divisors or ((2, 4) if args.quick else (2, 4, 8)))
    check_options(divisors=divisors)

    scene = dj.paper_scene(power_dbm=args.power_dbm)
    model = dj.TwoRayModel(scene)
    lam, m = float(scene.wavelength), scene.num_aps
    volume = float(np.prod(np.asarray(scene.room_size)))
    device = device_name()
    peb = float(dj.peb(jnp.asarray(TEST_POINT), scene))
    print(f"device {device} ({len(jax.devices())} device(s)); M = {m}; V = {volume:g} m^3; ")
    print(f"P = {args.power_dbm} dBm; PEB at the test point {peb * 1e6:.2f} um; batch {batch}")

    xs = dj.sample_positions(jax.random.key(0), batch, scene)
    r = dj.simulate_phases_batch(
        jax.random.key(1), scene, xs, dj.random_cpos(jax.random.key(2), batch)
    )
    r_fixed = fixed_point_snapshots(scene, n_real, seed=3)

    rows: list[dict] = []
    if args.resume and args.json is not None and args.json.exists():
        rows = read_rows(args.json)
    done = {(row["method"], round(row["spacing_m"], 9)) for row in rows}

    def record(row):
        row.update(device=device, peak_rss_mb=peak_rss_mb(), peb_m=peb, power_dbm=args.power_dbm)
        rows.append(row)
        write_json(args.json, rows)

    plan = [("plain", d) for d in divisors] + [("table", d) for d in divisors]
    plan += [("hier-k16", 2), ("hier-k8", 4)]
    reference = None  # lambda/8 EGS + refinement of the random snapshots (for agreement)
    tables: dict[int, est.PhasorTable] = {}

    def table_for(div):
        if div not in tables:
            tables.clear()  # keep one table resident at a time
            tables[div] = est.phasor_table(model, est.search_grid(scene, lam / div))
            jax.block_until_ready(tables[div].data)
        return tables[div]

    for method, div in tqdm(plan, desc="egs_flops", unit="row"):
        spacing = lam / div
        grid = est.search_grid(scene, spacing)
        if (method, round(spacing, 9)) in done:
            continue
        row = dict(
            method=method,
            spacing_m=spacing,
            spacing=f"lambda/{div}",
            n_points=grid.size,
            flops_paper=egs_flops_paper(m, volume, spacing),
            batch=batch,
        )
        if method == "plain":
            plain_batch = 4
            first, t1 = time_call(partial(est.egs, r[:1], model, grid), max(1, repeats // 2))
            _, tb = time_call(partial(est.egs, r[:plain_batch], model, grid), 1)
            row.update(
                flops_xla=egs_flops_xla(model, grid, method="plain"),
                compile_s=first - min(t1),
                ms_per_snapshot_single=1e3 * summarize(t1)["median_s"],
                ms_single_std=1e3 * summarize(t1)["std_s"],
                ms_per_snapshot_batched=1e3 * tb[0] / plain_batch,
                batch=plain_batch,
                fine_rmse_m=None,  # same arg-min as 'table' (tests/test_grid.py)
            )
        elif method == "table":
            t0 = time.perf_counter()
            table = table_for(div)
            build_s = time.perf_counter() - t0
            first, t1 = time_call(partial(est.egs, r[:1], model, table), repeats)
            _, tb = time_call(partial(est.egs, r, model, table), max(1, repeats // 2))
            res = est.egs(r, model, table)
            fine_fixed = est.refine_batch(est.egs(r_fixed, model, table).x, r_fixed, model)
            row.update(
                flops_xla=egs_flops_xla(model, grid, batch=batch),
                table_build_s=build_s,
                table_mb=table.data.nbytes / 2**20,
                compile_s=first - min(t1),
                ms_per_snapshot_single=1e3 * summarize(t1)["median_s"],
                ms_single_std=1e3 * summarize(t1)["std_s"],
                ms_per_snapshot_batched=1e3 * summarize(tb)["median_s"] / batch,
                ms_batched_std=1e3 * summarize(tb)["std_s"] / batch,
                screened=float(jnp.mean(res.screened)),
                fine_rmse_m=rmse(fine_fixed.x),
            )
            row["fine_rmse_over_peb"] = row["fine_rmse_m"] / peb
            if div == 8:
                reference = est.refine_batch(res.x, r, model).x
        else:
            k = int(method.split("-k")[1])
            if reference is None and 8 in divisors:  # resumed past the lambda/8 row
                reference = est.refine_batch(est.egs(r, model, table_for(8)).x, r, model).x
            table = table_for(div)
            first, t1 = time_call(
                partial(est.coarse_to_fine, r[:1], model, table, num_starts=k), repeats
            )
            _, tb = time_call(
                partial(est.coarse_to_fine, r, model, table, num_starts=k), max(1, repeats // 2)
            )
            hx = est.coarse_to_fine(r, model, table, num_starts=k).x
            fixed = est.coarse_to_fine(r_fixed, model, table, num_starts=k).x
            row.update(
                flops_xla=None,  # the LM loop has a data-dependent accept/reject; see 'table'
                compile_s=first - min(t1),
                ms_per_snapshot_single=1e3 * summarize(t1)["median_s"],
                ms_per_snapshot_batched=1e3 * summarize(tb)["median_s"] / batch,
                ms_batched_std=1e3 * summarize(tb)["std_s"] / batch,
                num_starts=k,
                fine_rmse_m=rmse(fixed),
                agree_with_lambda8=None
                if reference is None
                else float(np.mean(np.linalg.norm(np.asarray(hx - reference), axis=1) < 1e-3)),
            )
            row["fine_rmse_over_peb"] = row["fine_rmse_m"] / peb
        record(row)

    rows.sort(key=lambda row: (row["method"], -row["spacing_m"]))
    plain = {row["spacing_m"]: row for row in rows if row["method"] == "plain"}
    for row in rows:
        base = plain.get(row["spacing_m"]) if row["method"] == "table" else None
        if base is not None:
            row["speedup_vs_plain"] = (
                base["ms_per_snapshot_batched"] / row["ms_per_snapshot_batched"]
            )
    print_table(
        rows,
        [
            ("method", "method", "s"),
            ("spacing", "delta", "s"),
            ("n_points", "points", "d"),
            ("flops_paper", "flops_paper", ".3g"),
            ("flops_xla", "flops_xla", ".3g"),
            ("ms_per_snapshot_single", "ms_single", ".2f"),
            ("ms_per_snapshot_batched", "ms_batched", ".2f"),
            ("speedup_vs_plain", "x_plain", ".1f"),
            ("fine_rmse_m", "rmse_m", ".3g"),
            ("fine_rmse_over_peb", "rmse/PEB", ".3f"),
            ("agree_with_lambda8", "agree_l8", ".4f"),
            ("peak_rss_mb", "rss_MB", ".0f"),
        ],
    )
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
