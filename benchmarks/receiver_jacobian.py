"""The complex calibration's Jacobian: column compression against autodiff, side by side.

``calibrate`` on complex snapshots fits per-AP unknowns (the receivers' gains and constants,
the phase centres); its Levenberg-Marquardt Jacobian is taken by column compression (one
tangent per colour, ``jacobian="auto"``) or by ``jax.jacfwd`` (``jacobian="autodiff"``, one
tangent per unknown). Per size (APs M, labeled snapshots L), the same world and snapshots
(the paper's scene, or M APs drawn on its ceiling for M != 17; phase centres off by N(0, 1
cm), receivers of ``receivers.random_receivers``, -10 dBm), each way timed compiled (the
median of ``--repeats`` calls after one that compiles), their ratio, and the largest
difference of the fitted phase centres (both reach the same fit).

    python benchmarks/receiver_jacobian.py --json out/receiver_jacobian.json
    python benchmarks/receiver_jacobian.py --quick      # M = 17, L = 30, one repeat
"""

from __future__ import annotations

import argparse
import pathlib
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import receivers as rx  # noqa: E402
from dmimo_jax.benchmarking import timed_passes  # noqa: E402
from dmimo_jax.calibration import calibrate  # noqa: E402

FIT = ("ap_positions", "receiver_gains", "receiver_constants")


def world(num_aps: int, num_labeled: int, seed: int = 0):
    """(nominal model, labeled positions, complex snapshots, noise variances)."""
    scene = dj.paper_scene(-10.0, convention="itu")
    if num_aps != scene.num_aps:
        rng = np.random.default_rng(seed)
        ap = np.c_[rng.uniform(0.5, 9.5, (num_aps, 2)), np.full(num_aps, 3.0)]
        scene = scene.replace(ap_positions=ap, ap_phase_offsets=np.zeros(num_aps))
    real = dj.perturb_deployment(
        jax.random.key(seed), scene, position_std=1e-2, random_offsets=False
    )
    truth = dj.TwoRayModel(real)
    recv = rx.random_receivers(jax.random.key(seed + 1), truth)
    x = dj.sample_positions(jax.random.key(seed + 2), num_labeled, scene)
    s = 1.3 * jnp.exp(1j * dj.random_cpos(jax.random.key(seed + 3), num_labeled))
    h = rx.simulate_snapshots(jax.random.key(seed + 4), truth, x, recv, s)
    return dj.TwoRayModel(scene), x, h, jnp.full(h.shape, float(scene.noise_power))


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    sizes = [(17, 30)] if args.quick else [(17, 50), (17, 200), (42, 50), (42, 200)]
    repeats = 1 if args.quick else args.repeats
    rows = []
    for num_aps, num_labeled in sizes:
        problem = world(num_aps, num_labeled)
        row = {"num_aps": num_aps, "num_labeled": num_labeled, "device": device_name()}
        fitted = {}
        for way in ("autodiff", "auto"):

            def run(way=way, problem=problem):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    return calibrate(*problem, fit=FIT, jacobian=way)

            run()  # compile
            cal, seconds = timed_passes(run, repeats)
            row[f"{way}_s"] = seconds
            row[f"{way}_status"] = cal.status
            fitted[way] = np.asarray(cal.values["ap_positions"])
        row["speedup"] = row["autodiff_s"] / row["auto_s"]
        row["max_position_difference_m"] = float(
            np.max(np.abs(fitted["auto"] - fitted["autodiff"]))
        )
        rows.append(row)
    print_table(
        rows,
        [
            ("num_aps", "M", "d"),
            ("num_labeled", "L", "d"),
            ("autodiff_s", "autodiff s", ".2f"),
            ("auto_s", "compressed s", ".2f"),
            ("speedup", "speedup", ".2f"),
            ("max_position_difference_m", "max |dp| m", ".1e"),
        ],
    )
    if args.json:
        write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
