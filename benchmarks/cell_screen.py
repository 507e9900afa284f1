"""The candidate screen's two orders side by side: snapshot by snapshot (gather) and cell by
cell (``estimators.candidates.cell_groups``), per batch size and candidate count.

The deployment world's true room (``datasets.synthetic_deployment``), its 243 cells of
1 m, random UEs, candidate cells the K nearest to each UE (jittered, like a classifier's);
the starts only (the refinement after them is the same for both). Where the rule picks the
gather, only the gather is timed.

    python benchmarks/cell_screen.py --json out/cell_screen.json
    python benchmarks/cell_screen.py --quick
"""

from __future__ import annotations

import argparse
import pathlib
from functools import partial

import jax

jax.config.update("jax_enable_x64", True)  # physics in float64; the screen's rows are float32

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, print_table, time_call, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.datasets import synthetic_deployment  # noqa: E402
from dmimo_jax.estimators import candidates, cell_grid, cell_table  # noqa: E402

CASES = ((1280, 16), (1280, 4), (640, 4), (128, 16), (64, 16), (32, 16), (128, 4))


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-starts", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="two cases: one grouped, one gathered")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    cases = ((64, 16), (32, 16)) if args.quick else CASES
    model = synthetic_deployment(-10.0, seed=0).truth
    cells = cell_grid(model, 1.0)
    table = cell_table(model, cells)
    gather = jax.jit(candidates.starts_by_snapshot, static_argnums=(3, 4))
    grouped = jax.jit(candidates.starts_by_cell, static_argnums=(3,))
    centres = cells.centre(jnp.arange(cells.num_cells))
    rng = np.random.default_rng(0)
    rows = []
    for n, k in cases:
        x = dj.sample_positions(jax.random.key(n + k), n, model.scene)
        r = dj.phase.wrap(jax.vmap(model.mean)(x) + jnp.asarray(rng.uniform(-np.pi, np.pi, (n, 1))))
        d = jnp.linalg.norm(centres[None] - x[:, None], axis=-1)
        d = d + 0.3 * jnp.asarray(rng.uniform(size=d.shape))
        cand = jnp.argsort(d, axis=1)[:, :k].astype(jnp.int32)
        groups = candidates.cell_groups(cand, cells.num_cells)
        run_gather = partial(gather, r, table, cand, args.num_starts, 8)
        _, times = time_call(run_gather, args.repeats)
        row = dict(
            num_snapshots=n,
            num_cells=k,
            rule="by cell" if groups is not None else "gather",
            ms_gather=1e3 * min(times) / n,
            device=device_name(),
        )
        if groups is not None:
            run_cell = partial(grouped, r, table, cand, args.num_starts, groups)
            _, times = time_call(run_cell, args.repeats)
            row.update(
                ms_by_cell=1e3 * min(times) / n,
                speedup=row["ms_gather"] / (1e3 * min(times) / n),
                lanes=int(groups.members.size),
                # the same points; their sub-grid shifts to float32 rounding
                same_starts=bool(np.allclose(run_gather(), run_cell(), rtol=0, atol=1e-5)),
            )
        rows.append(row)
    print_table(
        rows,
        [
            ("num_snapshots", "snapshots", "d"),
            ("num_cells", "cells K", "d"),
            ("rule", "rule", "s"),
            ("ms_gather", "ms gather", ".3f"),
            ("ms_by_cell", "ms by cell", ".3f"),
            ("speedup", "x", ".1f"),
            ("same_starts", "same", ""),
        ],
    )
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
