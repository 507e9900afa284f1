"""The tiles' cell classifiers trained one after another (:func:`dmimo_jax.learning.train`, as
:func:`~dmimo_jax.pipeline.train_cell_classifier` does per tile) against together as one
vmapped program (:func:`dmimo_jax.learning.train_many`, as
:func:`~dmimo_jax.pipeline.tiled_offline.run_offline_tiled` does), in the same run.

``--tiles`` networks of the tiled benchmark's shape (``--aps`` APs in, a tile's 5 x 5 x 3
cells of 1 m out, ``--hidden`` widths) on random phases and positions (the time depends on
the shapes, not the data), each its own set of ``--samples``. Per way: the wall time of the
whole training (compilation and validation included: what a building's offline stage pays)
and per tile, the minimum of ``--repeats`` interleaved runs, and the ratio. The network axis is sharded over ``jax.devices()``: run with
``XLA_FLAGS=--xla_force_host_platform_device_count=4`` for four host devices.

    python benchmarks/tile_training.py --json out/tile_training.json
    python benchmarks/tile_training.py --tiles 2 --samples 4000 --hidden 64 64   # a smoke run
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from _common import device_name, print_table, write_json
from flax import nnx

from dmimo_jax.estimators import CellGrid
from dmimo_jax.learning import (
    CellClassifier,
    CellConfig,
    SyntheticBatch,
    TrainConfig,
    train,
    train_many,
)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiles", type=int, default=8)
    ap.add_argument("--aps", type=int, default=35, help="K, the tile's APs")
    ap.add_argument("--hidden", type=int, nargs="*", default=[512, 512, 512])
    ap.add_argument("--samples", type=int, default=50_000, help="per tile")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2, help="each way, interleaved; the minimum")
    ap.add_argument("--vmap-width", type=int, default=None, help="train_many's (default: its)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    grid = CellGrid(np.zeros(3), 1.0, (5, 5, 3))
    datas = [
        SyntheticBatch(
            x=rng.uniform([0, 0, 0], [5, 5, 3], (args.samples, 3)).astype(np.float32),
            r=rng.uniform(-np.pi, np.pi, (args.samples, args.aps)).astype(np.float32),
            cpo=np.zeros(args.samples, np.float32),
        )
        for _ in range(args.tiles)
    ]
    config = TrainConfig(epochs=args.epochs, batch_size=1024, pct_start=0.05, val_fraction=0.01)
    network = CellConfig(hidden=tuple(args.hidden), top_k=8)

    def nets():
        return [CellClassifier(args.aps, network, cells=grid, rngs=nnx.Rngs(0)) for _ in datas]

    warm = SyntheticBatch(datas[0].x[:2100], datas[0].r[:2100], datas[0].cpo[:2100])
    train(nets()[0], warm, config, progress=False)  # the first jit of the loop's pieces
    one_by_one, together = [], []
    for _ in range(args.repeats):  # interleaved: this machine's speed drifts
        t0 = time.perf_counter()
        for net, data in zip(nets(), datas, strict=True):
            train(net, data, config, progress=False)
        one_by_one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        train_many(nets(), datas, config, progress=False, vmap_width=args.vmap_width)
        together.append(time.perf_counter() - t0)
    one_by_one, together = min(one_by_one), min(together)
    row = dict(
        device=device_name(),
        devices=jax.device_count(),
        tiles=args.tiles,
        aps=args.aps,
        samples=args.samples,
        epochs=args.epochs,
        one_by_one_s=one_by_one,
        together_s=together,
        one_by_one_s_per_tile=one_by_one / args.tiles,
        together_s_per_tile=together / args.tiles,
        speedup=one_by_one / together,
    )
    print_table(
        [row],
        [
            ("devices", "devices", "d"),
            ("tiles", "tiles", "d"),
            ("samples", "samples/tile", "d"),
            ("one_by_one_s", "one by one s", ".1f"),
            ("together_s", "together s", ".1f"),
            ("one_by_one_s_per_tile", "s/tile", ".2f"),
            ("together_s_per_tile", "s/tile tog.", ".2f"),
            ("speedup", "speed-up", ".2f"),
        ],
    )
    write_json(args.json, dict(rows=[row], settings={k: str(v) for k, v in vars(args).items()}))


if __name__ == "__main__":
    main()
