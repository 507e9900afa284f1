"""Table II: FLOPs, coarse-stage inference time and fine RMSE of every method, one table.

Reuses the benchmarks: ``benchmarks/egs_flops.py`` (MLE at lambda/2, lambda/4, lambda/8:
the paper's FLOP formula, XLA's count, single-snapshot time) and
``benchmarks/popt_latency.py`` (POPT, MLP, HI: formula/XLA FLOPs, single-snapshot time,
median and std over the runs), and the fine RMSEs of ``fig5bc_localization.py`` (random UEs
and CPOs, P = -10 dBm) where that has been run (MLE lambda/2 and lambda/4: the fixed test
point of ``egs_flops.py``). Each benchmark's JSON is kept and reused (resumable).

    python examples/paper/table2_complexity.py --quick     # lambda/2, lambda/4 EGS; 100 latency runs
    python examples/paper/table2_complexity.py             # lambda/8 too; 1280 latency runs
"""

from __future__ import annotations

import argparse
import json
import pathlib
import runpy
import sys

import dmimo_jax as dj
from dmimo_jax.benchmarking import read_rows  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _bench(script: str, argv: list[str], out: pathlib.Path) -> list[dict]:
    if not out.exists():
        sys.path.insert(0, str(ROOT / "benchmarks"))
        saved = sys.argv
        sys.argv = [script, *argv, "--json", str(out)]
        try:
            runpy.run_path(str(ROOT / "benchmarks" / script), run_name="__main__")
        finally:
            sys.argv = saved
    return read_rows(out)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/table2"))
    ap.add_argument(
        "--fig5", type=pathlib.Path, default=pathlib.Path("out/fig5_localization/results.json")
    )
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "quick" if args.quick else "full"
    egs = _bench("egs_flops.py", ["--quick"] if args.quick else [], args.out / f"egs_{tag}.json")
    lat = _bench(
        "popt_latency.py", ["--quick"] if args.quick else [], args.out / f"latency_{tag}.json"
    )
    fine = {}
    if args.fig5.exists():
        fine = {r["method"]: r["fine_rmse_m"] for r in read_rows(args.fig5)}

    rows = []
    wavelength = float(dj.paper_scene().wavelength)  # the benchmarks' scene
    for r in egs:
        if r["method"] != "table":
            continue
        div = round(wavelength / r["spacing_m"])
        name = f"MLE (lambda/{div})"
        rmse = fine.get("MLE beta=1.00") if div == 8 else None
        rows.append(
            dict(
                method=name,
                flops=r["flops_paper"],
                flops_xla=r["flops_xla"],
                ms_mean=r["ms_per_snapshot_single"],
                ms_std=r.get("ms_single_std"),
                ms_batched=r["ms_per_snapshot_batched"],
                fine_rmse_m=rmse if rmse is not None else r["fine_rmse_m"],
                fine_rmse_source="fig5 random UEs" if rmse is not None else "test point",
            )
        )
    # the paper-size POPT is timed but trained only on a GPU; the cpu-preset POPT is what
    # fig5bc_localization.py trained and refined here
    names = {"POPT": None, "POPT cpu-preset": "POPT L=50", "MLP": "MLP L=50", "HI": "HI L=50"}
    for r in lat:
        if r["framework"] != "jax" or r["batch"] != 1 or r["method"] not in names:
            continue
        batched = next(
            q
            for q in lat
            if q["method"] == r["method"] and q["framework"] == "jax" and q["batch"] > 1
        )
        rows.append(
            dict(
                method=r["method"],
                flops=r.get("flops_paper", r["flops_formula"]),
                flops_xla=r["flops_xla"],
                ms_mean=r["ms_mean"],
                ms_std=r["ms_std"],
                ms_batched=batched["ms_median"],
                fine_rmse_m=fine.get(names[r["method"]] or ""),
                fine_rmse_source="fig5 random UEs",
            )
        )
    print(
        f"{'method':<16} {'FLOPs (paper)':>14} {'FLOPs XLA':>11} {'ms mean +- std (B=1)':>22} "
        f"{'ms/snap batched':>15} {'fine RMSE um':>13}"
    )
    for r in rows:
        rm = "-" if r["fine_rmse_m"] is None else f"{r['fine_rmse_m'] * 1e6:.1f}"
        sd = "" if r["ms_std"] is None else f" +- {r['ms_std']:.3f}"
        xla = "-" if r["flops_xla"] is None else f"{r['flops_xla']:.3g}"
        print(
            f"{r['method']:<16} {r['flops']:>14.3g} {xla:>11} {r['ms_mean']:>12.3f}{sd:<10} "
            f"{r['ms_batched']:>15.4f} {rm:>13}"
        )
    (args.out / "table2.json").write_text(json.dumps(rows, indent=1))
    print(f"wrote {args.out / 'table2.json'}")
    return rows


if __name__ == "__main__":
    main()
