"""Beyond two rays: the paper's scene inside a room with a ceiling and walls.

The true channel is the image-source model (``dj.room_model``): LoS, the floor, and the
first-order bounce on the ceiling and the four walls (ITU-R P.2040 permittivities at
800 MHz, correct convention; the ceiling gives no first-order bounce to the APs mounted on
it). On 1280 random UEs (random CPOs, P = -10 dBm) it compares

  (a) the PEB of the room model;
  (b) the MLE that assumes two rays (the scene's true ground, no walls);
  (c) the MLE with the true room model;
  (d) the paper's GP (ground-only features: Delta d and the ground incidence angle) fitted on
      L = 50 labeled snapshots of the room, with the network-free hierarchical screen of its
      tabulated mean and two exact GP steps (the online stage without the network: the
      learned stage only makes it faster, its recall is 100% in benchmarks/online_latency.py);
  (e) the MLE with the room *calibrated* from the same L = 50 labeled snapshots: the planes
      are known, every surface's eps_r is fitted jointly (``calibration.fit_surfaces``);
      and, for contrast, the two-ray model whose ground alone is calibrated on them.

Every MLE is the lambda/4 screen + 32-start refinement (``coarse_to_fine``; with metal walls
the phase varies so fast that 8 starts missed the basin for 1 UE in 128, 32 found all).
Then the same rows as the walls grow more reflective: absent -> plasterboard -> concrete ->
metal.

    python examples/multipath_room.py                 # 1280 UEs, four wall materials
    python examples/multipath_room.py --quick         # 256 UEs, walls concrete and absent
    python examples/multipath_room.py --resume        # keep finished wall settings

Writes ``OUT.json`` (rows per wall material) and ``OUT.png`` (fine/PEB per estimator vs the
wall material; needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _helpers import pyplot, save_figure  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import calibration, gp, pipeline  # noqa: E402
from dmimo_jax import estimators as est  # noqa: E402
from dmimo_jax.benchmarking import read_rows  # noqa: E402

WALLS = ("none", "plasterboard", "concrete", "metal")


def snapshots(key, model, num):
    """Positions, CPOs, noisy phases of the true model and its phase-noise variances."""
    k_x, k_cpo, k_noise = jax.random.split(key, 3)
    x = dj.sample_positions(k_x, num, model.scene)
    r = dj.simulate_phases_batch(k_noise, model, x, dj.random_cpos(k_cpo, num))
    return x, r, jax.vmap(model.variance)(x)


def mle(model, r, num_starts):
    """lambda/4 screen of the model's own table + multi-start refinement (coarse_to_fine)."""
    scene = model.scene
    table = est.phasor_table(model, est.search_grid(scene, float(scene.wavelength) / 4, "ue"))
    t0 = time.perf_counter()
    out = est.coarse_to_fine(r, model, table, num_starts=num_starts)
    jax.block_until_ready(out.x)
    return np.asarray(out.start), np.asarray(out.x), time.perf_counter() - t0


def gp_screen(gp_model, r, num_starts):
    """The tabulated GP's lambda/4 screen + multi-start refinement, then two exact GP steps."""
    screen = gp.TabulatedGPModel.from_model(gp_model, variance=False)
    scene = gp_model.scene
    table = est.phasor_table(screen, est.search_grid(scene, float(scene.wavelength) / 4, "ue"))
    t0 = time.perf_counter()
    out = est.coarse_to_fine(r, screen, table, num_starts=num_starts)
    fine = dj.refine_batch(out.x, r, gp_model, num_steps=2).x
    jax.block_until_ready(fine)
    return np.asarray(out.start), np.asarray(fine), time.perf_counter() - t0


