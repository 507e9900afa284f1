"""Calibrate the ground from L labeled snapshots, then localize with the calibrated model.

Part 1: ``calibration.fit_material`` (profiled maximum likelihood through the two-ray model,
ITU-R starts, polarization selected by likelihood) on L labeled snapshots of the true
channel, for the five materials of Table I, both polarizations, P in {-60, ..., -10} dBm and
L in {5, 10, 50}: truth, estimate, standard error, relative error, the polarization picked,
and the time per fit (compilation apart). Metal is a perfect conductor: the fit runs with a
dielectric ground and is scored by |Gamma| at normal incidence.

Part 2: Fig. 5(a)'s power sweep at the paper's test point [6.5, 5, 2] m (CPO pi/2) with a
third family of curves: the MLE with the calibrated model (L = 50 at the same power), next to
the matched MLE, the mismatched ones (eps_r * beta) and the paper's GP (L = 50, its tabulated
screen + two exact steps). Every MLE is the lambda/4 screen + 8-start refinement
(``coarse_to_fine``) of its own model.

Part 3: the same estimators over random UEs at one power (fine RMSE / mean PEB).

Part 4: the coverage of ``calibration.material_posterior``'s credible intervals (numpyro
NUTS) over repeated data sets.

    python examples/calibrate_material.py              # the full grid (minutes)
    python examples/calibrate_material.py --quick      # fewer powers, L and draws

Writes ``OUT.json`` and ``OUT.png`` (the sweep; needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _helpers import pyplot, save_figure  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import calibration, gp, pipeline  # noqa: E402
from dmimo_jax import estimators as est  # noqa: E402
from dmimo_jax.benchmarking import read_rows  # noqa: E402

MATERIALS = ("wood", "plasterboard", "concrete", "glass", "metal")
TEST_POINT = (6.5, 5.0, 2.0)


def labeled(scene, num, seed):
    k_x, k_cpo, k_n = jax.random.split(jax.random.key(seed), 3)
    x = dj.sample_positions(k_x, num, scene)
    r = dj.simulate_phases_batch(k_n, scene, x, dj.random_cpos(k_cpo, num))
    return x, r, jax.vmap(dj.physics.phase_noise_var, (0, None))(x, scene)


def gamma_normal(eps, pec):
    return -1.0 + 0j if pec else complex(dj.physics.reflection_coefficient(1.0, eps))


def calibration_table(args) -> list[dict]:
    rows, compiled = [], set()
    for material in MATERIALS:
        for pol in ("TE", "TM"):
            for power in args.powers_dbm:
                truth = dj.paper_scene(
                    power, material, convention=args.convention, polarization=pol
                )
                fit_scene = (
                    truth.replace(perfect_conductor=False) if truth.perfect_conductor else truth
                )
                for num in args.num_train:
                    x, r, nv = labeled(truth, num, seed=num + int(power) * 7)
                    if (num, truth.perfect_conductor) not in compiled:  # time runs, not compiles
                        calibration.fit_material(x, r, nv, fit_scene)
                        compiled.add((num, truth.perfect_conductor))
                    t0 = time.perf_counter()
                    fit = calibration.fit_material(x, r, nv, fit_scene)
                    seconds = time.perf_counter() - t0
                    est_eps, true_eps = complex(fit.eps_r), complex(truth.eps_r)
                    if truth.perfect_conductor:
                        rel = abs(gamma_normal(est_eps, False) - gamma_normal(true_eps, True))
                    else:
                        rel = abs(est_eps / true_eps - 1)
                    rows.append(
                        dict(
                            material=material,
                            polarization=pol,
                            power_dbm=power,
                            L=num,
                            true_eps=[true_eps.real, true_eps.imag]
                            if not truth.perfect_conductor
                            else None,
                            eps=[est_eps.real, est_eps.imag],
                            stderr=[float(fit.stderr_real), float(fit.stderr_imag)],
                            relative_error=rel,
                            error_measure="|Gamma(0) + 1|"
                            if truth.perfect_conductor
                            else "|eps/eps_true - 1|",
                            picked=fit.polarization,
                            right_polarization=fit.polarization == pol,
                            seconds=seconds,
                        )
                    )
                    print(
                        f"{material:>12} {pol} P={power:5.0f} L={num:3d}: eps {est_eps:.4f} "
                        f"(+-{float(fit.stderr_real):.1e}, {float(fit.stderr_imag):.1e}) truth "
                        f"{'PEC' if truth.perfect_conductor else f'{true_eps:.4f}'} rel.err "
                        f"{rel:.2e} picked {fit.polarization} {seconds:.2f} s"
                    )
    return rows


def screen_table(model):
    """``model``'s phasor table over the UE region at lambda/4 (built once per model)."""
    scene = model.scene
    return est.phasor_table(model, est.search_grid(scene, float(scene.wavelength) / 4, "ue"))


