"""Table I: modeling RMSE (degrees) and NLPD of the theoretical and GP models per ground material.

M = 17 APs, L = 100 training UEs, P = -10 dBm, 200 independent test UEs (CPO of each
test snapshot compressed by eq. (15), see docs/equations.md). Two tables: the paper's
permittivity convention (f in Hz in ITU-R P.2040) and the correct ITU-R values.

    python examples/paper/table1_materials.py --json out/material_table.json
    python examples/paper/table1_materials.py --quick        # L = 20, 50 test UEs, paper convention
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # examples/_helpers.py
from _helpers import fit_and_score, write_json  # noqa: E402
from tqdm import tqdm  # noqa: E402

import dmimo_jax as dj  # noqa: E402

MATERIALS = ("wood", "plasterboard", "concrete", "glass", "metal")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--num-train", type=int, default=None, help="L (default 100; quick 20)")
    ap.add_argument("--num-test", type=int, default=None)
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--conventions", nargs="+", default=None, choices=("paper", "itu"))
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    num_train = args.num_train or (20 if args.quick else 100)
    num_test = args.num_test or (50 if args.quick else 200)
    conventions = args.conventions or (["paper"] if args.quick else ["paper", "itu"])
    if num_train < 2:
        raise ValueError(f"--num-train must be >= 2, got {num_train}")

    rows = []
    jobs = [(c, m) for c in conventions for m in MATERIALS]
    for convention, material in tqdm(jobs, desc="material_table", unit="fit"):
        scene = dj.paper_scene(power_dbm=args.power_dbm, material=material, convention=convention)
        out = fit_and_score(scene, num_train, num_test, seed=7)
        common = dict(
            material=material, convention=convention, L=num_train, power_dbm=args.power_dbm
        )
        eps = complex(scene.eps_r) if not scene.perfect_conductor else None
        common["eps_r"] = None if eps is None else [eps.real, eps.imag]
        rows.append(
            dict(common, model="theory", rmse_deg=out["theory_rmse_deg"], nlpd=out["theory_nlpd"])
        )
        rows.append(
            dict(
                common,
                model="gp",
                rmse_deg=out["gp_rmse_deg"],
                nlpd=out["gp_nlpd"],
                fit_seconds=out["fit_seconds"],
                hyperparameters=out["hyperparameters"],
            )
        )
    for convention in conventions:
        print(
            f"\nTable I ({convention} permittivity convention), L = {num_train}, P = {args.power_dbm} dBm"
        )
        print(
            f"{'material':>13} {'theory RMSE':>12} {'theory NLPD':>12} {'GP RMSE':>10} {'GP NLPD':>10}"
        )
        for material in MATERIALS:
            t, g = (
                next(
                    r
                    for r in rows
                    if (r["material"], r["convention"], r["model"]) == (material, convention, k)
                )
                for k in ("theory", "gp")
            )
            print(
                f"{material:>13} {t['rmse_deg']:11.4f}d {t['nlpd']:12.3f} {g['rmse_deg']:9.4f}d {g['nlpd']:10.3f}"
            )
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