def score(method, x, coarse, fine, seconds, mean_peb, **extra):
    ec = np.linalg.norm(coarse - x, axis=1)
    ef = np.linalg.norm(fine - x, axis=1)
    rmse = float(np.sqrt(np.mean(ef**2)))
    return dict(
        method=method,
        coarse_rmse_m=float(np.sqrt(np.mean(ec**2))),
        fine_rmse_m=rmse,
        p99_m=float(np.percentile(ef, 99)),
        max_m=float(ef.max()),
        fine_over_peb=rmse / mean_peb,
        mean_peb_m=mean_peb,
        seconds=seconds,
        **extra,
    )


def run_setting(args, walls: str) -> dict:
    scene = dj.paper_scene(args.power_dbm, args.ground, convention="itu")
    wall_spec = None if walls == "none" else walls
    truth = dj.room_model(scene, ceiling=args.ceiling, walls=wall_spec)
    key_train, key_test = jax.random.split(jax.random.key(args.seed))
    x_l, r_l, nv_l = snapshots(key_train, truth, args.num_train)
    x, r, _ = snapshots(key_test, truth, args.num_test)
    x_np = np.asarray(x)
    pebs = np.asarray(dj.peb_map(x, truth))
    mean_peb = float(np.mean(pebs))
    two_ray = dj.TwoRayModel(scene)
    moved = np.asarray(jax.vmap(truth.mean)(x_l) - jax.vmap(two_ray.mean)(x_l))
    moved = np.abs((moved + np.pi) % (2 * np.pi) - np.pi)
    print(
        f"walls {walls}: {truth}; mean PEB {mean_peb:.3e} m; the bounces move the phase by a "
        f"median {np.median(moved):.3f} rad (max {moved.max():.3f})"
    )
    rows = [
        dict(
            method="(a) PEB of the room model",
            mean_peb_m=mean_peb,
            p99_peb_m=float(np.percentile(pebs, 99)),
            max_peb_m=float(pebs.max()),
        )
    ]
    rows.append(
        score("(b) MLE assuming two rays", x_np, *mle(two_ray, r, args.num_starts), mean_peb)
    )
    rows.append(score("(c) MLE, true room model", x_np, *mle(truth, r, args.num_starts), mean_peb))

    t0 = time.perf_counter()
    gp_model = pipeline.fit_phase_model(x_l, r_l, nv_l, scene)
    t_fit = time.perf_counter() - t0
    rows.append(
        score(
            f"(d) paper's GP (L={args.num_train}) + screen + 2 exact steps",
            x_np,
            *gp_screen(gp_model, r, args.num_starts),
            mean_peb,
            offline_s=t_fit,
        )
    )

    placeholder = dj.room_model(
        scene, ceiling=3.0, walls=None if walls == "none" else 3.0, floor=3.0
    )
    calibrations = (
        (
            f"(e) MLE, room calibrated from L={args.num_train} (materials unknown)",
            lambda: calibration.fit_surfaces(x_l, r_l, nv_l, placeholder),
        ),
        (
            f"(e') MLE, two rays with the ground calibrated from L={args.num_train}",
            lambda: calibration.fit_material(x_l, r_l, nv_l, scene),
        ),
    )
    for method, calibrate in calibrations:
        t0 = time.perf_counter()
        cal = calibrate()
        t_cal = time.perf_counter() - t0
        eps = np.atleast_1d(np.asarray(cal.eps_r))
        fitted = {n: complex(e) for n, e in zip(cal.surfaces, eps, strict=True)}
        print(
            f"  {method[:4]} calibrated ({cal.polarization}, {t_cal:.1f} s): "
            + ", ".join(f"{n} {e:.3f}" for n, e in fitted.items())
        )
        rows.append(
            score(
                method,
                x_np,
                *mle(cal.model, r, args.num_starts),
                mean_peb,
                offline_s=t_cal,
                calibrated_eps_r={n: [e.real, e.imag] for n, e in fitted.items()},
            )
        )
    return dict(
        walls=walls,
        ceiling=args.ceiling,
        ground=args.ground,
        power_dbm=args.power_dbm,
        num_test=args.num_test,
        num_train=args.num_train,
        num_starts=args.num_starts,
        median_phase_moved_rad=float(np.median(moved)),
        rows=rows,
    )


