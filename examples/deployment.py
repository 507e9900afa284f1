"""From the paper's world to a real deployment: self-calibrate the whole model from L labeled
snapshots, then position under the calibrated model.

The world (generated, then hidden from every method): the paper's 17 ceiling APs in its
10 x 10 x 4 m room, each phase centre off its surveyed position by N(0, 5 mm) laterally
(mounted on the ceiling), per-AP phase offsets uniform in [-pi, pi) (unsynchronized
oscillators), a concrete floor, a plasterboard ceiling and four walls of different materials
(brick, wood, glass, concrete; ITU-R P.2040 at 800 MHz); with ``--patch``, every AP is also a
downward patch of exponent q = 1.7 that the method believes to be q = 1.

Every method gets the same L = 50 labeled snapshots (P = -10 dBm) and positions the same test
UEs (random CPOs). Rows: the PEB of the world; the surveyed nominal room (every surface
guessed concrete, surveyed positions, no offsets) + MLE; the paper's GP pipeline (GP on the
labeled snapshots, its lambda/4 table screen + 2 exact GP steps); two rays calibrated
(phase centres, offsets, ground; walls ignored) + MLE; the room calibrated
(``dj.calibration.calibrate``: phase centres within the ceiling, offsets, the five surfaces
a path bounces off) + MLE; the calibrated room + the learned online stage (a cell classifier
trained on the calibrated room, ``pipeline.run_offline(model=...)``: 16 candidate cells ->
two-tier screen of the room's tables -> 2 refinement steps under the calibrated room); the
true world + MLE. Every MLE is the certified lambda/8 table
search over the UE region (``dj.egs``, table built beforehand) + Levenberg-Marquardt
refinement. Also the calibration table: truth, estimate and standard error per group.

    python examples/deployment.py                 # 1280 test UEs
    python examples/deployment.py --quick         # 256 test UEs
    python examples/deployment.py --patch         # patch antennas of unknown exponent too
    python examples/deployment.py --world two-ray --patch   # free APs off by N(0, 1 cm) in 3-D
    python examples/deployment.py --world two-ray --patch --unlabeled 1024

With ``--unlabeled N`` the last calibration is repeated with N unlabeled snapshots of the
world (other random positions; their noise variances known, as the labeled ones'), located
by the lambda/8 MLE under the labeled calibration (``calibrate(..., unlabeled=...)``: their
positions profiled out); the learned stage then runs under that calibration.

Writes ``OUT.json`` (rows, calibration table) and ``OUT.png`` (error CDFs; needs matplotlib).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _helpers import pyplot, repeat_style, save_figure, timed_passes, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import estimators as est  # noqa: E402
from dmimo_jax import gp, pipeline  # noqa: E402
from dmimo_jax.benchmarking import check_options  # noqa: E402
from dmimo_jax.calibration import Unlabeled, calibrate  # noqa: E402
from dmimo_jax.datasets import sample_world_positions, synthetic_deployment  # noqa: E402
from dmimo_jax.learning import get_preset  # noqa: E402

TRUE_EXPONENT = 1.7  # synthetic_deployment's default


def world(args):
    """(true world, surveyed scene, nominal model): ``datasets.synthetic_deployment``."""
    return synthetic_deployment(args.power_dbm, seed=args.seed, world=args.world, patch=args.patch)


def snapshots(key, model, scene, num):
    """Positions in the UE region (in the air: not inside a solid of a scene of faces), CPOs,
    the world's noisy phases and its noise variances."""
    k_x, k_cpo, k_noise = jax.random.split(key, 3)
    x = sample_world_positions(k_x, num, model)
    r = dj.simulate_phases_batch(k_noise, model, x, dj.random_cpos(k_cpo, num))
    return x, r, jax.vmap(model.variance)(x)


