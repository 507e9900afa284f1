"""dmimo_jax quickstart: the whole offline/online method on the paper's scene, in minutes.

Offline: L labeled snapshots -> GP phase model (eqs. 23-25) -> synthetic set (eq. 26) -> a
cell classifier (cached: a second run loads it). Online: ``dj.Locator`` (cells -> screen ->
tabulated GP refinement (eq. 27) -> cost gate, one XLA program) on random test snapshots,
next to the matched MLE (``dj.egs`` + ``dj.refine_batch``) and the PEB (eq. 13).

    python examples/quickstart.py
    python examples/quickstart.py --material wood --power-dbm -20 --num-train 100
"""

import argparse
import dataclasses
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics and estimation in float64 (entry point)

import numpy as np  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.benchmarking import check_options, timed_passes, write_json  # noqa: E402
from dmimo_jax.estimators import phasor_table, search_grid  # noqa: E402
from dmimo_jax.learning import get_preset  # noqa: E402


def timed(fn):  # (result, seconds): compiled first, then one timed call
    jax.block_until_ready(fn())
    return timed_passes(fn, 1)


def row(method, x, fine, seconds, pebs, **extra):  # one table row: errors (m), time (ms)
    err, peb = np.linalg.norm(np.asarray(fine) - np.asarray(x), axis=1), float(np.mean(pebs))
    rmse = float(np.sqrt(np.mean(err**2)))
    return dict(method=method, fine_rmse_m=rmse, p99_m=float(np.percentile(err, 99)), max_m=float(err.max()),
                ms_per_snapshot=1e3 * seconds / len(err), mean_peb_m=peb, fine_over_peb=rmse / peb,
                errors_m=err.tolist(), **extra)  # fmt: skip


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for flag, kind, default, text in [
        ("--power-dbm", float, -10.0, "UE transmit power P (dBm)"),
        ("--material", str, "concrete", "the ground's ITU-R P.2040 material"),
        ("--num-train", int, 50, "L, labeled snapshots of the GP"),
        ("--num-test", int, 256, "random test snapshots"),
        ("--num-samples", int, None, "synthetic training set (default: the preset's)"),
        ("--preset", str, "quick", "training preset of the classifier: quick, cpu or paper"),
        ("--seed", int, 0, "labeled and test draws"),
        ("--spacing-div", int, 8, "the MLE's grid spacing: lambda / this"),
        ("--cache", pathlib.Path, None, "trained networks' cache (default: the user's)"),
        ("--out", pathlib.Path, pathlib.Path("out/quickstart"), "folder of the figure"),
        ("--json", pathlib.Path, None, "write the rows as JSON here"),
    ]:
        ap.add_argument(flag, type=kind, default=default, help=f"{text} (default: {default})")
    args = ap.parse_args(argv)
    check_options(spacing_div=args.spacing_div)
    # compiled programs kept beside the trained networks: a second run compiles nothing
    dj.pipeline.use_compilation_cache(args.cache / "xla" if args.cache else None)
    t_start, scene = time.perf_counter(), dj.paper_scene(args.power_dbm, args.material)
    print(f"dmimo_jax {dj.__version__} on {jax.devices()[0].platform}: {scene}")

    print(f"[1/3] offline: L = {args.num_train} labeled snapshots -> GP -> synthetic set -> cells")
    lab = dj.measure.labeled_snapshots(jax.random.key(args.seed), scene, args.num_train)
    cells = get_preset(args.preset).cells
    if args.num_samples is not None:  # a smaller synthetic set (and minibatch) for smoke runs
        train = dataclasses.replace(
            cells.train, batch_size=min(cells.train.batch_size, args.num_samples // 10)
        )
        cells = dataclasses.replace(cells, num_samples=args.num_samples, train=train)
    off = dj.run_offline(lab.x, lab.r, lab.variance, scene, kinds=("cells",), preset=args.preset,
                         cells=cells, cache_dir=args.cache, seed=args.seed)  # fmt: skip
    loc = dj.Locator.from_offline(off, "cells")
    test = dj.measure.labeled_snapshots(jax.random.key(10_000 + args.seed), scene, args.num_test)
    pebs = np.asarray(dj.peb_map(test.x, scene))

    print(f"[2/3] matched MLE: lambda/{args.spacing_div} EGS + refinement, true analytic model")
    model = dj.TwoRayModel(scene)  # the true model: the MLE matched to the world
    table = phasor_table(model, search_grid(scene, float(scene.wavelength) / args.spacing_div))
    fine, t_mle = timed(lambda: dj.refine_batch(dj.egs(test.r, model, table).x, test.r, model).x)
    rows = [row(f"MLE (l/{args.spacing_div}, matched)", test.x, fine, t_mle, pebs)]

    print(f"[3/3] dj.Locator: cells ({args.preset}) -> cell screen -> tabulated GP steps -> gate")
    out, t_loc = timed(lambda: loc(test.r))
    true_cell = np.asarray(off.estimators["cells"].cells.index(test.x))
    recall = float(np.any(np.asarray(loc.coarse(test.r)[0]) == true_cell[:, None], axis=1).mean())
    rows.append(row(f"cells ({args.preset}) + GP", test.x, out.x, t_loc, pebs, cell_recall=recall,
                    fallback_fraction=float(np.mean(out.fallback))))  # fmt: skip

    wall = time.perf_counter() - t_start
    cols = [("fine_rmse_m", "RMSE m"), ("p99_m", "p99 m"), ("max_m", "max m"),
            ("ms_per_snapshot", "ms/snap"), ("mean_peb_m", "PEB m"), ("fine_over_peb", "RMSE/PEB")]  # fmt: skip
    print(f"\n{'method':>24}" + "".join(f"{h:>11}" for _, h in cols))
    for rw in rows:
        rw.update(wall_s=wall, power_dbm=args.power_dbm, material=args.material, L=args.num_train)
        print(f"{rw['method']:>24}" + "".join(f"{rw[k]:11.4g}" for k, _ in cols))
    speedup = rows[0]["ms_per_snapshot"] / rows[1]["ms_per_snapshot"]
    print(f"\nLocator: cell recall {recall:.4f}, fallback {rows[1]['fallback_fraction']:.4f}, "
          f"{speedup:.1f}x faster than the MLE; wall time {wall:.1f} s")  # fmt: skip
    import matplotlib.pyplot as plt  # the [plots] extra; headless: the Agg backend

    fig, ax = plt.subplots(figsize=(6, 4))
    for rw in rows:
        ax.step(*dj.metrics.ecdf(rw["errors_m"]), where="post", label=rw["method"])
    ax.axvline(rows[0]["mean_peb_m"], color="k", ls=":", label="mean PEB")
    ax.set(xscale="log", xlabel="position error [m]", ylabel="empirical CDF")
    ax.legend(title=f"{args.material}, P = {args.power_dbm:g} dBm, L = {args.num_train}")
    path = args.out / f"error_cdf_{args.material}_{args.power_dbm:g}dBm_L{args.num_train}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")  # named by its options: runs do not collide
    print(f"wrote {path}")
    write_json(args.json, rows)  # with the command, date and machine (nothing without --json)
    return rows


if __name__ == "__main__":
    main()
