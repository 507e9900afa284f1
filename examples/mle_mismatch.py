"""MLE under permittivity mismatch: RMSE vs transmit power for eps_r scaled by beta.

The true channel is the two-ray model of ``paper_scene(power_dbm=P)`` (UE [6.5, 5, 2] m,
CPO pi/2 at every AP, concrete in the paper's convention). The estimator believes
eps_r * beta, beta in {1.00, 1.01, 1.05, 1.10}: lambda/8 EGS of the LS cost (eq. 18,
lookup table of the *believed* model) followed by Levenberg-Marquardt refinement of the
ML cost (eq. 17) under the believed model. The PEB is that of the true model.

    python examples/mle_mismatch.py                          # 200 draws, P = -60..-10 dBm
    python examples/mle_mismatch.py --realizations 50 --out out/mismatch   # faster
    python examples/mle_mismatch.py --resume                 # continue an interrupted run

Writes ``OUT.json`` (one row per (beta, P)) and ``OUT.png`` (needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _output import pyplot, save_figure  # noqa: E402
from tqdm import tqdm  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import estimators as est  # noqa: E402

TEST_POINT = (6.5, 5.0, 2.0)


def run_point(scene_true, believed, table, n: int, seed: int) -> dict:
    """RMSE of EGS + refinement under the ``believed`` model, n noise draws at the test point."""
    x = jnp.asarray(TEST_POINT)
    xs = jnp.broadcast_to(x[None, :], (n, 3))
    r = dj.simulate_phases_batch(jax.random.key(seed), scene_true, xs, jnp.full((n,), jnp.pi / 2))
    coarse = est.egs(r, believed, table)
    fine = est.refine_batch(coarse.x, r, believed)
    err = np.linalg.norm(np.asarray(fine.x) - np.asarray(TEST_POINT)[None, :], axis=1)
    err_egs = np.linalg.norm(np.asarray(coarse.x) - np.asarray(TEST_POINT)[None, :], axis=1)
    return dict(
        rmse_m=float(np.sqrt(np.mean(err**2))),
        median_err_m=float(np.median(err)),
        egs_rmse_m=float(np.sqrt(np.mean(err_egs**2))),
        outliers=int(np.sum(err > 0.1)),  # > 10 cm: a wrong phase-ambiguity cell
        peb_m=float(dj.peb(x, scene_true)),
    )


def plot(rows: list[dict], path: pathlib.Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for beta in sorted({row["beta"] for row in rows}):
        sel = sorted((row for row in rows if row["beta"] == beta), key=lambda row: row["power_dbm"])
        ax.semilogy(
            [s["power_dbm"] for s in sel],
            [s["rmse_m"] for s in sel],
            "o-",
            label=f"MLE, beta={beta:g}",
        )
    sel = sorted((row for row in rows if row["beta"] == 1.0), key=lambda row: row["power_dbm"])
    ax.semilogy([s["power_dbm"] for s in sel], [s["peb_m"] for s in sel], "k--", label="PEB")
    ax.set(xlabel="transmit power P [dBm]", ylabel="RMSE [m]", title="MLE under eps_r mismatch")
    save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--betas", type=float, nargs="+", default=[1.0, 1.01, 1.05, 1.10])
    ap.add_argument("--powers-dbm", type=float, nargs="+", default=[-60, -50, -40, -30, -20, -10])
    ap.add_argument("--realizations", type=int, default=200)
    ap.add_argument("--spacing-div", type=int, default=8, help="EGS grid spacing lambda/N")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/mle_mismatch"))
    ap.add_argument("--resume", action="store_true", help="keep rows already in OUT.json")
    args = ap.parse_args(argv)
    if args.realizations < 2:
        raise ValueError(f"--realizations must be >= 2, got {args.realizations}")
    json_path, png_path = args.out.with_suffix(".json"), args.out.with_suffix(".png")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    rows = json.loads(json_path.read_text()) if args.resume and json_path.exists() else []
    done = {(row["beta"], row["power_dbm"]) for row in rows}

    base = dj.paper_scene()
    grid = est.search_grid(base, float(base.wavelength) / args.spacing_div)
    todo = [(b, p) for b in args.betas for p in args.powers_dbm if (b, p) not in done]
    with tqdm(total=len(todo), desc="mle_mismatch", unit="point") as bar:
        for beta in args.betas:
            if all((beta, p) in done for p in args.powers_dbm):
                continue
            # the believed model's table: phases do not depend on P, so one per beta
            believed0 = dj.TwoRayModel(base.replace(eps_r=beta * base.eps_r))
            table = est.phasor_table(believed0, grid)
            for i, power in enumerate(args.powers_dbm):
                if (beta, power) in done:
                    continue
                truth = dj.paper_scene(power_dbm=power)
                believed = dj.TwoRayModel(truth.replace(eps_r=beta * truth.eps_r))
                row = dict(beta=beta, power_dbm=power, spacing_m=grid.spacing, n=args.realizations)
                row.update(run_point(truth, believed, table, args.realizations, seed=100 + i))
                rows.append(row)
                json_path.write_text(json.dumps(rows, indent=1))
                bar.update()
                bar.set_postfix(beta=beta, P=power, rmse_um=f"{row['rmse_m'] * 1e6:.1f}")
            del table

    print(f"{'beta':>6} {'P_dBm':>6} {'RMSE_m':>10} {'PEB_m':>10} {'RMSE/PEB':>9} {'outliers':>8}")
    for row in sorted(rows, key=lambda row: (row["beta"], row["power_dbm"])):
        print(
            f"{row['beta']:6.2f} {row['power_dbm']:6.0f} {row['rmse_m']:10.3e} {row['peb_m']:10.3e} "
            f"{row['rmse_m'] / row['peb_m']:9.2f} {row['outliers']:8d}"
        )
    print(f"wrote {json_path}")
    plot(rows, png_path)


if __name__ == "__main__":
    main()
