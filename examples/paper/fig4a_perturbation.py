"""Fig. 4(a): true vs GP phase perturbation along a slice, for metal, concrete and wood.

For each material the GP is fitted on L labeled snapshots of that ground (P = -10 dBm, the
paper's permittivity convention) and its predictive perturbation E[g] +- 2 std is drawn
against the true two-ray perturbation (eq. 7) along the gamma = 20 deg slice of AP 0
(the constant the training CPOs absorb is removed, as in ``fig2_gp_example.py``).

    python examples/paper/fig4a_perturbation.py --quick     # same (it is fast): L = 10 as in the paper
    python examples/paper/fig4a_perturbation.py --num-train 100
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # examples/_helpers.py
from _helpers import fit_and_score, pyplot, save_figure, slice_positions, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import gp  # noqa: E402


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--num-train", type=int, default=None)
    ap.add_argument("--materials", nargs="+", default=["metal", "concrete", "wood"])
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/fig4a"))
    args = ap.parse_args(argv)
    L = args.num_train or 10  # the paper trains Fig. 4(a) on L = 10
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for material in args.materials:
        scene = dj.paper_scene(args.power_dbm, material)
        fit = fit_and_score(scene, L, 200, seed=3)
        xs = slice_positions(scene, 0, np.radians(20.0), 300)
        d = jax.vmap(gp.features, in_axes=(0, None))(xs, scene)[:, 0, 0]
        g_true = jax.vmap(dj.physics.phase_perturbation, in_axes=(0, None))(xs, scene)[:, 0]
        g_mean, g_var = jax.vmap(fit["model"].perturbation)(xs)
        g_mean, g_std = g_mean[:, 0], jnp.sqrt(g_var[:, 0])
        offset = float(jnp.mean(g_mean - g_true))
        err = float(jnp.degrees(jnp.sqrt(jnp.mean((g_mean - offset - g_true) ** 2))))
        rows.append(
            dict(
                material=material,
                L=L,
                power_dbm=args.power_dbm,
                slice_rmse_deg=err,
                test_rmse_deg=fit["gp_rmse_deg"],
                theory_rmse_deg=fit["theory_rmse_deg"],
                delta_d=np.asarray(d).tolist(),
                g_true=np.asarray(g_true).tolist(),
                g_mean=np.asarray(g_mean - offset).tolist(),
                g_std=np.asarray(g_std).tolist(),
            )
        )
        print(
            f"{material}: slice error {err:.3f} deg; test modeling RMSE {fit['gp_rmse_deg']:.4f} deg "
            f"(theory {fit['theory_rmse_deg']:.4f} deg)"
        )
    plt = pyplot()
    if plt is not None:
        fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.6), sharey=False)
        for ax, r in zip(np.atleast_1d(axes), rows, strict=True):
            d, m, s = (np.asarray(r[k]) for k in ("delta_d", "g_mean", "g_std"))
            ax.plot(d, np.degrees(r["g_true"]), "k-", lw=1.5, label="true (eq. 7)")
            ax.plot(d, np.degrees(m), "C1--", label="GP mean")
            ax.fill_between(
                d,
                np.degrees(m - 2 * s),
                np.degrees(m + 2 * s),
                color="C1",
                alpha=0.3,
                label="GP +- 2 std",
            )
            ax.set_xlabel("path difference Delta d [m]")
            ax.set_ylabel("phase perturbation [deg]")
            ax.set_title(f"{r['material']}, L = {r['L']}, gamma = 20 deg")
        save_figure(fig, args.out / "fig4a.png")
    write_json(args.out / "fig4a.json", rows)
    return rows


if __name__ == "__main__":
    main()
