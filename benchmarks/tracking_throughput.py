"""Tracking throughput: microseconds per snapshot per UE, the tracker next to the
single-snapshot online stage, side by side in one run.

Methods (float64, the paper's scene at -10 dBm, 100 Hz snapshots of walking UEs):
  tracker        : dmimo_jax.tracking.run_tracker with its defaults (iterated EKF, 2
                   iterations per snapshot; the second re-linearizes only after a step of
                   lambda/100 or more, else a chord step), a scan over T snapshots of B
                   UEs, locked (started at the truth; the lock test and re-acquisition
                   compiled in and armed)
  tracker_always : the same with chord_below=0 (every iteration re-linearizes: two
                   linearizations per snapshot)
  tracker_chord  : the same with relinearize=False (the second iteration a chord step
                   whatever the step: one linearization per snapshot)
  tracker_ekf    : the same with one iteration per snapshot (a plain EKF)
  online         : the single-snapshot model-based online stage, coarse_to_fine (lambda/4
                   phasor-table screen + 8-start refinement) of every snapshot
  mle            : lambda/8 EGS (certified table screen) + refinement (as the tracking
                   example's single-snapshot pipeline; --mle-divisor sets the 8)

    python benchmarks/tracking_throughput.py                 # B = 1, 100, 10000
    python benchmarks/tracking_throughput.py --quick --json out/tracking_throughput.json
"""

from __future__ import annotations

import argparse
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, peak_rss_mb, print_table, summarize, time_call, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import tracking  # noqa: E402
from dmimo_jax.benchmarking import check_options  # noqa: E402
from dmimo_jax.estimators import (  # noqa: E402
    coarse_to_fine,
    egs,
    phasor_table,
    refine_batch,
    search_grid,
)

DT = 0.01


def walks(scene, model, motion, num_ues, num_steps, seed=0):
    k_x, k_dir, k_path, k_snap = jax.random.split(jax.random.PRNGKey(seed), 4)
    x0 = dj.sample_positions(k_x, num_ues, scene)
    heading = jax.random.uniform(k_dir, (num_ues,), maxval=2 * np.pi)
    v0 = 1.5 * jnp.stack([jnp.cos(heading), jnp.sin(heading), jnp.zeros(num_ues)], axis=1)
    sim = jax.vmap(tracking.simulate_trajectory, in_axes=(0, None, 0, 0, None, None))
    path = sim(jax.random.split(k_path, num_ues), motion, x0, v0, num_steps + 1, DT)
    snap = jax.vmap(tracking.simulate_track_phases, in_axes=(0, None, 0))
    r = snap(jax.random.split(k_snap, num_ues), model, path.positions)
    return path, r


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-ues", type=int, nargs="+", default=None, help="default 1 100 10000")
    ap.add_argument("--steps", type=int, default=100, help="snapshots per UE in a timed run")
    ap.add_argument("--repeats", type=int, default=None, help="timed calls (3; 2 with --quick)")
    ap.add_argument(
        "--mle-divisor", type=int, default=8, help="the mle row's grid spacing lambda/d"
    )
    ap.add_argument("--online-snapshots", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="B = 1, 100; 20 steps; 32 snapshots")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.num_ues = args.num_ues or [1, 100]
        args.steps = 20
        args.online_snapshots = min(args.online_snapshots, 32)
    args.num_ues = args.num_ues or [1, 100, 10_000]
    if args.repeats is None:  # a given --repeats (0 included) is checked, never replaced
        args.repeats = 2 if args.quick else 3
    check_options(repeats=args.repeats, mle_divisor=args.mle_divisor)
    scene = dj.paper_scene(-10.0)
    model = dj.TwoRayModel(scene)
    motion = tracking.ConstantVelocity(1.0, region=scene)
    rows = []
    variants = [
        ("tracker", {}),
        ("tracker_always", dict(chord_below=0.0)),
        ("tracker_chord", dict(relinearize=False)),
        ("tracker_ekf", dict(num_iterations=1)),
    ]
    for name, settings in variants:
        tracker = tracking.Tracker(
            model, motion, dt=DT, settings=tracking.TrackerSettings(**settings)
        )
        for b in args.num_ues:
            path, r = walks(scene, model, motion, b, args.steps)
            rs = jnp.swapaxes(r[:, 1:], 0, 1)
            init = jax.vmap(
                lambda x, v, t=tracker: t.init(
                    x, position_std=1e-4, velocity_std=0.05, v0=v, acquire=False
                )
            )
            state = init(path.positions[:, 0], path.velocities[:, 0])
            first, times = time_call(
                lambda t=tracker, s=state, rs=rs: tracking.run_tracker(t, s, rs), args.repeats
            )
            _, out = tracking.run_tracker(tracker, state, rs)
            err = np.linalg.norm(
                np.asarray(out.position) - np.swapaxes(np.asarray(path.positions[:, 1:]), 0, 1),
                axis=-1,
            )
            stats = summarize(times)
            rows.append(
                dict(
                    method=name,
                    num_ues=b,
                    us_per_snapshot_per_ue=1e6 * stats["median_s"] / (args.steps * b),
                    first_call_s=first,
                    restarts=int(np.asarray(out.reacquired).sum()),
                    rmse_m=float(np.sqrt(np.mean(err**2))),
                    **stats,
                )
            )
            print(rows[-1])
    n = args.online_snapshots
    path, r = walks(scene, model, motion, n, 1, seed=1)
    r1 = r[:, 1]
    c2f_table = phasor_table(model, search_grid(scene, scene.wavelength / 4))
    egs_table = phasor_table(model, search_grid(scene, scene.wavelength / args.mle_divisor))
    methods = {
        "online": lambda: coarse_to_fine(r1, model, c2f_table).x,
        "mle": lambda: refine_batch(egs(r1, model, egs_table).x, r1, model).x,
    }
    for name, fn in methods.items():
        first, times = time_call(fn, args.repeats)
        x = np.asarray(fn())
        err = np.linalg.norm(x - np.asarray(path.positions[:, 1]), axis=1)
        stats = summarize(times)
        rows.append(
            dict(
                method=name,
                num_ues=n,
                us_per_snapshot_per_ue=1e6 * stats["median_s"] / n,
                first_call_s=first,
                restarts=0,
                rmse_m=float(np.sqrt(np.mean(err**2))),
                **stats,
            )
        )
    online = next(r["us_per_snapshot_per_ue"] for r in rows if r["method"] == "online")
    for row in rows:
        row["online_over_this"] = online / row["us_per_snapshot_per_ue"]
        row["device"] = device_name()
        row["peak_rss_mb"] = peak_rss_mb()
    print_table(
        rows,
        [
            ("method", "method", "s"),
            ("num_ues", "UEs", "d"),
            ("us_per_snapshot_per_ue", "us/snap/UE", ".2f"),
            ("online_over_this", "online/this", ".1f"),
            ("rmse_m", "RMSE m", ".3g"),
            ("restarts", "restarts", "d"),
        ],
    )
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
