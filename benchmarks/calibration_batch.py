"""Many deployments calibrated at once: the pure fitting core vmapped against a loop.

``dmimo_jax.calibration.solver.fit_rounds`` is the calibration's fitting core (the LM rounds
over a fixed tuple of groups, one program): a study over many deployments of the same
shapes (the robustness benchmark's worlds, a Monte Carlo of surveys) can ``jax.vmap`` it
instead of calling it once per deployment. Per batch size N: N two-ray deployments of the
paper's scene (phase centres off by N(0, 1 cm), random offsets, the ground's permittivity
unknown: the groups ``ap_positions``, ``ap_phase_offsets``, ``surfaces`` from the closed-form
offsets and a concrete start), L labeled snapshots each at -10 dBm; the loop and the vmapped
call timed compiled (the median of ``--repeats`` after one that compiles), their ratio, and
the largest difference of their fitted unknowns.

    python benchmarks/calibration_batch.py --json out/calibration_batch.json
    python benchmarks/calibration_batch.py --quick      # N = 8, one repeat
"""

from __future__ import annotations

import argparse
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.benchmarking import timed_passes  # noqa: E402
from dmimo_jax.calibration import groups, offsets_closed_form, solver  # noqa: E402
from dmimo_jax.materials import relative_permittivity  # noqa: E402

NUM_STEPS, MAX_STEPS = 10, 400  # calibrate's defaults


def deployments(num: int, num_labeled: int, seed: int = 0):
    """(nominal model, labeled positions, stacked (groups, r, noise_var, u0)) of ``num``
    deployments of the same shapes."""
    scene = dj.paper_scene(-10.0, convention="itu")
    nominal = dj.TwoRayModel(scene)
    x = dj.sample_positions(jax.random.key(seed), num_labeled, scene)
    (idx,), _ = nominal.calibration_surfaces(None)
    eps0 = np.array([relative_permittivity("concrete", float(scene.frequency))])
    rows = []
    for i in range(num):
        key = jax.random.key(seed + 1 + i)
        real = dj.perturb_deployment(key, scene, position_std=1e-2, random_offsets=True)
        truth = dj.TwoRayModel(real.replace(eps_r=1.1 * real.eps_r))
        r = dj.simulate_phases_batch(
            jax.random.fold_in(key, 1),
            truth,
            x,
            dj.random_cpos(jax.random.fold_in(key, 2), num_labeled),
        )
        nv = jax.vmap(truth.variance)(x)
        start = offsets_closed_form(nominal, x, r)
        grp = (
            groups.positions_group(nominal, None),
            groups.OffsetsGroup.from_start(start),
            groups.surfaces_group(nominal, [idx], eps0),
        )
        rows.append((grp, r, nv, jnp.concatenate([g.u0 for g in grp])[None]))
    return nominal, x, rows


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="N = 8, one repeat")
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 64], help="deployments N")
    ap.add_argument("--num-labeled", type=int, default=50, help="labeled snapshots L each")
    ap.add_argument("--repeats", type=int, default=3, help="timed passes (median)")
    ap.add_argument("--json", type=pathlib.Path, default=None, help="write the rows here")
    args = ap.parse_args(argv)
    sizes = [8] if args.quick else args.sizes
    repeats = 1 if args.quick else args.repeats
    rows = []
    for num in sizes:
        model, x, worlds = deployments(num, args.num_labeled)

        def fit(grp, r, nv, u0, model=model, x=x):
            return solver.fit_rounds(model, grp, x, r, nv, u0, NUM_STEPS, MAX_STEPS)

        stacked = jax.tree.map(lambda *a: jnp.stack(a), *worlds)
        batched = jax.jit(jax.vmap(fit))

        def loop(worlds=worlds):
            return [fit(*w) for w in worlds]

        def vmapped(stacked=stacked, batched=batched):
            return batched(*stacked)

        jax.block_until_ready(loop())  # compile
        jax.block_until_ready(vmapped())
        one, t_loop = timed_passes(loop, repeats)
        many, t_vmap = timed_passes(vmapped, repeats)
        diff = max(float(jnp.max(jnp.abs(many.u[i] - o.u))) for i, o in enumerate(one))
        rows.append(
            {
                "deployments": num,
                "num_labeled": args.num_labeled,
                "device": device_name(),
                "loop_ms_per_deployment": 1e3 * t_loop / num,
                "vmap_ms_per_deployment": 1e3 * t_vmap / num,
                "speedup": t_loop / t_vmap,
                "converged": int(np.sum(np.asarray(many.converged))),
                "median_steps": float(np.median(np.asarray(many.steps))),
                "max_unknown_difference": diff,
            }
        )
    print_table(
        rows,
        [
            ("deployments", "N", "d"),
            ("num_labeled", "L", "d"),
            ("loop_ms_per_deployment", "loop ms/dep", ".1f"),
            ("vmap_ms_per_deployment", "vmap ms/dep", ".1f"),
            ("speedup", "speedup", ".2f"),
            ("converged", "converged", "d"),
            ("median_steps", "steps", ".0f"),
            ("max_unknown_difference", "max |du|", ".1e"),
        ],
    )
    if args.json:
        write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
