"""Re-acquisition cost: the tracker's certified lattice screen against scoring the whole
lattice, side by side in one run, and whether the tracks differ.

B walking UEs (the paper's scene, 100 Hz, sigma_a = 1 m/s^2) are tracked from a start
4 cm off the truth (an acquisition over the first window) through an outage of
``--outage`` s in the middle of the run (the prediction spreads beyond lambda/12: a
re-acquisition at its end), at every power of ``--powers-dbm``. Settings
(``screen_snapshots``, ``screen_size`` of :class:`dmimo_jax.tracking.Tracker`):

  whole      : (window, 1): the bound is the whole window's cost, every lattice point
               scored once on it (the search without a screen)
  screen a/b : a newest snapshots bound every point, the b lowest are scored on the
               whole window, the whole lattice only if that is not certified

Columns: seconds per ``run_tracker`` call (compiled, median of ``--repeats``), the
ratio to ``whole`` in the same run, restarts, the position RMSE after the outage, and
whether every position of every step equals ``whole``'s bit for bit.

    python benchmarks/reacquisition.py --json out/reacquisition.json
    python benchmarks/reacquisition.py --quick
"""

from __future__ import annotations

import argparse
import pathlib
from functools import partial

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, print_table, summarize, time_call, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import tracking  # noqa: E402

DT = 0.01
WINDOW = 10
SETTINGS = ((None, 1), (2, 256), (2, 64), (2, 1024), (1, 256))  # None: the window
QUICK_SETTINGS = ((None, 1), (2, 256), (1, 256))  # each setting compiles its own program


def scenario(scene, motion, num_ues, num_steps, outage, seed=0):
    """Paths, (T, B, M) snapshots after the first, the validity mask and the start."""
    k_x, k_dir, k_path, k_snap = jax.random.split(jax.random.key(seed), 4)
    x0 = dj.sample_positions(k_x, num_ues, scene)
    heading = jax.random.uniform(k_dir, (num_ues,), maxval=2 * np.pi)
    v0 = 1.5 * jnp.stack([jnp.cos(heading), jnp.sin(heading), jnp.zeros(num_ues)], axis=1)
    sim = jax.vmap(tracking.simulate_trajectory, in_axes=(0, None, 0, 0, None, None))
    path = sim(jax.random.split(k_path, num_ues), motion, x0, v0, num_steps + 1, DT)
    model = dj.TwoRayModel(scene)
    snap = jax.vmap(tracking.simulate_track_phases, in_axes=(0, None, 0))
    r = jnp.swapaxes(snap(jax.random.split(k_snap, num_ues), model, path.positions)[:, 1:], 0, 1)
    valid = np.ones((num_steps, num_ues), bool)
    gap = int(round(outage / DT))
    start = (num_steps - gap) // 2
    valid[start : start + gap] = False
    return path, r, jnp.asarray(valid), start + gap


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--powers-dbm", type=float, nargs="+", default=[-10.0, -60.0, -69.0])
    ap.add_argument("--num-ues", type=int, default=20)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--outage", type=float, default=1.0, help="seconds without snapshots")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--quick",
        action="store_true",
        help="-10 dBm, 4 UEs, 120 steps, 0.4 s; the whole window, screen 2/256 and 1/256",
    )
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    settings = SETTINGS
    if args.quick:
        args.powers_dbm, args.num_ues, args.steps, args.outage = [-10.0], 4, 120, 0.4
        args.repeats = 1
        settings = QUICK_SETTINGS
    rows = []
    for power in args.powers_dbm:
        scene = dj.paper_scene(power)
        motion = tracking.ConstantVelocity(1.0, region=scene)
        path, r, valid, after = scenario(scene, motion, args.num_ues, args.steps, args.outage)
        truth = np.swapaxes(np.asarray(path.positions[:, 1:]), 0, 1)
        reference = None
        for snapshots, size in settings:
            tracker = tracking.Tracker(
                dj.TwoRayModel(scene),
                motion,
                dt=DT,
                settings=tracking.TrackerSettings(
                    window=WINDOW,
                    screen_snapshots=WINDOW if snapshots is None else snapshots,
                    screen_size=size,
                ),
            )
            state = jax.vmap(lambda x, t=tracker: t.init(x, position_std=0.04))(
                path.positions[:, 0] + 0.04
            )
            run = partial(tracking.run_tracker, tracker, state, r, valid)
            first, times = time_call(run, args.repeats)
            _, out = run()
            position = np.asarray(out.position)
            if reference is None:
                reference = position
            same = bool(np.array_equal(position, reference))
            err = np.linalg.norm(position[after:] - truth[after:], axis=-1)
            rows.append(
                dict(
                    power_dbm=power,
                    setting="whole" if snapshots is None else f"screen {snapshots}/{size}",
                    num_ues=args.num_ues,
                    steps=args.steps,
                    first_call_s=first,
                    restarts=int(np.asarray(out.reacquired).sum()),
                    rmse_after_outage_m=float(np.sqrt(np.mean(err**2))),
                    identical_to_whole=same,
                    same_tracks="yes" if same else "no",
                    device=device_name(),
                    **summarize(times),
                )
            )
        whole = rows[-len(settings)]["median_s"]
        for row in rows[-len(settings) :]:
            row["whole_over_this"] = whole / row["median_s"]
            print(row)
    print_table(
        rows,
        [
            ("power_dbm", "P dBm", ".0f"),
            ("setting", "setting", "s"),
            ("median_s", "s / run", ".2f"),
            ("whole_over_this", "whole/this", ".2f"),
            ("restarts", "restarts", "d"),
            ("rmse_after_outage_m", "RMSE m", ".3g"),
            ("same_tracks", "same tracks", "s"),
        ],
    )
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
