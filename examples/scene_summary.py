"""The paper's scene, its two-ray phases and the position error bound (a one-screen summary).

Prints, for the paper's scene (17 APs, 800 MHz, concrete ground, TE) at the chosen power:
the effective carrier phases and phase-noise standard deviations at one UE position,
the PEB there, and the mean/median PEB over random UE positions in the UE region.

    python examples/scene_summary.py                       # P = -10 dBm, concrete
    python examples/scene_summary.py --power-dbm -40 --material glass --json out/quick.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics and bounds in float64 (entry point)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import dmimo_jax as dj  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--power-dbm", type=float, default=-10.0, help="transmit power P in dBm")
    parser.add_argument("--material", default="concrete", choices=dj.materials.material_names())
    parser.add_argument(
        "--convention",
        default="paper",
        choices=["paper", "itu"],
        help="permittivity convention (paper: f in Hz as in the paper; itu: correct)",
    )
    parser.add_argument("--polarization", default="TE", choices=["TE", "TM"])
    parser.add_argument(
        "--ue",
        type=float,
        nargs=3,
        default=[6.5, 5.0, 2.0],
        metavar=("X", "Y", "Z"),
        help="UE position in metres",
    )
    parser.add_argument("--num-positions", type=int, default=1280, help="random UEs for PEB stats")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write the results here")
    args = parser.parse_args(argv)

    t_start = time.perf_counter()
    scene = dj.paper_scene(
        args.power_dbm, args.material, convention=args.convention, polarization=args.polarization
    )
    x = jnp.asarray(args.ue)
    theta = dj.physics.effective_phase(x, scene)
    sigma = jnp.sqrt(dj.physics.phase_noise_var(x, scene))
    perturbation = dj.physics.phase_perturbation(x, scene)
    peb_x = float(dj.peb(x, scene))

    print(f"dmimo_jax {dj.__version__} on {jax.devices()[0].platform}")
    print(scene)
    print(f"\nUE at {np.asarray(x)} m")
    print(
        f"{'AP':>3} {'position [m]':>22} {'theta [rad]':>12} {'NLoS pert. [rad]':>17} {'sigma [rad]':>12}"
    )
    for m, (p, t, g, s) in enumerate(
        zip(
            np.asarray(scene.ap_positions),
            np.asarray(theta),
            np.asarray(perturbation),
            np.asarray(sigma),
            strict=True,
        )
    ):
        print(f"{m:>3} {np.array2string(p, precision=2):>22} {t:>12.6f} {g:>17.6f} {s:>12.3e}")
    print(f"\nPEB at UE: {peb_x * 1e6:.2f} um")

    xs = dj.sample_positions(jax.random.key(args.seed), args.num_positions, scene)
    t0 = time.perf_counter()
    pebs = np.asarray(dj.peb_map(xs, scene))
    t_peb = time.perf_counter() - t0
    result = {
        "power_dbm": args.power_dbm,
        "material": args.material,
        "convention": args.convention,
        "polarization": args.polarization,
        "eps_r": [float(scene.eps_r.real), float(scene.eps_r.imag)],
        "ue_m": list(map(float, args.ue)),
        "effective_phase_rad": np.asarray(theta).tolist(),
        "noise_std_rad": np.asarray(sigma).tolist(),
        "peb_at_ue_m": peb_x,
        "num_positions": args.num_positions,
        "seed": args.seed,
        "mean_peb_m": float(pebs.mean()),
        "median_peb_m": float(np.median(pebs)),
        "p95_peb_m": float(np.percentile(pebs, 95)),
        "peb_map_s": t_peb,
        "wall_s": time.perf_counter() - t_start,
    }
    print(
        f"PEB over {args.num_positions} random UEs (seed {args.seed}): "
        f"mean {result['mean_peb_m'] * 1e6:.2f} um, median {result['median_peb_m'] * 1e6:.2f} um, "
        f"95th pct {result['p95_peb_m'] * 1e6:.2f} um  ({t_peb:.2f} s incl. compile)"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    return result


if __name__ == "__main__":
    main()
