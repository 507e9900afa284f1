"""Calibration from L labeled + N unlabeled snapshots: how the fine stage's error falls with N.

The two-ray world of ``examples/deployment.py --world two-ray --patch`` (free APs off by
N(0, 1 cm) in 3-D, per-AP offsets, downward patches of exponent 1.7 believed to be 1; the
example's seed, labeled and test snapshots). For each N: ``calibrate`` of the phase centres,
offsets, ground and exponent from the L labeled snapshots and the first N of the unlabeled
ones (``unlabeled=``; started from their refinement under the labeled calibration, i.e. in
the right basin), then the fine stage alone: refinement of every test UE from its true
position under the calibration. RMSE over the world's mean and RMS PEB, the phase centres'
errors, the exponent's standard error, the calibration's time (compilation included).

    python benchmarks/unlabeled_calibration.py --json out/unlabeled_calibration.json
    python benchmarks/unlabeled_calibration.py --quick     # N = 0, 64; 256 test UEs
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import device_name, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.calibration import Unlabeled, calibrate  # noqa: E402
from dmimo_jax.datasets import synthetic_deployment  # noqa: E402

FIT = ("ap_positions", "ap_phase_offsets", "surfaces", "antenna")


def snapshots(key, model, scene, num):
    """As ``examples/deployment.py``: positions, the world's noisy phases, noise variances."""
    k_x, k_cpo, k_noise = jax.random.split(key, 3)
    x = dj.sample_positions(k_x, num, scene)
    r = dj.simulate_phases_batch(k_noise, model, x, dj.random_cpos(k_cpo, num))
    return x, r, jax.vmap(model.variance)(x)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[0, 128, 256, 512, 1024])
    ap.add_argument("--num-train", type=int, default=50)
    ap.add_argument("--num-test", type=int, default=1280)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="N = 0, 64; 256 test UEs")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.num_test = [0, 64], 256
    if min(args.sizes) < 0:
        raise ValueError(f"--sizes must be >= 0, got {args.sizes}")
    truth, surveyed, _ = synthetic_deployment(-10.0, seed=args.seed, world="two-ray", patch=True)
    key_train, key_test = jax.random.split(jax.random.key(args.seed))
    x_l, r_l, nv_l = snapshots(key_train, truth, surveyed, args.num_train)
    x, r, _ = snapshots(key_test, truth, surveyed, args.num_test)
    pebs = np.asarray(dj.peb_map(x, truth))
    nominal = dj.TwoRayModel(surveyed)
    t0 = time.perf_counter()
    labeled = calibrate(nominal, x_l, r_l, nv_l, fit=FIT, warn=False)
    t_labeled = time.perf_counter() - t0
    key_traffic = jax.random.fold_in(jax.random.key(args.seed), 1)  # as the example
    x_u, r_u, nv_u = snapshots(key_traffic, truth, surveyed, max(args.sizes))
    x0 = dj.refine_batch(x_u, r_u, labeled.model).x

    def row(name, n, model, cal=None, seconds=None):
        e = np.linalg.norm(np.asarray(dj.refine_batch(x, r, model).x) - np.asarray(x), axis=1)
        rmse = float(np.sqrt(np.mean(e**2)))
        out = dict(
            calibration=name,
            num_unlabeled=n,
            fine_over_peb=rmse / float(pebs.mean()),
            fine_over_rms_peb=rmse / float(np.sqrt(np.mean(pebs**2))),
            device=device_name(),
        )
        if cal is not None:
            err = np.linalg.norm(
                np.asarray(cal.values["ap_positions"]) - np.asarray(truth.scene.ap_positions),
                axis=1,
            )
            out |= dict(
                ap_error_median_m=float(np.median(err)),
                ap_error_max_m=float(err.max()),
                exponent_stderr=float(cal.stderr["antenna"]),
                reduced_chi2=float(cal.reduced_chi2),
                seconds=seconds,
                unlabeled_used=0 if n == 0 else int(np.sum(cal.unlabeled_used)),
            )
        return out

    rows = [row("true world", 0, truth)]
    for n in args.sizes:
        if n == 0:
            rows.append(row("labeled", 0, labeled.model, labeled, t_labeled))
            continue
        t0 = time.perf_counter()
        cal = calibrate(
            nominal,
            x_l,
            r_l,
            nv_l,
            fit=FIT,
            warn=False,
            unlabeled=Unlabeled(r_u[:n], nv_u[:n], x0[:n]),
        )
        rows.append(row("labeled + unlabeled", n, cal.model, cal, time.perf_counter() - t0))
    print_table(
        rows,
        [
            ("calibration", "calibration", "s"),
            ("num_unlabeled", "N", "d"),
            ("fine_over_peb", "RMSE/PEB", ".3f"),
            ("fine_over_rms_peb", "RMSE/RMS PEB", ".3f"),
            ("ap_error_median_m", "AP err med m", ".2e"),
            ("ap_error_max_m", "AP err max m", ".2e"),
            ("exponent_stderr", "q s.e.", ".1e"),
            ("reduced_chi2", "chi2/dof", ".3f"),
            ("seconds", "seconds", ".1f"),
        ],
    )
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