def screened(model, table, r, gp_model=None):
    """The ``table`` screen + 8-start refinement of ``model`` (two exact GP steps for the GP)."""
    out = est.coarse_to_fine(r, model, table).x
    if gp_model is not None:
        out = dj.refine_batch(out, r, gp_model, num_steps=2).x
    return np.asarray(out)


def screened_errors(model, exact, table, r, x):
    """Position errors (B,) of :func:`screened` against the truth x ((3,) or (B, 3)), and RMSE."""
    e = np.linalg.norm(screened(model, table, r, exact) - np.asarray(x), axis=1)
    return e, float(np.sqrt(np.mean(e**2)))


def estimators_at(truth, args, power, built=None):
    """The believed models at one power: matched, mismatched, calibrated, GP, each as
    ``(model, exact GP or None, its screen table)``. ``built``: a dict that keeps the region
    power's for the run (the sweep and the region part share that power only: its
    calibration, GP and tables are built once; another power's tables, 38 MB each at
    lambda/4, are not kept)."""
    if built is not None and power in built:
        return built[power]
    out = _estimators_at(truth, args, power)
    if built is not None and power == args.region_power_dbm:
        built[power] = out
    return out


def _estimators_at(truth, args, power):
    x, r, nv = labeled(truth, 50, seed=1000 + int(power))
    fit = calibration.fit_material(x, r, nv, truth)
    gp_model = pipeline.fit_phase_model(x, r, nv, truth)
    models = {"matched MLE": (dj.TwoRayModel(truth), None)}
    for beta in args.betas:
        models[f"MLE beta={beta:g}"] = (
            dj.TwoRayModel(truth.replace(eps_r=beta * truth.eps_r)),
            None,
        )
    models["calibrated MLE (L=50)"] = (fit.model, None)
    models["GP (L=50) + screen + 2 exact steps"] = (
        gp.TabulatedGPModel.from_model(gp_model, variance=False),
        gp_model,
    )
    return {name: (m, exact, screen_table(m)) for name, (m, exact) in models.items()}, fit


def sweep(args, built=None) -> list[dict]:
    rows = []
    x0 = jnp.asarray(TEST_POINT)
    for power in args.powers_dbm:
        truth = dj.paper_scene(power, "concrete", convention=args.convention)
        models, fit = estimators_at(truth, args, power, built)
        xs = jnp.broadcast_to(x0, (args.draws, 3))
        r = dj.simulate_phases_batch(
            jax.random.key(int(power) + 77), truth, xs, jnp.full(args.draws, jnp.pi / 2)
        )
        peb = float(dj.peb(x0, truth))
        for name, (model, exact, table) in models.items():
            e, rmse = screened_errors(model, exact, table, r, x0)
            rows.append(
                dict(
                    method=name,
                    power_dbm=power,
                    rmse_m=rmse,
                    peb_m=peb,
                    rmse_over_peb=rmse / peb,
                    calibrated_eps=[float(jnp.real(fit.eps_r)), float(jnp.imag(fit.eps_r))],
                )
            )
            print(
                f"P={power:5.0f} dBm {name:<36} RMSE {rmse:.3e} m = {rmse / peb:8.2f} x PEB ({peb:.3e} m)"
            )
    return rows


def random_ues(args, built=None) -> list[dict]:
    truth = dj.paper_scene(args.region_power_dbm, "concrete", convention=args.convention)
    models, _ = estimators_at(truth, args, args.region_power_dbm, built)
    k_x, k_cpo, k_n = jax.random.split(jax.random.key(args.seed + 5), 3)
    xs = dj.sample_positions(k_x, args.num_test, truth)
    r = dj.simulate_phases_batch(k_n, truth, xs, dj.random_cpos(k_cpo, args.num_test))
    mean_peb = float(np.mean(np.asarray(dj.peb_map(xs, truth))))
    rows = []
    for name, (model, exact, table) in models.items():
        e, rmse = screened_errors(model, exact, table, r, xs)
        rows.append(
            dict(
                method=name,
                power_dbm=args.region_power_dbm,
                num_test=args.num_test,
                fine_rmse_m=rmse,
                p99_m=float(np.percentile(e, 99)),
                max_m=float(e.max()),
                mean_peb_m=mean_peb,
                fine_over_peb=rmse / mean_peb,
            )
        )
        print(
            f"{args.num_test} UEs, P={args.region_power_dbm} dBm {name:<36} RMSE {rmse:.3e} m = {rmse / mean_peb:8.2f} x mean PEB; max {e.max():.3e} m"
        )
    return rows