def print_setting(result: dict) -> None:
    print(f"\nwalls = {result['walls']} (ceiling {result['ceiling']}, ground {result['ground']})")
    head = f"{'method':<66} {'coarse RMSE':>11} {'fine RMSE':>10} {'p99':>10} {'max':>10} {'fine/PEB':>8}"
    print(head)
    for row in result["rows"]:
        if "fine_rmse_m" not in row:
            print(
                f"{row['method']:<66} {'':>11} {row['mean_peb_m']:10.3e} {row['p99_peb_m']:10.3e} {row['max_peb_m']:10.3e} {1.0:8.2f}"
            )
            continue
        print(
            f"{row['method']:<66} {row['coarse_rmse_m']:11.3e} {row['fine_rmse_m']:10.3e} "
            f"{row['p99_m']:10.3e} {row['max_m']:10.3e} {row['fine_over_peb']:8.2f}"
        )


def plot(results: list[dict], path: pathlib.Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.4), width_ratios=(1, 1, 0.8))
    walls = [res["walls"] for res in results]
    methods = [row["method"] for row in results[0]["rows"] if "fine_over_peb" in row]
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "--")]
    for ax, key, label in (
        (axes[0], "fine_rmse_m", "fine RMSE / mean PEB"),
        (axes[1], "p99_m", "p99 error / mean PEB"),
    ):
        for m, (marker, ls) in zip(methods, styles, strict=False):
            vals = [
                next(r[key] / r["mean_peb_m"] for r in res["rows"] if r["method"] == m)
                for res in results
            ]
            first = ax is axes[0]  # one legend, for both panels
            ax.semilogy(
                walls, vals, marker=marker, ls=ls, ms=7, mfc="none", label=m if first else None
            )
        ax.axhline(1.0, color="k", ls=":", label="PEB" if ax is axes[0] else None)
        ax.grid(True, which="both", alpha=0.3)
        ax.set(xlabel="wall material", ylabel=label)
    axes[0].set_title("Estimators in a room with walls (1280 UEs)")
    axes[2].axis("off")  # the legend's panel
    axes[2].legend(*axes[0].get_legend_handles_labels(), fontsize=7, loc="center left")
    axes[0].legend().set_visible(False)  # shown in the legend's panel
    save_figure(fig, path)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--walls", nargs="+", default=None, choices=WALLS, help=f"default {WALLS}")
    ap.add_argument("--ceiling", default="plasterboard")
    ap.add_argument("--ground", default="concrete")
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--num-train", type=int, default=50)
    ap.add_argument("--num-test", type=int, default=1280)
    ap.add_argument("--num-starts", type=int, default=32, help="refinement starts per snapshot")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="256 UEs; walls concrete and none")
    ap.add_argument("--resume", action="store_true", help="keep wall settings already in OUT.json")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/multipath_room"))
    args = ap.parse_args(argv)
    if args.quick:
        args.num_test = 256
    if args.walls is None:
        args.walls = ["none", "concrete"] if args.quick else list(WALLS)
    json_path, png_path = args.out.with_suffix(".json"), args.out.with_suffix(".png")
    done = {}
    if args.resume and json_path.exists():
        done = {res["walls"]: res for res in read_rows(json_path)}
    results = []
    for walls in args.walls:
        same = done.get(walls)
        if (
            same is not None
            and same["num_test"] == args.num_test
            and same["power_dbm"] == args.power_dbm
        ):
            results.append(same)
            print(f"walls {walls}: kept from {json_path}")
        else:
            results.append(run_setting(args, walls))
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(json.dumps(results, indent=1))  # after each setting: resumable
        print_setting(results[-1])
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1))
    print(f"wrote {json_path}")
    plot(results, png_path)
    return results


if __name__ == "__main__":
    main()