def mle(model, r, spacing_div=8, repeats=1, starts=1):
    """lambda/8 table search over the UE region (table built first, not timed) + refinement,
    then the cost gate (``estimators.recheck_costly``); the median of ``repeats`` timed
    passes. With ``starts`` > 1 the ``starts`` most coherent table points are each refined
    and the lowest ML cost wins (``estimators.coarse_to_fine``): in a scene of faces the
    table's best point can sit across a shadow boundary from the UE, where one refinement
    cannot follow; the gate's dense local window then finds the UE's side."""
    scene = model.scene
    t0 = time.perf_counter()
    spacing = float(scene.wavelength) / spacing_div
    table = est.phasor_table(model, est.search_grid(scene, spacing, "ue"))
    jax.block_until_ready(table.data)
    t_table = time.perf_counter() - t0

    def run(r):
        if starts > 1:
            parts = [
                est.coarse_to_fine(r[i : i + 128], model, table, num_starts=starts)
                for i in range(0, len(r), 128)
            ]
            found = jax.tree.map(lambda *a: jnp.concatenate(a), *parts)
        else:
            coarse = [dj.egs(r[i : i + 128], model, table).x for i in range(0, len(r), 128)]
            found = dj.refine_batch(jnp.concatenate(coarse), r, model)
        # the cost gate: an answer whose ML cost is not a right answer's is searched again
        # in a dense window around it (a shadow boundary can sit between it and the UE)
        return est.recheck_costly(r, model, found)[0].x

    jax.block_until_ready(run(r[:128]))  # compile outside the timing
    fine, seconds = timed_passes(lambda: run(r), repeats)
    return np.asarray(fine), seconds, t_table


def gp_pipeline(x_l, r_l, nv_l, scene, r, repeats=1):
    """The paper's GP on the labeled snapshots, its lambda/4 table screen + 2 exact GP steps
    (the median of ``repeats`` timed passes)."""
    t0 = time.perf_counter()
    gp_model = pipeline.fit_phase_model(x_l, r_l, nv_l, scene)
    screen = gp.TabulatedGPModel.from_model(gp_model, variance=False)
    table = est.phasor_table(screen, est.search_grid(scene, float(scene.wavelength) / 4, "ue"))
    jax.block_until_ready(table.data)
    t_off = time.perf_counter() - t0

    def run(r):
        return dj.refine_batch(est.coarse_to_fine(r, screen, table).x, r, gp_model, num_steps=2).x

    jax.block_until_ready(run(r[:128]))  # compile outside the timing
    fine, seconds = timed_passes(lambda: run(r), repeats)
    return np.asarray(fine), seconds, t_off