def coverage(args) -> dict:
    """Frequentist coverage of the NUTS credible intervals over repeated data sets."""
    truth = dj.paper_scene(
        args.coverage_power_dbm, args.coverage_material, convention=args.convention
    )
    true = np.array([float(jnp.real(truth.eps_r)), float(jnp.imag(truth.eps_r))])
    hits, widths = [], []
    t0 = time.perf_counter()
    for rep in range(args.coverage_repeats):
        x, r, nv = labeled(truth, args.coverage_L, seed=50_000 + rep)
        post = calibration.material_posterior(
            x, r, nv, truth, key=jax.random.key(rep), num_warmup=200, num_samples=400
        )
        low, high = (np.asarray(v) for v in post.interval(args.coverage_level))
        hits.append(((low <= true) & (true <= high)).tolist())
        widths.append((high - low).tolist())
    hits = np.asarray(hits)
    out = dict(
        material=args.coverage_material,
        power_dbm=args.coverage_power_dbm,
        L=args.coverage_L,
        level=args.coverage_level,
        repeats=args.coverage_repeats,
        coverage_real=float(hits[:, 0].mean()),
        coverage_imag=float(hits[:, 1].mean()),
        mean_width=np.mean(widths, axis=0).tolist(),
        seconds_per_posterior=(time.perf_counter() - t0) / args.coverage_repeats,
    )
    print(
        f"NUTS {args.coverage_level:.0%} intervals, {args.coverage_material} at {args.coverage_power_dbm} dBm, "
        f"L={args.coverage_L}, {args.coverage_repeats} data sets: cover Re eps {out['coverage_real']:.0%}, "
        f"Im eps {out['coverage_imag']:.0%}"
    )
    return out


def plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name in dict.fromkeys(r["method"] for r in rows):
        sel = sorted((r for r in rows if r["method"] == name), key=lambda r: r["power_dbm"])
        style = "s-" if "calibrated" in name else ("d-" if "GP" in name else "o-")
        ax.semilogy([s["power_dbm"] for s in sel], [s["rmse_m"] for s in sel], style, label=name)
    sel = sorted((r for r in rows if r["method"] == "matched MLE"), key=lambda r: r["power_dbm"])
    ax.semilogy([s["power_dbm"] for s in sel], [s["peb_m"] for s in sel], "k--", label="PEB")
    ax.set(
        xlabel="transmit power P [dBm]", ylabel="RMSE [m]", title="Fig. 5(a) with a calibrated MLE"
    )
    ax.legend(fontsize=7)
    save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--powers-dbm", type=float, nargs="+", default=[-60, -50, -40, -30, -20, -10])
    ap.add_argument("--num-train", type=int, nargs="+", default=[5, 10, 50], help="L values")
    ap.add_argument("--betas", type=float, nargs="+", default=[1.01, 1.05, 1.10])
    ap.add_argument("--draws", type=int, default=200, help="noise draws per power (sweep)")
    ap.add_argument("--num-test", type=int, default=1280, help="random UEs (part 3)")
    ap.add_argument("--region-power-dbm", type=float, default=-10.0)
    ap.add_argument("--convention", default="itu", choices=["itu", "paper"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--coverage-repeats", type=int, default=40)
    ap.add_argument("--coverage-material", default="wood")
    ap.add_argument("--coverage-power-dbm", type=float, default=-20.0)
    ap.add_argument("--coverage-L", type=int, default=10)
    ap.add_argument("--coverage-level", type=float, default=0.9)
    ap.add_argument(
        "--skip", nargs="*", default=[], choices=["table", "sweep", "region", "coverage"]
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/calibrate_material"))
    args = ap.parse_args(argv)
    if args.quick:
        args.powers_dbm, args.num_train, args.draws, args.num_test = [-30, -10], [10, 50], 50, 256
        args.coverage_repeats = 8
    json_path, png_path = args.out.with_suffix(".json"), args.out.with_suffix(".png")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    result = read_rows(json_path) if json_path.exists() else {}
    parts = (
        ("table", calibration_table),
        ("sweep", sweep),
        ("region", random_ues),
        ("coverage", coverage),
    )
    built = {}  # the region power's believed models, fitted once for the sweep and the region
    for part, fn in parts:
        if part in args.skip:
            continue
        result[part] = fn(args, built) if part in ("sweep", "region") else fn(args)
        json_path.write_text(json.dumps(result, indent=1))  # after each part
    print(f"wrote {json_path}")
    if "sweep" in result:
        plot(result["sweep"], png_path)
    return result


if __name__ == "__main__":
    main()
