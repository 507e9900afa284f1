"""Fig. 5(b, c) and the accuracy table: fine-error CDFs, coarse/fine RMSE next to the PEB.

Random test positions and CPOs at P = -10 dBm (concrete), the same test set for every
method: the MLE (lambda/8 EGS + refinement with the analytic model of
eps_r^(beta) = beta * eps_r, beta in {1.00, 1.01, 1.05, 1.10}), POPT trained on the GP of
L in {5, 10, 50} labeled snapshots (``cpu`` preset by default), and the MLP and HI
benchmarks (L = 50), all three refined online through the safeguard and the GP model.

Resumable: each method's result is stored in ``<out>/results.json`` as soon as it is done
and skipped on the next run; trained models are shared through the cache.

    python examples/paper/fig5bc_localization.py --quick          # 256 test positions, L = 50 only
    python examples/paper/fig5bc_localization.py                  # 1280 positions, all methods
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # examples/_helpers.py
from _helpers import (  # noqa: E402
    MLE,
    Learned,
    labeled_snapshots,
    plot_cdfs,
    print_rows,
    pyplot,
    row,
    save_figure,
    test_snapshots,
    write_json,
)

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import pipeline  # noqa: E402
from dmimo_jax.benchmarking import read_rows  # noqa: E402


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="256 test positions; POPT L = 50 only")
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--material", default="concrete")
    ap.add_argument("--num-test", type=int, default=None)
    ap.add_argument("--Ls", type=int, nargs="+", default=None)
    ap.add_argument("--betas", type=float, nargs="+", default=[1.00, 1.01, 1.05, 1.10])
    ap.add_argument("--benchmarks", nargs="*", default=["mlp", "hi"])
    ap.add_argument("--preset", default="cpu", choices=["cpu", "paper"])
    ap.add_argument("--num-samples", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--cache", type=pathlib.Path, default=None, help="default: the user cache directory"
    )
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/fig5_localization"))
    args = ap.parse_args(argv)
    num_test = args.num_test or (256 if args.quick else 1280)
    Ls = args.Ls or ([50] if args.quick else [5, 10, 50])
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "results.json"
    done = {r["method"]: r for r in read_rows(store)} if store.exists() else {}
    t_start = time.perf_counter()

    scene = dj.paper_scene(args.power_dbm, args.material)
    xt, rt = test_snapshots(scene, num_test, args.seed)
    pebs = np.asarray(dj.peb_map(xt, scene))

    def record(name, fn):
        if name in done and done[name]["num_test"] == num_test:
            print(f"{name}: done (cached in {store})")
            return
        print(f"{name} ...", flush=True)
        t0 = time.perf_counter()
        out = row(name, xt, *fn(rt), pebs, time.perf_counter() - t0)
        out.update(num_test=num_test, power_dbm=args.power_dbm, material=args.material)
        done[name] = out
        store.write_text(json.dumps(list(done.values())))

    for beta in args.betas:
        believed = scene.replace(eps_r=scene.eps_r * beta)  # the MLE's assumed permittivity
        record(f"MLE beta={beta:.2f}", MLE(believed, float(scene.wavelength) / 8))
    for L in Ls:
        kinds = ("popt", *args.benchmarks) if L == max(Ls) else ("popt",)
        x, r, nv = labeled_snapshots(scene, L, args.seed)
        off = pipeline.run_offline(
            x,
            r,
            nv,
            scene,
            kinds=kinds,
            preset=args.preset,
            num_samples=args.num_samples,
            cache_dir=args.cache,
            seed=args.seed,
        )
        record(f"POPT L={L}", Learned(off, "popt"))
        for kind in kinds[1:]:
            record(f"{kind.upper()} L={L}", Learned(off, kind))

    rows = [done[k] for k in done if done[k]["num_test"] == num_test]
    print()
    print_rows(rows)
    print(f"\nwall time {time.perf_counter() - t_start:.1f} s")
    plt = pyplot()
    if plt is not None:
        fig = plot_cdfs(
            plt,
            rows,
            None,
            f"Fig. 5(b): {args.material}, P = {args.power_dbm:g} dBm, {num_test} UEs",
        )
        save_figure(fig, args.out / "fig5b_cdf.png")
        fig, ax = plt.subplots(figsize=(8, 4))
        names = [r["method"] for r in rows]
        pos = np.arange(len(rows))
        ax.bar(pos - 0.27, [r["mean_peb_m"] for r in rows], 0.27, label="mean PEB")
        ax.bar(pos, [r["coarse_rmse_m"] for r in rows], 0.27, label="coarse RMSE")
        ax.bar(pos + 0.27, [r["fine_rmse_m"] for r in rows], 0.27, label="fine RMSE")
        ax.set_yscale("log")
        ax.set_ylabel("error [m]")
        ax.set_xticks(pos, names, rotation=30, ha="right")
        ax.set_title("Fig. 5(c): mean PEB, coarse and fine RMSE")
        save_figure(fig, args.out / "fig5c_bars.png")
    write_json(
        args.out / "table.json", [{k: v for k, v in r.items() if k != "errors_m"} for r in rows]
    )
    return rows


if __name__ == "__main__":
    main()