def learned(model, x_l, r_l, nv_l, x, r, args):
    """The learned online stage trained on ``model`` (no GP): cells -> screen -> 3 steps ->
    the cost gate (an answer far above chi-square is re-screened over the whole region)."""
    cells = get_preset(args.preset).cells
    if args.num_samples is not None:  # a smaller synthetic set (and minibatch) for smoke runs
        n = args.num_samples
        train = dataclasses.replace(cells.train, batch_size=min(cells.train.batch_size, n // 10))
        cells = dataclasses.replace(cells, num_samples=n, train=train)
    t0 = time.perf_counter()
    off = pipeline.run_offline(
        x_l,
        r_l,
        nv_l,
        model.scene,
        model=model,
        kinds=("cells",),
        preset=args.preset,
        cells=cells,
        cache_dir=args.cache,
        seed=args.seed,
    )
    t_off = time.perf_counter() - t0
    loc = pipeline.Locator.from_offline(off, "cells")
    jax.block_until_ready(loc(r).x)  # compile outside the timing
    out, t = timed_passes(lambda: loc(r), args.repeats)  # the one program
    # the classifier's cells, for the recall (its stage alone, untimed)
    true_cell = np.asarray(off.cells.cells.index(jnp.asarray(x)))
    recall = np.any(np.asarray(loc.coarse(r)[0]) == true_cell[:, None], axis=1)
    extra = dict(
        offline_s=t_off,
        cell_recall=float(recall.mean()),
        fallback_fraction=float(np.mean(np.asarray(out.fallback))),
        recovered_fraction=float(np.mean(np.asarray(out.recovered))),
        rejected_fraction=float(np.mean(np.asarray(out.rejected))),
    )
    return np.asarray(out.x), t, extra


def score(method, x, fine, seconds, pebs, **extra):
    """Errors against the world's PEBs: RMSE over the mean PEB (the issue's measure) and
    over the RMS PEB (what an efficient estimator reaches: E e_i^2 = PEB_i^2)."""
    e = np.linalg.norm(fine - np.asarray(x), axis=1)
    rmse = float(np.sqrt(np.mean(e**2)))
    return dict(
        method=method,
        fine_rmse_m=rmse,
        fine_over_peb=rmse / float(np.mean(pebs)),
        fine_over_rms_peb=rmse / float(np.sqrt(np.mean(pebs**2))),
        p99_m=float(np.percentile(e, 99)),
        max_m=float(e.max()),
        ms_per_snapshot=1e3 * seconds / len(e),
        errors_m=e.tolist(),
        **extra,
    )


def calibration_table(cal, truth, fit) -> list[dict]:
    """Truth, estimate and standard error per group (summaries for the APs)."""
    rows = []
    if "ap_positions" in fit:
        err = np.linalg.norm(
            np.asarray(cal.values["ap_positions"]) - truth.scene.ap_positions, axis=1
        )
        se = np.linalg.norm(np.asarray(cal.stderr["ap_positions"]), axis=1)
        rows.append(
            dict(
                group="ap_positions",
                what="phase-centre error |estimate - truth| (17 APs)",
                median=float(np.median(err)),
                max=float(err.max()),
                median_stderr=float(np.median(se)),
                unit="m",
            )
        )
    if "ap_phase_offsets" in fit:
        want = np.asarray(truth.scene.ap_phase_offsets)
        err = np.abs(
            np.angle(np.exp(1j * (np.asarray(cal.values["ap_phase_offsets"]) - (want - want[0]))))
        )
        rows.append(
            dict(
                group="ap_phase_offsets",
                what="offset error (relative to AP 0, the gauge)",
                median=float(np.median(err[1:])),
                max=float(err.max()),
                median_stderr=float(np.median(np.asarray(cal.stderr["ap_phase_offsets"])[1:])),
                unit="rad",
            )
        )
    if "surfaces" in fit:
        if isinstance(truth, dj.TwoRayModel):
            true_eps = {"ground": complex(truth.scene.eps_r)}
        elif isinstance(truth, dj.MeshModel):  # a box room's walls are the faces' walls; its
            true_eps = {f.name: complex(f.eps_r) for f in truth.faces}  # floor has no one truth
            true_eps.update({f"wall_{w}": true_eps["walls"] for w in ("x0", "x1", "y0", "y1")})
        else:  # a two-ray model calibrated in a room: its ground is the floor
            true_eps = {r.name: complex(r.eps_r) for r in truth.reflectors}
            true_eps["ground"] = true_eps["floor"]
        for name, e, s in zip(
            cal.surfaces, cal.values["surfaces"], cal.stderr["surfaces"], strict=True
        ):
            t = true_eps.get(name)
            rows.append(
                dict(
                    group="surfaces",
                    what=name,
                    truth=None if t is None else [t.real, t.imag],
                    estimate=[float(np.real(e)), float(np.imag(e))],
                    stderr=[float(np.real(s)), float(np.imag(s))],
                    relative_error=None if t is None else float(abs(complex(e) / t - 1)),
                )
            )
    if "antenna" in fit:
        rows.append(
            dict(
                group="antenna",
                what="cosine exponent q",
                truth=TRUE_EXPONENT,
                estimate=float(cal.values["antenna"]),
                stderr=float(cal.stderr["antenna"]),
            )
        )
    return rows


def print_tables(result):
    print(
        f"\n{'method':<62} {'fine RMSE':>10} {'/ PEB':>8} {'/ RMS PEB':>9} {'p99':>10} "
        f"{'max':>10} {'ms/snap':>8}"
    )
    for row in result["rows"]:
        print(
            f"{row['method']:<62} {row['fine_rmse_m']:10.3e} {row['fine_over_peb']:8.2f} "
            f"{row['fine_over_rms_peb']:9.2f} {row['p99_m']:10.3e} {row['max_m']:10.3e} "
            f"{row['ms_per_snapshot']:8.2f}"
        )
    for row in result["rows"]:
        if "cell_recall" in row:
            print(
                f"learned stage: cell recall {row['cell_recall']:.4f}, fallback "
                f"{row['fallback_fraction']:.4f} (recovered by the cost gate "
                f"{row['recovered_fraction']:.4f}), agrees with the calibrated MLE within 1 mm "
                f"{row['agrees_with_calibrated_mle']:.4f}, rejected {row['rejected_fraction']:.4f}; "
                f"offline {row['offline_s']:.0f} s + calibration {row['calibration_s']:.1f} s"
            )
    for name, table in result["calibration"].items():
        print(
            f"\ncalibration: {name} ({table['seconds']:.1f} s, reduced chi2 {table['reduced_chi2']:.3f})"
        )
        if "unlabeled_used" in table:
            print(
                f"  unlabeled snapshots used {table['unlabeled_used']}, their positions off by "
                f"{table['unlabeled_error_median_m']:.3g} m (median)"
            )
        for row in table["groups"]:
            if "median" in row:
                print(
                    f"  {row['group']:<17} {row['what']:<48} median {row['median']:.3g} "
                    f"max {row['max']:.3g} (s.e. {row['median_stderr']:.2g}) {row['unit']}"
                )
            else:
                print(
                    f"  {row['group']:<17} {row['what']:<48} truth {row['truth']} estimate "
                    f"{np.round(row['estimate'], 5).tolist()} s.e. {np.round(row['stderr'], 5).tolist()}"
                )


def plot(result, path):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    drawn = []
    for row in result["rows"]:
        e = np.sort(row["errors_m"])
        label, style = repeat_style(drawn, row["method"], row["errors_m"])
        ax.semilogx(e, np.arange(1, e.size + 1) / e.size, label=label, **style)
    ax.axvline(result["mean_peb_m"], color="k", ls=":", label="mean PEB of the world")
    ax.set(
        xlabel="position error (m)",
        ylabel="ECDF",
        title="A deployment as it is: calibrate, then locate",
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    save_figure(fig, path)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--num-train", type=int, default=50)
    ap.add_argument("--num-test", type=int, default=1280)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--world", default="room", choices=["room", "two-ray", "faces"])
    ap.add_argument("--patch", action="store_true", help="patch antennas of unknown exponent")
    ap.add_argument("--quick", action="store_true", help="256 test UEs")
    ap.add_argument(
        "--unlabeled",
        type=int,
        default=0,
        help="also calibrate with this many unlabeled snapshots (the deployment's traffic)",
    )
    ap.add_argument(
        "--no-baselines",
        dest="baselines",
        action="store_false",
        help="skip the paper's GP and, in the room, the calibrated two-ray rows",
    )
    ap.add_argument("--preset", default="cpu", choices=["quick", "cpu", "paper"])
    ap.add_argument("--spacing-div", type=int, default=8, help="MLE grid: lambda / this")
    ap.add_argument(
        "--mle-starts", type=int, default=1, help="MLE: refine this many table points, best wins"
    )
    ap.add_argument("--num-samples", type=int, default=None, help="cells' synthetic set")
    ap.add_argument(
        "--repeats", type=int, default=3, help="timed passes per row (the median is reported)"
    )
    ap.add_argument(
        "--cache", type=pathlib.Path, default=None, help="default: the user cache directory"
    )
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/deployment"))
    ap.add_argument("--json", type=pathlib.Path, default=None, help="default OUT.json")
    args = ap.parse_args(argv)
    check_options(spacing_div=args.spacing_div, repeats=args.repeats)
    if args.quick:
        args.num_test = 256
    json_path = args.json or args.out.with_suffix(".json")
    truth, surveyed, nominal = world(args)
    key_train, key_test = jax.random.split(jax.random.key(args.seed))
    x_l, r_l, nv_l = snapshots(key_train, truth, surveyed, args.num_train)
    x, r, _ = snapshots(key_test, truth, surveyed, args.num_test)
    pebs = np.asarray(dj.peb_map(x, truth))
    mean_peb = float(pebs.mean())
    print(
        f"world: {truth}; {truth.scene}\nmean PEB {mean_peb:.3e} m, RMS "
        f"{np.sqrt(np.mean(pebs**2)):.3e} m (p99 {np.percentile(pebs, 99):.3e})"
    )

    fit = ("ap_positions", "ap_phase_offsets", "surfaces") + (("antenna",) if args.patch else ())
    rows, tables = [], {}
    rows.append(
        score(
            f"surveyed nominal {args.world} (ITU guesses) + MLE",
            x,
            *mle(nominal, r, args.spacing_div, args.repeats, args.mle_starts)[:2],
            pebs,
        )
    )
    if args.baselines:
        fine, t, t_off = gp_pipeline(x_l, r_l, nv_l, surveyed, r, args.repeats)
        rows.append(
            score(
                f"paper's GP (L={args.num_train}) + lambda/4 screen + 2 GP steps",
                x,
                fine,
                t,
                pebs,
                offline_s=t_off,
            )
        )
    calibrations = []  # in the room, the two-ray calibration is a baseline
    if args.world == "faces":  # the box room is the baseline of the scene of faces
        box = dj.room_model(surveyed, ceiling="concrete", walls="concrete", floor="concrete")
        calibrations += [("box room", box), ("faces", nominal)]
    elif args.baselines or args.world == "two-ray":
        calibrations.append(("two rays", dj.TwoRayModel(surveyed)))
    if args.world == "room":
        calibrations.append(("room", nominal))
    for name, model in calibrations:
        t0 = time.perf_counter()
        cal = calibrate(model, x_l, r_l, nv_l, fit=fit, warn=False)
        t_cal = time.perf_counter() - t0
        tables[name] = dict(
            seconds=t_cal,
            reduced_chi2=float(cal.reduced_chi2),
            fit=list(fit),
            groups=calibration_table(cal, truth, fit),
        )
        fine, t, t_table = mle(cal.model, r, args.spacing_div, args.repeats, args.mle_starts)
        rows.append(
            score(
                f"{name} calibrated from L={args.num_train} + MLE",
                x,
                fine,
                t,
                pebs,
                calibration_s=t_cal,
                table_s=t_table,
            )
        )
    if args.unlabeled:
        # traffic: snapshots nobody labeled, located by the MLE under the labeled calibration
        key_traffic = jax.random.fold_in(jax.random.key(args.seed), 1)
        x_u, r_u, nv_u = snapshots(key_traffic, truth, surveyed, args.unlabeled)
        x0 = mle(cal.model, r_u, args.spacing_div)[0]
        t0 = time.perf_counter()
        cal = calibrate(
            model, x_l, r_l, nv_l, fit=fit, warn=False, unlabeled=Unlabeled(r_u, nv_u, x0)
        )
        t_cal = time.perf_counter() - t0
        name = f"{name} + {args.unlabeled} unlabeled"
        used = np.asarray(cal.unlabeled_used)
        tables[name] = dict(
            seconds=t_cal,
            reduced_chi2=float(cal.reduced_chi2),
            fit=list(fit),
            groups=calibration_table(cal, truth, fit),
            unlabeled_used=int(used.sum()),
            unlabeled_error_median_m=float(
                np.median(np.linalg.norm(np.asarray(cal.unlabeled_x - x_u), axis=1)[used])
            ),
        )
        fine, t, t_table = mle(cal.model, r, args.spacing_div, args.repeats, args.mle_starts)
        rows.append(
            score(
                f"{name} (L={args.num_train}) + MLE",
                x,
                fine,
                t,
                pebs,
                calibration_s=t_cal,
                table_s=t_table,
            )
        )
    # the learned online stage under the last calibrated model: cells -> screen -> 3 steps
    fine_learned, t, extra = learned(cal.model, x_l, r_l, nv_l, x, r, args)
    agree = np.linalg.norm(fine_learned - fine, axis=1) < 1e-3  # vs the calibrated room's MLE
    rows.append(
        score(
            f"{name} calibrated + learned cells -> screen -> 3 steps -> gate",
            x,
            fine_learned,
            t,
            pebs,
            agrees_with_calibrated_mle=float(agree.mean()),
            calibration_s=t_cal,
            **extra,
        ),
    )
    rows.append(
        score(
            "true world + MLE",
            x,
            *mle(truth, r, args.spacing_div, args.repeats, args.mle_starts)[:2],
            pebs,
        )
    )
    result = dict(
        power_dbm=args.power_dbm,
        num_train=args.num_train,
        num_test=args.num_test,
        num_unlabeled=args.unlabeled,
        seed=args.seed,
        world=args.world,
        patch=args.patch,
        mean_peb_m=mean_peb,
        rms_peb_m=float(np.sqrt(np.mean(pebs**2))),
        p99_peb_m=float(np.percentile(pebs, 99)),
        rows=rows,
        calibration=tables,
    )
    print_tables(result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(json_path, result)
    plot(result, args.out.with_suffix(".png"))
    print(f"\nwrote {json_path} and {args.out.with_suffix('.png')}")
    return result


if __name__ == "__main__":
    main()
