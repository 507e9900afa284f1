"""dmimo_jax quickstart: the whole offline/online method on the paper's scene, in minutes.

Offline: L labeled snapshots of the true two-ray channel -> the shared GP phase model
(eqs. 23-25) and its tabulated mean -> a synthetic training set (eq. 26) -> the learned
coarse stage (a cell classifier over the 1 m cells of the UE region, beyond the paper;
``quick`` preset, cached: a second run loads it). Online, on random test snapshots: the
16 most likely cells -> a two-tier screen of those cells (the first 4 when they hold
99.9% of the probability) -> three refinement steps under the tabulated GP model of
eq. (27) (no kernel evaluation online), next to the matched MLE (lambda/8 EGS +
refinement with the true analytic model) and the PEB. The paper's POPT (MAE regression) is in
``benchmarks/online_latency.py`` and ``examples/paper/``.

    python examples/quickstart.py
    python examples/quickstart.py --material wood --power-dbm -20 --num-train 100 --json out/q.json
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics and estimation in float64 (entry point)

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _helpers import (  # noqa: E402
    MLE,
    Candidates,
    labeled_snapshots,
    plot_cdfs,
    print_rows,
    pyplot,
    row,
    save_figure,
    test_snapshots,
    write_json,
)

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import pipeline  # noqa: E402
from dmimo_jax.learning import get_preset  # noqa: E402


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--material", default="concrete", choices=dj.materials.material_names())
    ap.add_argument("--num-train", type=int, default=50, help="L, labeled GP snapshots")
    ap.add_argument("--num-test", type=int, default=256)
    ap.add_argument("--num-samples", type=int, default=None, help="synthetic set (default: preset)")
    ap.add_argument("--preset", default="quick", choices=["quick", "cpu", "paper"])
    ap.add_argument("--num-cells", type=int, default=16, help="candidate cells per snapshot")
    ap.add_argument("--min-mass", type=float, default=0.5, help="fallback below this mass")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spacing-div", type=int, default=8, help="MLE grid: lambda / this")
    ap.add_argument(
        "--cache", type=pathlib.Path, default=None, help="default: the user cache directory"
    )
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/quickstart"))
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    if args.spacing_div < 1:
        raise ValueError(f"--spacing-div must be an integer >= 1, got {args.spacing_div}")
    t_start = time.perf_counter()

    scene = dj.paper_scene(args.power_dbm, args.material)
    print(f"dmimo_jax {dj.__version__} on {jax.devices()[0].platform}: {scene}")
    print(f"[1/4] offline: L = {args.num_train} labeled snapshots -> GP -> synthetic set -> cells")
    x, r, nv = labeled_snapshots(scene, args.num_train, args.seed)
    cells = get_preset(args.preset).cells
    if args.num_samples is not None:  # a smaller synthetic set (and minibatch) for smoke runs
        n = args.num_samples
        train_cfg = dataclasses.replace(
            cells.train, batch_size=min(cells.train.batch_size, n // 10)
        )
        cells = dataclasses.replace(cells, num_samples=n, train=train_cfg)
    off = pipeline.run_offline(
        x,
        r,
        nv,
        scene,
        kinds=("cells",),
        preset=args.preset,
        cells=cells,
        cache_dir=args.cache,
        seed=args.seed,
    )
    info = off.info["cells"]
    print(
        f"      cache {off.cache}; cell classifier validation top-"
        f"{off.estimators['cells'].config.top_k} miss rate {info['val_top_k_miss']:.4f}"
    )

    print(f"[2/4] {args.num_test} random test snapshots, PEB")
    xt, rt = test_snapshots(scene, args.num_test, args.seed)
    pebs = np.asarray(dj.peb_map(xt, scene))

    div = args.spacing_div
    print(f"[3/4] matched MLE: lambda/{div} EGS + refinement with the true analytic model")
    t0 = time.perf_counter()
    mle = MLE(scene, float(scene.wavelength) / div)
    rows = [row(f"MLE (l/{div}, matched)", xt, *mle(rt), pebs, time.perf_counter() - t0)]

    print(f"[4/4] top-{args.num_cells} cells -> two-tier cell screen -> 3 tabulated GP steps")
    t0 = time.perf_counter()
    learned = Candidates(off, num_cells=args.num_cells, min_mass=args.min_mass)
    rows.append(
        row(
            f"cells ({args.preset}) + GP",
            xt,
            *learned(rt, xt),
            pebs,
            time.perf_counter() - t0,
        )
    )
    rows[-1].update(learned.stats)
    mle_ms = rows[0]["ms_per_snapshot"]
    wall = time.perf_counter() - t_start
    for rw in rows:
        rw.update(
            total_wall_s=wall, power_dbm=args.power_dbm, material=args.material, L=args.num_train
        )
    print()
    print_rows(rows)
    st = learned.stats
    print(
        f"\nlearned stage: cell recall {st['cell_recall']:.4f} (true cell among the "
        f"{args.num_cells} candidates), fallback {st['fallback_fraction']:.4f}, first-4-cells "
        f"tier {st['narrow_fraction']:.4f}; ms per "
        f"snapshot: coarse {st['ms_coarse']:.3f}, safeguard {st['ms_safeguard']:.3f}, "
        f"fine {st['ms_fine']:.3f}; {mle_ms / rows[-1]['ms_per_snapshot']:.1f}x faster "
        "than the MLE"
    )
    print(f"wall time {wall:.1f} s")
    plt = pyplot()
    if plt is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        fig = plot_cdfs(
            plt,
            rows,
            args.out / "error_cdf.png",
            f"{args.material}, P = {args.power_dbm:g} dBm, L = {args.num_train}",
        )
        save_figure(fig, args.out / "error_cdf.png")
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
