"""Fig. 2: the GP phase model on one example (L = 10 training UEs, P = -10 dBm, concrete).

(a) the true NLoS phase perturbation g (eq. 20) over (Delta d, gamma) at random UE/AP pairs,
    the M x L training inputs, and the slice gamma = 20 deg of one AP;
(b) true vs GP perturbation (mean +- 2 std) along that slice;
(c) LoS-only, GP and true carrier phase along the slice (CPO 0, wrapped).

    python examples/paper/fig2_gp_example.py --out out/gp_example       # writes .png and .json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # examples/_helpers.py
from _helpers import fit_and_score, pyplot, slice_positions  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import gp  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-train", type=int, default=10)
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--ap", type=int, default=0, help="AP of the slice")
    ap.add_argument("--gamma-deg", type=float, default=20.0)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/gp_example"))
    args = ap.parse_args(argv)
    scene = dj.paper_scene(power_dbm=args.power_dbm)
    out = fit_and_score(scene, args.num_train, 200, seed=3)
    model, (x_train, _, _) = out["model"], out["train"]

    cloud = dj.sample_positions(jax.random.key(11), 400, scene)
    f_cloud = jax.vmap(gp.features, in_axes=(0, None))(cloud, scene).reshape(-1, 2)
    g_cloud = jax.vmap(dj.physics.phase_perturbation, in_axes=(0, None))(cloud, scene).reshape(-1)
    f_train = jax.vmap(gp.features, in_axes=(0, None))(x_train, scene).reshape(-1, 2)

    xs = slice_positions(scene, args.ap, np.radians(args.gamma_deg), 300)
    f_slice = jax.vmap(gp.features, in_axes=(0, None))(xs, scene)[:, args.ap]
    g_true = jax.vmap(dj.physics.phase_perturbation, in_axes=(0, None))(xs, scene)[:, args.ap]
    g_mean, g_var = jax.vmap(model.perturbation)(xs)
    g_mean, g_std = g_mean[:, args.ap], jnp.sqrt(g_var[:, args.ap])
    # the GP learns g up to a constant (absorbed by the training CPOs): align it for (b)
    offset = float(jnp.mean(g_mean - g_true))
    los = dj.wrap(jax.vmap(gp.los_phase, in_axes=(0, None))(xs, scene)[:, args.ap])
    theta_gp = dj.wrap(jax.vmap(model.mean)(xs)[:, args.ap] - offset)
    theta_true = dj.wrap(jax.vmap(dj.TwoRayModel(scene).mean)(xs)[:, args.ap])
    slice_err_deg = float(jnp.degrees(jnp.sqrt(jnp.mean((g_mean - offset - g_true) ** 2))))

    summary = dict(
        L=args.num_train,
        power_dbm=args.power_dbm,
        gamma_deg=args.gamma_deg,
        ap=args.ap,
        slice_rmse_deg=slice_err_deg,
        constant_offset_rad=offset,
        test_rmse_deg_gp=out["gp_rmse_deg"],
        test_rmse_deg_theory=out["theory_rmse_deg"],
        hyperparameters=out["hyperparameters"],
        slice=dict(
            delta_d=np.asarray(f_slice[:, 0]).tolist(),
            g_true=np.asarray(g_true).tolist(),
            g_gp=np.asarray(g_mean - offset).tolist(),
            g_gp_std=np.asarray(g_std).tolist(),
        ),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    print(
        f"L = {args.num_train}: GP error along the slice {slice_err_deg:.3f} deg; "
        f"test modeling RMSE GP {out['gp_rmse_deg']:.4f} deg, theory {out['theory_rmse_deg']:.4f} deg"
    )
    print(f"wrote {args.out.with_suffix('.json')}")
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    sc = axes[0].scatter(f_cloud[:, 0], jnp.degrees(f_cloud[:, 1]), c=g_cloud, s=2, cmap="coolwarm")
    axes[0].scatter(
        f_train[:, 0], jnp.degrees(f_train[:, 1]), c="k", s=8, marker="x", label="training"
    )
    axes[0].plot(f_slice[:, 0], np.full(f_slice.shape[0], args.gamma_deg), "r-", label="slice")
    axes[0].set(xlabel="Delta d [m]", ylabel="gamma [deg]", title="(a) NLoS phase perturbation g")
    fig.colorbar(sc, ax=axes[0], label="g [rad]")
    axes[0].legend(loc="upper right")
    d = f_slice[:, 0]
    axes[1].fill_between(
        d, g_mean - offset - 2 * g_std, g_mean - offset + 2 * g_std, color="r", alpha=0.2
    )
    axes[1].plot(d, g_mean - offset, "r-", label="GP mean +- 2 std")
    axes[1].plot(d, g_true, "k--", label="theoretical")
    axes[1].set(
        xlabel="Delta d [m]",
        ylabel="g [rad]",
        title=f"(b) perturbation, gamma = {args.gamma_deg:g} deg",
    )
    axes[1].legend()
    axes[2].plot(d, los, "b-", label="LoS only")
    axes[2].plot(d, theta_gp, "r-", label="GP model")
    axes[2].plot(d, theta_true, "k--", label="theoretical")
    axes[2].set(
        xlabel="Delta d [m]", ylabel="carrier phase [rad]", title="(c) carrier phase (CPO 0)"
    )
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(args.out.with_suffix(".png"), dpi=130)
    print(f"wrote {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
