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
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

from _helpers import mle_mismatch_sweep, pyplot, save_figure  # noqa: E402


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
    json_path, png_path = args.out.with_suffix(".json"), args.out.with_suffix(".png")
    rows = mle_mismatch_sweep(
        args.betas,
        args.powers_dbm,
        args.realizations,
        args.spacing_div,
        json_path,
        resume=args.resume,
    )

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
