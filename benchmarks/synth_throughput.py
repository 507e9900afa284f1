"""Synthetic training-set generation from the GP PhaseModel (Sec. III-C): time and memory.

Fits the GP on L = 50 measured UEs (concrete, P = -10 dBm), then writes N samples
(default the paper's N_AI = 1.125e6) to ``--out`` with ``write_dataset`` (chunked,
resumable). Reports seconds per 1e5 samples and the peak RSS.

    python benchmarks/synth_throughput.py --n 100000 --json out/synth.json
    python benchmarks/synth_throughput.py                      # N_AI = 1.125e6
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import time

import jax

jax.config.update("jax_enable_x64", True)

from _common import device_name, peak_rss_mb, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import gp  # noqa: E402
from dmimo_jax.learning import load_dataset, write_dataset  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_125_000)
    ap.add_argument("--num-train", type=int, default=50)
    ap.add_argument("--chunk-size", type=int, default=8192)
    ap.add_argument("--out", type=pathlib.Path, default=None, help="dataset dir (default: temp)")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    scene = dj.paper_scene()
    truth = dj.TwoRayModel(scene)
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    x = dj.sample_positions(k1, args.num_train, scene)
    r = dj.simulate_phases_batch(k3, truth, x, dj.random_cpos(k2, args.num_train))
    nv = jax.vmap(truth.variance)(x)
    t_fit = time.perf_counter()
    fit = gp.fit(x, r, nv, scene)
    fit_seconds = time.perf_counter() - t_fit
    model = gp.GPPhaseModel.from_fit(fit, x, r, nv, scene)
    out = args.out or pathlib.Path(tempfile.mkdtemp()) / "synthetic"
    t0 = time.perf_counter()
    write_dataset(out, jax.random.key(1), model, args.n, chunk_size=args.chunk_size)
    seconds = time.perf_counter() - t0
    data = load_dataset(out)
    row = dict(
        method=f"gp-L{args.num_train}",
        n=args.n,
        seconds=seconds,
        s_per_1e5=seconds / args.n * 1e5,
        fit_seconds=fit_seconds,
        disk_mb=sum(f.stat().st_size for f in out.iterdir()) / 2**20,
        peak_rss_mb=peak_rss_mb(),
        device=device_name(),
        r_min=float(data.r.min()),
        r_max=float(data.r.max()),
    )
    print_table(
        [row],
        [
            ("method", "model", "s"),
            ("n", "N", "d"),
            ("seconds", "seconds", ".1f"),
            ("s_per_1e5", "s/1e5", ".2f"),
            ("disk_mb", "disk_MB", ".0f"),
            ("peak_rss_mb", "rss_MB", ".0f"),
        ],
    )
    write_json(args.json, [row])
    if args.out is None:
        shutil.rmtree(out.parent)
    return 0


if __name__ == "__main__":
    sys.exit(main())
