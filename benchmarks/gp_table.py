"""Tabulating the GP of eqs. (25-27) (``gp.TabulatedGPModel.from_model``): time per table.

Fits the GP on L labeled snapshots (concrete, P = -10 dBm) and builds the default tables:
the mean of eq. (25a), where the separable kernel of eq. (22) makes each row of the table
a matrix product (``gp.kernel_factors``), and the variance of eq. (25b) (one triangular
solve per block of nodes). Next to it, the same mean table evaluated node by node with
the full kernel (what the table cost before the factorization; the reference for the
difference column).

    python benchmarks/gp_table.py --json out/gp_table.json
"""

from __future__ import annotations

import argparse
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, labeled_snapshots, print_table, time_call, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import gp, pipeline  # noqa: E402


@jax.jit
def node_by_node(model: gp.GPPhaseModel, dd: jax.Array, gamma: jax.Array) -> jax.Array:
    """Eq. (25a) at every node of dd x gamma, one full cross-kernel row per node."""
    kernel = gp.build_kernel(model.params, model.scene.wavelength)
    f = jnp.stack(jnp.meshgrid(dd, gamma, indexing="ij"), axis=-1).reshape(-1, 2)
    row = lambda fi: jax.vmap(kernel.evaluate, in_axes=(None, 0))(fi, model.cond_kernel.X)
    values = jax.lax.map(lambda fi: row(fi) @ model.alpha, f, batch_size=4096)
    return values.reshape(dd.shape[0], gamma.shape[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-train", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    scene = dj.paper_scene()
    x, r, nv = labeled_snapshots(scene, args.num_train, 0)
    model = pipeline.fit_phase_model(x, r, nv, scene)
    mean_only = lambda: gp.TabulatedGPModel.from_model(model, variance=False)
    table = mean_only()
    dd = jnp.arange(table.values.shape[0]) * table.step[0]
    gamma = jnp.arange(table.values.shape[1]) * table.step[1]
    reference = np.asarray(node_by_node(model, dd, gamma))
    rows = []
    for method, fn in [
        ("mean (factorized)", mean_only),
        ("mean + variance", lambda: gp.TabulatedGPModel.from_model(model)),
        ("mean node by node", lambda: node_by_node(model, dd, gamma)),
    ]:
        first, times = time_call(fn, args.repeats)
        rows.append(dict(method=method, first_s=first, median_s=float(np.median(times))))
    base = rows[0]["median_s"]
    for row in rows:
        row.update(
            ratio=row["median_s"] / base,
            nodes=int(np.prod(table.values.shape)),
            training_inputs=int(model.alpha.shape[0]),
            device=device_name(),
        )
    rows[0]["max_abs_diff_rad"] = float(np.max(np.abs(np.asarray(table.values) - reference)))
    print_table(
        rows,
        [
            ("method", "tables", "s"),
            ("first_s", "first s", ".3f"),
            ("median_s", "median s", ".3f"),
            ("ratio", "x factorized", ".1f"),
            ("max_abs_diff_rad", "max diff rad", ".1e"),
        ],
    )
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
