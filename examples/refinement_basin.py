"""How far from the truth does refinement with the GP model still converge? (the basin)

The fraction of starts that end within 1 mm of the refinement started at the truth,
vs the start's distance d and direction (along x, y, z, and uniformly random), for the
screen's refinement (Levenberg-Marquardt under the tabulated GP mean, ``--steps``
steps) on noisy snapshots of the true two-ray channel (concrete, P = -10 dBm, the GP
fitted on L = 50 labeled snapshots). It sets the safeguard's screen spacing: the nearest
point of a grid of spacing h is at most h sqrt(3)/2 away, which must lie well inside the
basin (h = lambda/4 = 9.4 cm: 8.1 cm).

    python examples/refinement_basin.py --json out/basin.json
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _helpers import labeled_snapshots, test_snapshots, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import gp, pipeline  # noqa: E402

DISTANCES_CM = (2, 5, 8, 10, 12, 15, 20, 30)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-test", type=int, default=256)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    scene = dj.paper_scene()
    x, r, nv = labeled_snapshots(scene, 50, 0)
    screen = gp.TabulatedGPModel.from_model(
        pipeline.fit_phase_model(x, r, nv, scene), variance=False
    )
    xt, rt = test_snapshots(scene, args.num_test, 0)
    home = dj.refine_batch(xt, rt, screen, num_steps=args.steps).x
    rng = np.random.default_rng(0)
    directions = {
        "x": np.tile([1.0, 0, 0], (args.num_test, 1)),
        "y": np.tile([0, 1.0, 0], (args.num_test, 1)),
        "z": np.tile([0, 0, 1.0], (args.num_test, 1)),
        "random": rng.normal(size=(args.num_test, 3)),
    }
    rows = []
    for name, u in directions.items():
        u = u / np.linalg.norm(u, axis=1, keepdims=True)
        sign = rng.choice([-1.0, 1.0], size=(args.num_test, 1))  # both ways along the axis
        for d in DISTANCES_CM:
            start = jnp.asarray(np.asarray(xt) + sign * u * d / 100)
            start = start.at[:, 2].set(jnp.maximum(start[:, 2], 0.05))
            end = dj.refine_batch(start, rt, screen, num_steps=args.steps).x
            ok = np.linalg.norm(np.asarray(end) - np.asarray(home), axis=1) < 1e-3
            rows.append(dict(direction=name, distance_m=d / 100, converged=float(ok.mean())))
    print(f"converged fraction ({args.num_test} UEs, {args.steps} LM steps, tabulated GP)")
    print("distance cm " + " ".join(f"{d:>6}" for d in DISTANCES_CM))
    for name in directions:
        vals = [r["converged"] for r in rows if r["direction"] == name]
        print(f"{name:>11} " + " ".join(f"{v:6.3f}" for v in vals))
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
