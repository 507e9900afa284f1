"""Place the 17 APs by the gradient of the PEB, next to the paper's layout and random layouts.

For each design case (ceiling only with objective "max" at 1.5 m separation; ceiling and
walls with objectives "mean" and "max" at 1.0 m) it runs ``design.optimize_ap_positions``
(Adam on the unfolded box, several starts), draws N random layouts with the same constraints
(``design.sample_layout``), keeps the best one on a selection set of UEs, and evaluates the
paper's layout, the best random one and the optimized one on UEs the optimizer never saw.
The paper's layout (closest APs 0.9 m apart) is the reference, whatever its separation.

    python examples/ap_placement.py                # 2000 evaluation UEs, 1000 random layouts
    python examples/ap_placement.py --quick        # 500 UEs, 50 random layouts, short runs

Writes ``OUT.json`` (mean / p95 / p99 / max PEB per layout and case) and ``OUT.png`` (PEB maps
at three heights for the paper's and the optimized layouts, APs marked, colour in um; and the
PEB CDFs).
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
from tqdm.auto import tqdm  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _helpers import pyplot, save_figure  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import design  # noqa: E402

CASES = {
    "ceiling_max": dict(surfaces="ceiling", objective="max", min_separation=1.5),
    "walls_mean": dict(surfaces="ceiling+walls", objective="mean", min_separation=1.0),
    "walls_max": dict(surfaces="ceiling+walls", objective="max", min_separation=1.0),
}


def summary(pebs) -> dict:
    p = np.asarray(pebs)
    return dict(
        mean_m=float(p.mean()),
        p95_m=float(np.percentile(p, 95)),
        p99_m=float(np.percentile(p, 99)),
        max_m=float(p.max()),
    )


def best_random(scene, case, num, select, key):
    """The best of ``num`` random layouts on the selection UEs (by the case's objective)."""
    peb = jax.jit(lambda ap: design.peb_values(scene.replace(ap_positions=ap), select))
    best = None
    for k in tqdm(jax.random.split(key, num), desc="random layouts", leave=False):
        ap = design.sample_layout(
            k,
            scene.num_aps,
            scene.room_size,
            surfaces=case["surfaces"],
            min_separation=case["min_separation"],
        )
        score = float(design.layout_objective(peb(ap), case["objective"]))
        if best is None or score < best[0]:
            best = (score, ap)
    return best[1]


def run_case(name, case, scene, args, evaluate):
    key = jax.random.key(args.seed)
    k_rand, k_opt, k_sel, k_start = jax.random.split(key, 4)
    select = dj.sample_positions(k_sel, 2000, scene)
    t0 = time.perf_counter()
    rand = best_random(scene, case, args.num_random, select, k_rand)
    t_rand = time.perf_counter() - t0
    start = scene.replace(
        ap_positions=design.sample_layout(
            k_start,
            scene.num_aps,
            scene.room_size,
            surfaces=case["surfaces"],
            min_separation=case["min_separation"],
        )
    )
    t0 = time.perf_counter()
    res = design.optimize_ap_positions(
        start,
        k_opt,
        steps=args.steps,
        num_starts=args.num_starts,
        num_ue=args.num_ue,
        learning_rate=0.1,
        **case,
    )
    t_opt = time.perf_counter() - t0
    paper = summary(evaluate(scene.ap_positions))
    out = dict(case=name, **case, optimize_s=t_opt, random_s=t_rand, num_random=args.num_random)
    out["paper"] = paper
    out["best_random"] = summary(evaluate(rand))
    out["optimized"] = summary(evaluate(res.scene.ap_positions))
    out["optimized_min_separation_m"] = res.min_separation
    out["layouts"] = {
        "paper": np.asarray(scene.ap_positions).tolist(),
        "best_random": np.asarray(rand).tolist(),
        "optimized": np.asarray(res.scene.ap_positions).tolist(),
    }
    for which in ("best_random", "optimized"):
        out[f"{which}_over_paper"] = {k: out[which][k] / paper[k] for k in paper}
    return out


def plot(results, scene, evaluate_map, path):
    plt = pyplot()
    if plt is None:
        return
    heights = (0.5, 2.0, 3.5)
    fig, axes = plt.subplots(
        len(results) + 1, len(heights) + 1, figsize=(13, 3.2 * (len(results) + 1))
    )
    layouts = [("paper", np.asarray(scene.ap_positions))] + [
        (res["case"], np.asarray(res["layouts"]["optimized"])) for res in results
    ]
    g = np.linspace(0.5, 9.5, 46)
    xx, yy = np.meshgrid(g, g)
    for row, (label, ap) in enumerate(layouts):
        for col, h in enumerate(heights):
            ax = axes[row, col]
            pts = np.column_stack([xx.ravel(), yy.ravel(), np.full(xx.size, h)])
            vals = np.asarray(evaluate_map(jnp.asarray(ap), jnp.asarray(pts))).reshape(xx.shape)
            im = ax.pcolormesh(xx, yy, 1e6 * vals, shading="auto", vmin=0, vmax=100)
            ax.plot(ap[:, 0], ap[:, 1], "w^", ms=5, mec="k")
            ax.set_title(f"{label}, z = {h} m", fontsize=8)
            ax.set_aspect("equal")
            fig.colorbar(im, ax=ax, label="PEB [um]")
        ax = axes[row, -1]
        if row == 0:
            ax.axis("off")
            continue
        res = results[row - 1]
        for which, style in (("paper", "k-"), ("best_random", "b--"), ("optimized", "r-")):
            p = np.sort(np.asarray(res[f"pebs_{which}"]))
            ax.plot(1e6 * p, np.arange(1, p.size + 1) / p.size, style, label=which)
        ax.set(xlabel="PEB [um]", ylabel="CDF", title=f"{res['case']} (unseen UEs)")
        ax.legend(fontsize=7)
    save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--num-eval", type=int, default=2000, help="UEs the optimizer never saw")
    ap.add_argument("--num-random", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--num-starts", type=int, default=4)
    ap.add_argument("--num-ue", type=int, default=512, help="UEs per optimizer step")
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/ap_placement"))
    args = ap.parse_args(argv)
    if args.quick:
        args.num_eval, args.num_random, args.steps, args.num_starts = 500, 50, 150, 1
    scene = dj.paper_scene(args.power_dbm)
    held_out = dj.sample_positions(jax.random.key(10_000 + args.seed), args.num_eval, scene)
    peb_at = jax.jit(lambda ap, xs: design.peb_values(scene.replace(ap_positions=ap), xs))

    def evaluate(ap):
        return peb_at(jnp.asarray(ap), held_out)

    results = []
    for name in args.cases:
        res = run_case(name, CASES[name], scene, args, evaluate)
        for which in ("paper", "best_random", "optimized"):
            res[f"pebs_{which}"] = np.asarray(evaluate(res["layouts"][which])).tolist()
        results.append(res)
        print(
            f"\n{name}: {CASES[name]}, optimized in {res['optimize_s']:.0f} s, min separation {res['optimized_min_separation_m']:.2f} m"
        )
        print(
            f"{'layout':<12} {'mean um':>8} {'p95 um':>8} {'p99 um':>8} {'max um':>8}   ratio to paper (mean, p95, p99, max)"
        )
        for which in ("paper", "best_random", "optimized"):
            s = res[which]
            ratio = (
                ""
                if which == "paper"
                else "  " + ", ".join(f"{v:.3f}" for v in res[f"{which}_over_paper"].values())
            )
            print(
                f"{which:<12} {1e6 * s['mean_m']:8.2f} {1e6 * s['p95_m']:8.2f} {1e6 * s['p99_m']:8.2f} {1e6 * s['max_m']:8.2f}{ratio}"
            )
    json_path, png_path = args.out.with_suffix(".json"), args.out.with_suffix(".png")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(results, indent=1))
    print(f"wrote {json_path}")
    plot(results, scene, peb_at, png_path)
    return results


if __name__ == "__main__":
    main()
