"""Many deployments calibrated at once: ``calibrate_many`` against a loop of ``calibrate``.

``dmimo_jax.calibration.calibrate_many`` runs each LM stage of N calibrations as one program
(the fitting core ``solver.fit_rounds`` vmapped over the deployments); each calibration is
what its own ``calibrate`` call gives. Per batch size N: the first N worlds of a row of
``calibration_robustness.py`` (default the room row: phase centres 5 mm off laterally, six
surfaces of random materials guessed concrete, random offsets, L = 50 labeled snapshots at
-10 dBm; fit: phase centres, offsets, surfaces), calibrated by a loop of ``calibrate`` calls
and by one ``calibrate_many`` call, both timed compiled (the median of ``--repeats`` after a
pass that compiles); their ratio, the largest difference of the fitted phase centres and
whether every status agrees.

    python benchmarks/calibration_batch.py --json out/calibration_batch.json
    python benchmarks/calibration_batch.py --quick      # smoke: 4 two-ray worlds (positions,
                                                        # offsets, antenna), one pass
"""

from __future__ import annotations

import argparse
import pathlib
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import device_name, print_table, write_json  # noqa: E402
from calibration_robustness import FITS, world  # noqa: E402

from dmimo_jax.benchmarking import check_options, timed_passes  # noqa: E402
from dmimo_jax.calibration import calibrate, calibrate_many  # noqa: E402

ROWS = {
    "room": dict(kind="room", sigma=5e-3, L=50, power=-10.0),
    "two-ray": dict(kind="two-ray", sigma=1e-2, L=50, power=-10.0),
}


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 two-ray worlds, one pass")
    ap.add_argument("--kind", choices=sorted(ROWS), default="room", help="the worlds' row")
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 32], help="deployments N")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes (median)")
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--json", type=pathlib.Path, default=None, help="write the rows here")
    args = ap.parse_args(argv)
    kind, sizes, repeats = args.kind, args.sizes, args.repeats
    check_options(sizes=sizes, repeats=repeats)
    cfg, fit = ROWS[kind], FITS[kind]
    if args.quick:  # a smoke run: the first pass timed, compile included
        kind, sizes, repeats = "two-ray", [4], 1
        cfg, fit = ROWS[kind], ("ap_positions", "ap_phase_offsets", "antenna")
    rows = []
    for num in sizes:
        worlds = [world(cfg, seed) for seed in range(args.first_seed, args.first_seed + num)]
        models = [w[1] for w in worlds]
        x, r, nv = (np.stack([w[i] for w in worlds]) for i in (2, 3, 4))

        def loop(worlds=worlds):
            return [calibrate(*w[1:], fit=fit, warn=False) for w in worlds]

        def many(models=models, x=x, r=r, nv=nv):
            return calibrate_many(models, x, r, nv, fit=fit, warn=False)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if not args.quick:
                loop()  # compile
                many()
            one, t_loop = timed_passes(loop, repeats)
            both, t_many = timed_passes(many, repeats)
        diff = max(
            float(np.max(np.abs(np.asarray(a.values["ap_positions"] - b.values["ap_positions"]))))
            for a, b in zip(one, both, strict=True)
        )
        rows.append(
            {
                "kind": kind,
                "deployments": num,
                "num_labeled": cfg["L"],
                "device": device_name(),
                "loop_s_per_deployment": t_loop / num,
                "many_s_per_deployment": t_many / num,
                "speedup": t_loop / t_many,
                "converged": sum(c.status == "converged" for c in both),
                "same_status": all(a.status == b.status for a, b in zip(one, both, strict=True)),
                "max_position_difference_m": diff,
            }
        )
    if args.json:
        write_json(args.json, rows)
    print_table(
        rows,
        [
            ("kind", "worlds", "s"),
            ("deployments", "N", "d"),
            ("loop_s_per_deployment", "loop s/dep", ".3f"),
            ("many_s_per_deployment", "many s/dep", ".3f"),
            ("speedup", "speedup", ".2f"),
            ("converged", "converged", "d"),
            ("same_status", "same status", ""),
            ("max_position_difference_m", "max |dp| m", ".1e"),
        ],
    )
    return rows


if __name__ == "__main__":
    main()
