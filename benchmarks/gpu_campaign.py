"""The GPU measurements in one resumable command: train at paper scale, run the benchmarks.

Steps, each recorded in ``OUT/status.json`` when finished (a finished step is skipped):

1. ``train_paper``: :func:`dmimo_jax.pipeline.run_offline` with ``preset="paper"``: the
   L = 50 labeled snapshots of ``online_latency.py`` (concrete, -10 dBm) -> the GP -> the
   paper's synthetic set (1.125e6 samples) -> the paper's POPT (``POPTConfig.paper()``,
   MAE, AdamW one-cycle, batch 500, 120 epochs: 135 M sample-passes), an orbax
   checkpoint after every epoch, all in the cache ``OUT/cache``;
2. ``train_cells``: the same for this project's cell classifier (the ``paper`` preset's
   size, its own synthetic set from the tabulated GP mean);
3. ``online_latency`` (on the same cache, so it times the networks trained above),
   ``egs_flops``, ``popt_latency``, ``train_throughput``: each writes ``OUT/<name>.json``.

``--steps`` runs a subset (e.g. ``train_paper online_latency``); ``--online-methods`` passes
``online_latency.py`` its ``--methods`` (e.g. ``popt``: the other stages' ``paper`` presets
are hours of training of their own).

Every call stops by itself before ``--budget-s`` seconds (at an epoch boundary, after its
checkpoint) so it fits a 10-minute device call; run the same command again to go on:

    python benchmarks/gpu_campaign.py --out out/gpu --budget-s 540

On a CPU it runs too (slowly); ``--tiny`` shrinks every size for a smoke run.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import runpy
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics in float64; the networks stay float32

from _common import device_name, labeled_snapshots  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import pipeline  # noqa: E402
from dmimo_jax.benchmarking import read_rows  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent


class OutOfTime(Exception):
    """Raised at an epoch boundary (after its checkpoint) when the budget is spent."""


def _status(out: pathlib.Path) -> dict:
    f = out / "status.json"
    return read_rows(f) if f.exists() else {}


def _done(out: pathlib.Path, name: str, **info) -> None:
    status = _status(out)
    status[name] = dict(info, device=device_name(), finished=time.time())
    (out / "status.json").write_text(json.dumps(status, indent=1, default=str))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/gpu"))
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--preset", default="paper", choices=["paper", "cpu"])
    steps = ["train_paper", "train_cells", "egs_flops", "popt_latency", "train_throughput"]
    steps.append("online_latency")
    ap.add_argument("--steps", nargs="*", default=steps, choices=steps, help="a subset, in order")
    ap.add_argument(
        "--online-methods", nargs="*", default=None, help="online_latency's --methods (default all)"
    )
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget_s
    print(f"device {device_name()}; done so far: {sorted(_status(args.out))}", flush=True)
    scene = dj.paper_scene()
    x, r, nv = labeled_snapshots(scene, 50, 0)

    def stop(epoch, row):
        print(f"epoch {row['epoch']}: {row}", flush=True)
        if time.time() > deadline:
            raise OutOfTime

    for name, kind in (("train_paper", "popt"), ("train_cells", "cells")):
        if name in _status(args.out) or name not in args.steps:
            continue
        t0 = time.perf_counter()
        try:
            off = pipeline.run_offline(
                x,
                r,
                nv,
                scene,
                kinds=(kind,),
                preset=args.preset,
                cache_dir=args.out / "cache",
                on_epoch_end=stop,
            )
        except OutOfTime:
            print(f"{name}: budget spent; run the same command again to resume", flush=True)
            return _status(args.out)
        _done(
            args.out,
            name,
            seconds_last_call=time.perf_counter() - t0,
            info={k: v for k, v in off.info[kind].items() if k != "history"},
            last_epoch=off.info[kind]["history"][-1] if off.info[kind].get("history") else None,
        )

    quick = ["--quick"] if args.preset == "cpu" else []
    benches = [  # the online stage first: it measures the network trained above
        (
            "online_latency",
            "online_latency.py",
            [*quick, "--preset", args.preset, "--cache", str(args.out / "cache")]
            + (["--methods", *args.online_methods] if args.online_methods else []),
        ),
        ("egs_flops", "egs_flops.py", quick),
        ("popt_latency", "popt_latency.py", quick),
        ("train_throughput", "train_throughput.py", quick),
    ]
    sys.path.insert(0, str(HERE))
    for name, script, extra in benches:
        if name in _status(args.out) or name not in args.steps:
            continue
        if time.time() > deadline:
            print(f"budget spent before {name}; run the same command again", flush=True)
            break
        saved = sys.argv
        sys.argv = [script, *extra, "--json", str(args.out / f"{name}.json")]
        t0 = time.perf_counter()
        try:
            runpy.run_path(str(HERE / script), run_name="__main__")
        finally:
            sys.argv = saved
        _done(args.out, name, seconds=time.perf_counter() - t0)
    return _status(args.out)


if __name__ == "__main__":
    main()
