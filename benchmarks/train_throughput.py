"""Training throughput of every learned estimator, in samples per second (Sec. VI-A).

Runs the project's one training loop (``learning.train``: AdamW, one-cycle, the model's
own loss, data parallel over ``jax.devices()``) for a few epochs on random phases and
positions (throughput depends on the shapes, not on the data) and reports the steady
state: the last epoch's optimizer steps, without compilation or the validation pass.
From it, the time the preset's full training would take on this device:
epochs x training samples / throughput (the ``paper`` preset: 120 x 1e6 = 1.2e8).

    python benchmarks/train_throughput.py --json out/train_throughput.json
    python benchmarks/train_throughput.py --quick        # fewer steps per epoch
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)  # the scene in float64; the networks train in float32

import numpy as np  # noqa: E402
from _common import device_name, print_table, write_json  # noqa: E402
from flax import nnx  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.benchmarking import check_options  # noqa: E402
from dmimo_jax.estimators import hyperbola  # noqa: E402
from dmimo_jax.learning import SyntheticBatch  # noqa: E402
from dmimo_jax.learning.hi import AmbiguityClassifier  # noqa: E402
from dmimo_jax.learning.mlp import MLPConfig, MLPRegressor  # noqa: E402
from dmimo_jax.learning.popt import POPT  # noqa: E402
from dmimo_jax.learning.presets import PRESETS  # noqa: E402
from dmimo_jax.learning.train import TrainConfig, train  # noqa: E402


def networks(scene):
    """(name, preset, builder) of every network the pipeline trains."""
    m, low, high = scene.num_aps, scene.ue_low, scene.ue_high
    lam = float(scene.wavelength)
    n_max = hyperbola.max_ambiguity(scene.ap_positions, lam)
    return [
        (
            "POPT paper",
            "paper",
            lambda: POPT(m, PRESETS["paper"].popt, low=low, high=high, rngs=nnx.Rngs(0)),
        ),
        (
            "POPT cpu-preset",
            "cpu",
            lambda: POPT(m, PRESETS["cpu"].popt, low=low, high=high, rngs=nnx.Rngs(0)),
        ),
        (
            "MLP",
            "cpu",
            lambda: MLPRegressor(m, MLPConfig(), low=low, high=high, rngs=nnx.Rngs(0)),
        ),
        (
            "HI classifier",
            "cpu",
            lambda: AmbiguityClassifier(
                m,
                MLPConfig(),
                ap_positions=scene.ap_positions,
                wavelength=lam,
                n_max=n_max,
                rngs=nnx.Rngs(0),
            ),
        ),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="optimizer steps per epoch")
    ap.add_argument("--epochs", type=int, default=3, help="the last one is reported")
    ap.add_argument("--only", nargs="*", default=None, help="a subset of the network names")
    ap.add_argument("--quick", action="store_true", help="10 steps per epoch, 2 epochs")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.epochs = 10, 2
    check_options(steps=args.steps)
    check_options(2, epochs=args.epochs)  # epoch 1 compiles
    scene = dj.paper_scene()
    rng = np.random.default_rng(0)
    rows = []
    for name, preset_name, build in networks(scene):
        if args.only is not None and name not in args.only:
            continue
        preset = PRESETS[preset_name]
        batch = preset.train.batch_size
        n_train = args.steps * batch
        n = int(round(n_train * 9 / 8))  # + a validation eighth, as the presets split
        lo, hi = np.asarray(scene.ue_low), np.asarray(scene.ue_high)
        data = SyntheticBatch(
            x=rng.uniform(lo, hi, (n, 3)).astype(np.float32),
            r=rng.uniform(-np.pi, np.pi, (n, scene.num_aps)).astype(np.float32),
            cpo=np.zeros(n, np.float32),
        )
        config = TrainConfig(epochs=args.epochs, batch_size=batch, val_fraction=1 / 9)
        net = build()
        params = sum(p.size for p in jax.tree.leaves(nnx.state(net, nnx.Param)))
        # the loop's own epochs timed from outside: the last epoch (epoch 1 compiles);
        # validation is one ninth of the samples, forward passes only
        stamps = []
        t_start = time.perf_counter()
        train(
            net,
            data,
            config,
            progress=False,
            on_epoch_end=lambda epoch, row, s=stamps: s.append(time.perf_counter()),
        )
        last_epoch = stamps[-1] - (stamps[-2] if len(stamps) > 1 else t_start)
        sps = args.steps * batch / last_epoch
        full = preset.train.epochs * preset.num_samples * (1 - preset.train.val_fraction)
        rows.append(
            dict(
                method=name,
                preset=preset_name,
                framework="jax",
                device=device_name(),
                num_devices=jax.device_count(),
                batch=batch,
                parameters=int(params),
                samples_per_second=sps,
                ms_per_step=1e3 * batch / sps,
                preset_samples=full,
                preset_hours=full / sps / 3600,
            )
        )
        print(f"{name}: {sps:,.0f} samples/s", flush=True)
    cols = [
        ("method", "network", "s"),
        ("preset", "preset", "s"),
        ("batch", "batch", "d"),
        ("parameters", "parameters", ",d"),
        ("samples_per_second", "samples/s", ",.0f"),
        ("ms_per_step", "ms/step", ".1f"),
        ("preset_samples", "preset samples", ".3g"),
        ("preset_hours", "preset hours", ".2f"),
    ]
    print(f"device {device_name()} x {jax.device_count()}")
    print_table(rows, cols)
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
