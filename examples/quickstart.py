"""dmimo_jax quickstart: the whole offline/online method on the paper's scene, in minutes.

Offline: L labeled snapshots of the true two-ray channel -> the shared GP phase model
(eqs. 23-25) -> a synthetic training set (eq. 26) -> POPT trained with the ``cpu`` preset
(cached: a second run loads it). Online, on random test snapshots: POPT's coarse estimate
-> the safeguard window -> refinement with the GP PhaseModel, next to the matched MLE
(lambda/8 EGS + refinement with the true analytic model) and the PEB.

    python examples/quickstart.py
    python examples/quickstart.py --material wood --power-dbm -20 --num-train 100 --json out/q.json
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics and estimation in float64 (entry point)

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _localization import (  # noqa: E402
    MLE,
    Learned,
    labeled_snapshots,
    plot_cdfs,
    print_rows,
    row,
    test_snapshots,
)
from _output import pyplot, save_figure, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import pipeline  # noqa: E402


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--material", default="concrete", choices=dj.materials.material_names())
    ap.add_argument("--num-train", type=int, default=50, help="L, labeled GP snapshots")
    ap.add_argument("--num-test", type=int, default=256)
    ap.add_argument("--num-samples", type=int, default=None, help="synthetic set (default: preset)")
    ap.add_argument("--preset", default="cpu", choices=["cpu", "paper"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cache", type=pathlib.Path, default=pathlib.Path("cache"))
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/quickstart"))
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    t_start = time.perf_counter()

    scene = dj.paper_scene(args.power_dbm, args.material)
    print(f"dmimo_jax {dj.__version__} on {jax.devices()[0].platform}: {scene}")
    print(f"[1/4] offline: L = {args.num_train} labeled snapshots -> GP -> synthetic set -> POPT")
    x, r, nv = labeled_snapshots(scene, args.num_train, args.seed)
    off = pipeline.run_offline(
        x,
        r,
        nv,
        scene,
        kinds=("popt",),
        preset=args.preset,
        num_samples=args.num_samples,
        cache_dir=args.cache,
        seed=args.seed,
    )
    info = off.info["popt"]
    print(
        f"      cache {off.cache}; POPT validation RMSE {info['val_rmse_m']:.3f} m, "
        f"safeguard radius {off.radii['popt']:.2f} m"
    )

    print(f"[2/4] {args.num_test} random test snapshots, PEB")
    xt, rt = test_snapshots(scene, args.num_test, args.seed)
    pebs = np.asarray(dj.peb_map(xt, scene))

    print("[3/4] matched MLE: lambda/8 EGS + refinement with the true analytic model")
    t0 = time.perf_counter()
    mle = MLE(scene, float(scene.wavelength) / 8)
    rows = [row("MLE (l/8, matched)", xt, *mle(rt), pebs, time.perf_counter() - t0)]

    print("[4/4] POPT -> safeguard -> refinement with the GP PhaseModel")
    t0 = time.perf_counter()
    rows.append(
        row(
            f"POPT ({args.preset}) + GP",
            xt,
            *Learned(off, "popt")(rt),
            pebs,
            time.perf_counter() - t0,
        )
    )
    wall = time.perf_counter() - t_start
    for rw in rows:
        rw.update(
            total_wall_s=wall, power_dbm=args.power_dbm, material=args.material, L=args.num_train
        )
    print()
    print_rows(rows)
    print(f"\nwall time {wall:.1f} s")
    plt = pyplot()
    if plt is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        fig = plot_cdfs(
            plt,
            rows,
            args.out / "error_cdf.png",
            f"{args.material}, P = {args.power_dbm:g} dBm, L = {args.num_train}",
        )
        save_figure(fig, args.out / "error_cdf.png")
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
