"""Cost of the image-source room model next to the two-ray model: a PEB map, side by side.

Rows (all float64, ``dj.peb_map`` over the same UE positions, jit + vmap; the models are
timed in turn within each repeat and the ratio is the median of the per-repeat ratios):
  two_ray        : the paper's LoS + ground model (the reference, ratio 1)
  room_floor     : the image-source model with the floor alone (same physics)
  room_6         : floor, plasterboard ceiling, four concrete walls, first order
  room_6_order2  : the same room with every double bounce too

    python benchmarks/room_cost.py                 # 10 000 positions
    python benchmarks/room_cost.py --n 2000 --json out/room_cost.json
"""

from __future__ import annotations

import argparse
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    device_name,
    peak_rss_mb,
    print_table,
    summarize,
    time_call,
    write_json,
)

import dmimo_jax as dj  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000, help="number of UE positions")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--ceiling", default="plasterboard")
    ap.add_argument("--walls", default="concrete")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-order2", action="store_true", help="skip the second-order row")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)

    scene = dj.paper_scene(args.power_dbm, convention="itu")
    xs = dj.sample_positions(jax.random.key(args.seed), args.n, scene)
    models = {
        "two_ray": dj.TwoRayModel(scene),
        "room_floor": dj.room_model(scene),
        "room_6": dj.room_model(scene, ceiling=args.ceiling, walls=args.walls),
    }
    if not args.no_order2:
        models["room_6_order2"] = dj.room_model(
            scene, ceiling=args.ceiling, walls=args.walls, order=2
        )
    # compile everything, then time the models in turn within each repeat (interleaved), so
    # that the machine's drift hits every row alike; the ratio is the median of per-repeat ratios
    calls = {name: (lambda model=model: dj.peb_map(xs, model)) for name, model in models.items()}
    first = {name: time_call(fn, 0)[0] for name, fn in calls.items()}
    times = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, fn in calls.items():
            times[name].extend(time_call(fn, 1)[1])
    rows = []
    for name, model in models.items():
        values = np.asarray(calls[name]())
        stats = summarize(times[name])
        rows.append(
            {
                "method": name,
                "reflectors": len(getattr(model, "reflectors", ("floor",))),
                "order": getattr(model, "order", 1),
                "n_positions": args.n,
                "first_call_s": first[name],
                **stats,
                "us_per_peb": stats["median_s"] / args.n * 1e6,
                "mean_peb_m": float(values.mean()),
                "finite_fraction": float(np.isfinite(values).mean()),
                "device": device_name(),
                "peak_rss_mb": peak_rss_mb(),
            }
        )
    base = np.asarray(times["two_ray"])
    for r in rows:
        r["time_ratio_vs_two_ray"] = float(np.median(np.asarray(times[r["method"]]) / base))
    print(
        f"PEB map cost, {args.n} positions, ceiling {args.ceiling}, walls {args.walls}, "
        f"P = {args.power_dbm} dBm, {device_name()}"
    )
    print_table(
        rows,
        [
            ("method", "model", "s"),
            ("reflectors", "surfaces", "d"),
            ("first_call_s", "first call s", ".2f"),
            ("median_s", "median s", ".3f"),
            ("us_per_peb", "us / PEB", ".1f"),
            ("time_ratio_vs_two_ray", "ratio", ".2f"),
            ("mean_peb_m", "mean PEB m", ".3e"),
            ("finite_fraction", "finite", ".3f"),
        ],
    )
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
