"""The whole online stage, per coarse stage: time per snapshot and accuracy in one run.

For each coarse stage (the paper's POPT with MAE regression, the learned cell classifier
of this project, the MLP and HI benchmarks, a network-free hierarchical screen of the GP
model) and the matched lambda/8 MLE, on the same test snapshots of the true two-ray
channel:

* the time per snapshot of the coarse, safeguard and fine stages and of the whole,
  batched (all test snapshots in one call) and single (median and spread over
  ``--num-single`` snapshots, one call each; compilation excluded);
* coarse RMSE, candidate recall, fallback fraction, fine RMSE, p99, max, the mean PEB.

Recall: the fraction of test snapshots whose online estimate *without* the whole-region
fallback lies within 1 mm of the reference: a whole-region lambda/8 exhaustive search
of the same tabulated GP model, refined the same way (screen refinement + exact steps).

    python benchmarks/online_latency.py --json out/online_latency.json
    python benchmarks/online_latency.py --quick      # 256 test UEs, fewer single runs
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics in float64; the networks stay float32

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, labeled_snapshots, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import calibration, datasets, pipeline  # noqa: E402
from dmimo_jax import estimators as est  # noqa: E402

FINE_STEPS_EXACT = 15  # the paper pipeline's refinement with the exact GP model
CHEAP_FINE_STEPS = 2  # exact steps after the tabulated-model refinement
TABLE_FINE_STEPS = 3  # steps under the tabulated eq. (27) model (the learned stage's default)


def timed(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


def errors(x_hat, x_true):
    return np.linalg.norm(np.asarray(x_hat) - np.asarray(x_true), axis=-1)


def stats(err):
    return dict(
        fine_rmse_m=float(np.sqrt(np.mean(err**2))),
        p99_m=float(np.quantile(err, 0.99)),
        max_m=float(err.max()),
    )


class Method:
    """A coarse stage + safeguard + fine stage, split so each stage can be timed."""

    def __init__(self, name, kind, coarse, safeguard, fine, *, fallback=None, nofallback=None):
        self.name, self.kind = name, kind
        self.coarse, self.safeguard, self.fine = coarse, safeguard, fine
        self.fallback = fallback  # (coarse_out, safeguard_out) -> bool mask, or None
        self.nofallback = nofallback  # (r, coarse_out) -> safeguard output without fallback

    def run(self, r):
        c, t_c = timed(lambda: self.coarse(r))
        s, t_s = timed(lambda: self.safeguard(r, c))
        f, t_f = timed(lambda: self.fine(r, s))
        return c, s, f, (t_c, t_s, t_f)


def build_methods(off, scene, args, mle_model=None):
    """The methods of one run; ``mle_model`` (default: the matched two-ray model over the
    room, the paper's world) is the model of the lambda/8 MLE row."""
    screen, table = off.screen, off.table
    # the tabulated eq. (27): cubic mean + tabulated variance, no kernel evaluation online
    table_fine = lambda r, s: dj.refine_batch(s, r, screen, num_steps=TABLE_FINE_STEPS).x
    methods = []
    for kind, label in (("popt", "paper_popt"), ("mlp", "mlp"), ("hi", "hi")):
        if kind not in off.estimators:
            continue
        # the library's online stage: its window screens the whole table (the whole-region
        # fallback) when it would hold more than 1/16 of it
        loc = pipeline.Locator.from_offline(off, kind, fine="model", fine_steps=FINE_STEPS_EXACT)
        methods.append(
            Method(
                f"{kind.upper()} ({args.preset}) + window r={off.radii[kind]:.2f} m + exact GP",
                label,
                loc.coarse,
                loc.screen,
                lambda r, s, loc=loc: loc.fine_stage(r, s.x).x,
                fallback=lambda c, s: np.asarray(s.fallback),
            )
        )
    if "cells" in off.estimators:
        k = args.num_cells
        fines = [(f"{TABLE_FINE_STEPS} tabulated eq. (27) steps", "screen", TABLE_FINE_STEPS)]
        if mle_model is None:  # the GP: its tables or the exact GP (one model otherwise)
            fines.append((f"{CHEAP_FINE_STEPS} exact GP steps", "model", CHEAP_FINE_STEPS))
        else:
            fines = [
                (f"{TABLE_FINE_STEPS} steps of the calibrated model", "screen", TABLE_FINE_STEPS)
            ]
        for fine_name, fine, steps in fines:
            loc = pipeline.Locator.from_offline(
                off,
                "cells",
                num_cells=k,
                min_mass=args.min_mass,
                fine=fine,
                fine_steps=steps,
                screen_steps=args.screen_steps,
            )
            unsure_too = loc.replace(min_mass=0.0)  # the screen without fallback
            last = {}  # the cost gate's recoveries of the latest run (they count as fallbacks)

            def certified(r, s, loc=loc, last=last):
                _, out, last["recovered"] = loc.certify(r, s.x, loc.fine_stage(r, s.x))
                return out.x

            methods.append(
                Method(
                    f"cells top-{k} ({args.preset}) + two-tier cell screen + {fine_name}",
                    "learned",
                    loc.coarse,
                    loc.screen,
                    certified,
                    fallback=lambda c, s, last=last: np.asarray(s.fallback) | last["recovered"],
                    nofallback=unsure_too.screen,
                )
            )
    what = "GP" if mle_model is None else "calibrated model's"
    methods.append(
        Method(
            f"screen: lambda/4 {what} table + 8 starts (no network)",
            "screen",
            lambda r: jnp.zeros((r.shape[0], 3)),
            lambda r, c: est.coarse_to_fine(r, screen, table).x,
            table_fine,
        )
    )
    if mle_model is None:  # the paper's world: the matched two-ray model, the room's grid
        truth, region, label = dj.TwoRayModel(scene), "room", "matched two-ray"
    else:  # the same calibrated model as the learned stage, over the UE region
        truth, region, label = mle_model, "ue", "the calibrated model, UE region"
    grid = est.search_grid(scene, float(scene.wavelength) / 8, region)
    mle_table = est.phasor_table(truth, grid)
    methods.append(
        Method(
            f"MLE: lambda/8 EGS + refinement ({label})",
            "mle",
            lambda r: dj.egs(r, truth, mle_table).x,
            lambda r, c: c,
            lambda r, s: dj.refine_batch(s, r, truth).x,
        )
    )
    return methods


def reference(r, off, scene):
    """Whole-region lambda/8 search of the tabulated GP + the same refinement (for recall)."""
    grid = est.search_grid(scene, float(scene.wavelength) / 8, region="ue")
    table8 = est.phasor_table(off.screen, grid)
    x0 = np.concatenate(
        [np.asarray(dj.egs(r[i : i + 128], off.screen, table8).x) for i in range(0, len(r), 128)]
    )
    xs = dj.refine_batch(jnp.asarray(x0), r, off.screen, num_steps=8).x
    return dj.refine_batch(xs, r, off.model, num_steps=CHEAP_FINE_STEPS).x


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--material", default="concrete")
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--L", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-test", type=int, default=1280)
    ap.add_argument("--num-single", type=int, default=20)
    ap.add_argument("--preset", default="cpu", choices=["cpu", "paper"])
    ap.add_argument("--methods", nargs="*", default=None, help="default popt cells mlp hi")
    ap.add_argument(
        "--world",
        default="paper",
        choices=["paper", "deployment"],
        help="deployment: datasets.synthetic_deployment's room, calibrated from the L "
        "labeled snapshots; every stage then runs under the calibrated room",
    )
    ap.add_argument("--num-cells", type=int, default=16)
    ap.add_argument("--min-mass", type=float, default=0.5)
    ap.add_argument(
        "--screen-steps", type=int, default=None, help="LM steps of each cell-screen start"
    )
    ap.add_argument(
        "--cache", type=pathlib.Path, default=None, help="default: the user cache directory"
    )
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.num_test, args.num_single = min(args.num_test, 256), min(args.num_single, 10)
    model, truth, cal_s = "gp", None, None
    if args.world == "deployment":
        world = datasets.synthetic_deployment(args.power_dbm, seed=args.seed)
        truth, scene = world.truth, world.surveyed
        x, r, nv = labeled_snapshots(scene, args.L, args.seed, model=truth)
        t0 = time.perf_counter()
        fit = ("ap_positions", "ap_phase_offsets", "surfaces")
        model = calibration.calibrate(world.nominal, x, r, nv, fit=fit).model
        cal_s = time.perf_counter() - t0
        print(f"calibrated {fit} from L = {args.L} in {cal_s:.1f} s")
        args.methods = ["cells"] if args.methods is None else args.methods
    else:
        scene = dj.paper_scene(args.power_dbm, args.material)
        x, r, nv = labeled_snapshots(scene, args.L, args.seed)
    args.methods = ["popt", "cells", "mlp", "hi"] if args.methods is None else args.methods
    # one offline run per coarse stage, timed here (the library returns no timings);
    # a stage already in the cache loads in seconds (train_s then measures the loading)
    off, train_s = None, {}
    for kind in args.methods:
        t0 = time.perf_counter()
        o = pipeline.run_offline(
            x,
            r,
            nv,
            scene,
            model=model,
            kinds=(kind,),
            preset=args.preset,
            cache_dir=args.cache,
            seed=args.seed,
        )
        train_s[kind] = time.perf_counter() - t0
        if off is None:
            off = o
        else:
            off.estimators.update(o.estimators)
            off.radii.update(o.radii)
            off.info.update(o.info)
            if o.cells is not None:
                off = off._replace(cells=o.cells)
    if off is None:
        off = pipeline.run_offline(
            x,
            r,
            nv,
            scene,
            model=model,
            kinds=(),
            preset=args.preset,
            cache_dir=args.cache,
            seed=args.seed,
        )
    print(f"offline seconds per stage (GP fit included): {train_s}")
    xt, rt, _ = labeled_snapshots(scene, args.num_test, args.seed, salt=10_000, model=truth)
    pebs = np.asarray(dj.peb_map(xt, scene if truth is None else truth))
    print(f"{args.num_test} test UEs; mean PEB {pebs.mean():.3e} m")
    x_ref = np.asarray(reference(rt, off, scene))
    methods = build_methods(off, scene, args, None if truth is None else model)
    rows = []
    for m in methods:
        m.run(rt)  # compile, then the timed batched run
        c, s, f, (t_c, t_s, t_f) = m.run(rt)
        err = errors(f, xt)
        if m.kind == "learned":
            coarse = off.cells.cells.centre(c[0][:, 0])  # the most likely cell's centre
        elif m.kind == "screen":
            coarse = s  # no network: the screen's point
        else:
            coarse = c
        fb = m.fallback(c, s) if m.fallback else np.zeros(len(rt), bool)
        if m.nofallback is not None:
            x_nf = np.asarray(m.fine(rt, m.nofallback(rt, c)))
        else:
            x_nf = np.asarray(f)
        # no recall where there is nothing without the fallback (every snapshot screened the
        # whole region) or no reference of the same model (the MLE)
        undefined = m.kind == "mle" or (m.nofallback is None and bool(np.all(fb)))
        recall = None if undefined else float(np.mean(errors(x_nf, x_ref) < 1e-3))
        single = []
        for i in range(args.num_single):  # compile every batch-1 path (tiers) first
            m.run(rt[i : i + 1])
        for i in range(args.num_single):
            _, _, _, ts = m.run(rt[i : i + 1])
            single.append(1e3 * sum(ts))
        n = len(rt)
        narrow = getattr(s, "narrow", None)
        row = dict(
            method=m.name,
            kind=m.kind,
            device=device_name(),
            coarse_rmse_m=float(np.sqrt(np.mean(errors(coarse, xt) ** 2))),
            recall=recall,
            fallback_fraction=float(np.mean(fb)),
            narrow_fraction=None if narrow is None else float(np.mean(np.asarray(narrow))),
            mean_peb_m=float(pebs.mean()),
            ms_coarse=1e3 * t_c / n,
            ms_safeguard=1e3 * t_s / n,
            ms_fine=1e3 * t_f / n,
            ms_per_snapshot_batched=1e3 * (t_c + t_s + t_f) / n,
            ms_per_snapshot_single=statistics.median(single),
            ms_single_std=statistics.stdev(single) if len(single) > 1 else 0.0,
            train_s=train_s.get({"paper_popt": "popt", "learned": "cells"}.get(m.kind, m.kind)),
            calibration_s=cal_s,
            world=args.world,
            num_test=n,
            **stats(err),
        )
        row["fine_over_peb"] = row["fine_rmse_m"] / row["mean_peb_m"]
        rows.append(row)
        print(f"{m.name}: {row['ms_per_snapshot_batched']:.2f} ms/snap batched", flush=True)
    mle = next(r for r in rows if r["kind"] == "mle")
    for row in rows:
        row["speedup_vs_mle"] = mle["ms_per_snapshot_batched"] / row["ms_per_snapshot_batched"]
    cols = [
        ("kind", "kind", "s"),
        ("coarse_rmse_m", "coarse m", ".3g"),
        ("recall", "recall", ".4f"),
        ("fallback_fraction", "fallback", ".4f"),
        ("narrow_fraction", "narrow", ".4f"),
        ("fine_rmse_m", "fine m", ".3e"),
        ("fine_over_peb", "fine/PEB", ".2f"),
        ("p99_m", "p99 m", ".3e"),
        ("max_m", "max m", ".3e"),
        ("ms_coarse", "coarse ms", ".3f"),
        ("ms_safeguard", "guard ms", ".3f"),
        ("ms_fine", "fine ms", ".3f"),
        ("ms_per_snapshot_batched", "ms batched", ".3f"),
        ("ms_per_snapshot_single", "ms single", ".2f"),
        ("speedup_vs_mle", "x MLE", ".1f"),
    ]
    where = args.material if args.world == "paper" else "deployment world (calibrated room)"
    print(f"device {device_name()}; {where}, P = {args.power_dbm} dBm, L = {args.L}")
    print_table(rows, cols)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
