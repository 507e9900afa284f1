"""Does POPT learn phase-only positioning at this compute? Coarse error vs region size.

The ``cpu`` preset's POPT reaches only ~2.8 m coarse RMSE on the paper's 9 x 9 x 3 m UE
region: the phases repeat every ~lambda/2 = 19 cm, so the region holds ~1e5 ambiguity
cells and the paper spends ~2,000x this preset's compute to learn them. This script
keeps the preset (network, loop, sample count, epochs) and shrinks the UE region around
the paper's test UE [6.5, 5.0, 2.0] m to a cube of half-width h, with the synthetic
phases of the true two-ray model (so that only learning is measured, not GP modeling).
For each h it reports the coarse RMSE next to the "predict the centre" RMSE
(h / sqrt(3) per axis) and the fraction of test UEs within 10 cm, the start distance
from which refinement alone always found the right basin (docs/learning_measurements.md).

Resumable: each finished h is stored in ``<out>/results.json``.

    python examples/popt_region_scaling.py                       # h in 0.25, 0.5, 1.0 m
    python examples/popt_region_scaling.py --half-widths 0.25 --num-samples 20000
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _helpers import pyplot, save_figure, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.benchmarking import read_rows  # noqa: E402
from dmimo_jax.learning import synthesize  # noqa: E402
from dmimo_jax.learning.popt import POPT  # noqa: E402
from dmimo_jax.learning.presets import PRESETS  # noqa: E402
from dmimo_jax.learning.train import TrainConfig, train  # noqa: E402

CENTRE = np.array([6.5, 5.0, 2.0])


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--half-widths", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    ap.add_argument("--num-samples", type=int, default=None, help="default: the cpu preset's")
    ap.add_argument("--epochs", type=int, default=None, help="default: the cpu preset's")
    ap.add_argument("--num-test", type=int, default=1024)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/popt_region_scaling"))
    args = ap.parse_args(argv)
    for h in args.half_widths:
        if not 0 < h <= 1.5:
            raise ValueError(
                f"--half-widths must be in (0, 1.5] m (the region's z extent), got {h}"
            )
    preset = PRESETS["cpu"]
    num = args.num_samples or preset.num_samples
    config = preset.train
    if args.epochs is not None:
        config = TrainConfig(**{**config.__dict__, "epochs": args.epochs})
    args.out.mkdir(parents=True, exist_ok=True)
    store = args.out / "results.json"
    rows = read_rows(store) if store.exists() else []
    done = {(r["half_width_m"], r["num_samples"], r["epochs"]) for r in rows}

    scene = dj.paper_scene()
    truth = dj.TwoRayModel(scene)
    for h in args.half_widths:
        if (h, num, config.epochs) in done:
            print(f"h = {h} m: done (cached in {store})")
            continue
        low, high = CENTRE - h, CENTRE + h
        k_train, k_test = jax.random.split(jax.random.key(args.seed))
        data = synthesize(k_train, truth, num, region=(low, high))
        test = synthesize(k_test, truth, args.num_test, region=(low, high))
        net = POPT(scene.num_aps, preset.popt, low=low, high=high, rngs=nnx.Rngs(args.seed))
        t0 = time.perf_counter()
        train(net, data, config)
        seconds = time.perf_counter() - t0
        error = nnx.jit(lambda m, r, x: m.error(r, x))  # one program, not op by op
        err = np.asarray(error(net, jnp.asarray(test.r), jnp.asarray(test.x)), np.float64)
        centre_rmse = float(np.sqrt(np.mean(np.sum((np.asarray(test.x) - CENTRE) ** 2, -1))))
        rows.append(
            dict(
                half_width_m=h,
                num_samples=num,
                epochs=config.epochs,
                coarse_rmse_m=float(np.sqrt(np.mean(err**2))),
                coarse_median_m=float(np.median(err)),
                within_10cm=float(np.mean(err < 0.1)),
                centre_rmse_m=centre_rmse,
                train_seconds=seconds,
                samples_per_second=config.epochs
                * len(data.x)
                * (1 - config.val_fraction)
                / seconds,
            )
        )
        store.write_text(json.dumps(rows, indent=1))
        r = rows[-1]
        print(
            f"h = {h} m: coarse RMSE {r['coarse_rmse_m']:.3g} m (median {r['coarse_median_m']:.3g}, "
            f"{100 * r['within_10cm']:.1f}% within 10 cm) vs centre {centre_rmse:.3g} m; "
            f"{seconds:.0f} s",
            flush=True,
        )
    rows = sorted(
        (r for r in rows if r["num_samples"] == num and r["epochs"] == config.epochs),
        key=lambda r: r["half_width_m"],
    )
    print(f"{'h [m]':>6} {'coarse RMSE m':>14} {'median m':>9} {'<10 cm':>7} {'centre m':>9}")
    for r in rows:
        print(
            f"{r['half_width_m']:>6.2f} {r['coarse_rmse_m']:>14.4f} {r['coarse_median_m']:>9.4f} "
            f"{100 * r['within_10cm']:>6.1f}% {r['centre_rmse_m']:>9.3f}"
        )
    plt = pyplot()
    if plt is not None and rows:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        hs = [r["half_width_m"] for r in rows]
        ax.plot(hs, [r["coarse_rmse_m"] for r in rows], "-o", label="POPT (cpu preset), coarse")
        ax.plot(hs, [r["centre_rmse_m"] for r in rows], "k--", label="predict the centre")
        ax.axhline(0.1, color="grey", ls=":", label="10 cm (refinement basin)")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("half-width h of the UE cube [m]")
        ax.set_ylabel("coarse RMSE [m]")
        ax.set_title(f"{num} samples x {config.epochs} epochs")
        save_figure(fig, args.out / "popt_region_scaling.png")
    write_json(args.out / "popt_region_scaling.json", rows)
    return rows


if __name__ == "__main__":
    main()
