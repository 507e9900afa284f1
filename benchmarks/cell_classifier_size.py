"""The cell classifier's size against what the Locator needs of it, over seeds.

The quickstart's world (the paper's scene, concrete, -10 dBm, L = 50 labeled snapshots of
seed s, the ``quick`` preset's synthetic set), one classifier per variant WIDTHxEPOCHS
(``--depth`` hidden layers of WIDTH, EPOCHS passes over the set), each trained from an empty
cache folder: the offline stage's seconds (the GP fit, the synthetic set and the training),
the classifier's parameters, then ``dj.Locator.from_offline(off, "cells")`` on
``--num-test`` unseen snapshots of the true channel (key 50,000 + s): the cell recall (the
true cell among the screened candidates), the statuses, RMSE over the mean PEB, p99, and
the median time per snapshot at batch 1 and 256 (each variant timed after its own compile,
one after another; the first row of a process also compiles the offline stage's programs).
The record is rewritten after every row; a second call with the same
``--json`` skips the rows it holds (interrupt and resume).

    python benchmarks/cell_classifier_size.py --json out/cell_classifier_size.json
    python benchmarks/cell_classifier_size.py --seeds 0 --variants 64x1 --num-samples 4000 --num-test 16
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import tempfile
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics in float64; the networks stay float32

import numpy as np  # noqa: E402
from _common import print_table, write_json  # noqa: E402
from flax import nnx  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.benchmarking import check_options, read_rows, timed_passes  # noqa: E402
from dmimo_jax.learning import get_preset  # noqa: E402
from dmimo_jax.learning.cells import CellConfig  # noqa: E402
from dmimo_jax.pipeline.rescues import Status  # noqa: E402


def variant(spec: str, depth: int, num_samples: int | None):
    """``"512x3"`` -> the ``quick`` preset's cell settings with 3 x 512 hidden, 3 epochs."""
    try:
        width, epochs = (int(v) for v in spec.split("x"))
    except ValueError:
        raise ValueError(f"--variants: WIDTHxEPOCHS such as 512x3, got {spec!r}") from None
    if width < 1 or epochs < 1:
        raise ValueError(f"--variants: a positive width and epoch count, got {spec!r}")
    base = get_preset("quick").cells
    train = dataclasses.replace(base.train, epochs=epochs)
    if num_samples is not None:  # a small set: a minibatch of at most a tenth of it
        train = dataclasses.replace(train, batch_size=min(train.batch_size, num_samples // 10))
    return dataclasses.replace(
        base,
        network=CellConfig(hidden=(width,) * depth),
        train=train,
        num_samples=base.num_samples if num_samples is None else num_samples,
    )


def per_snapshot_ms(loc, r, repeats: int) -> tuple[float, float]:
    """Median ms per snapshot of ``loc`` at batch 1 (``repeats`` calls) and 256 (a tenth of
    them, at least one; fewer rows: all), each batch size compiled first."""
    out = []
    for b, calls in ((1, repeats), (min(256, len(r)), max(1, repeats // 10))):
        jax.block_until_ready(loc(r[:b]))
        out.append(1e3 * timed_passes(lambda b=b: loc(r[:b]), calls)[1] / b)
    return out[0], out[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--variants", nargs="+", default=["512x3", "512x2", "1024x1", "1024x2"])
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--num-samples", type=int, default=None, help="default: the quick preset's")
    ap.add_argument("--num-test", type=int, default=1024)
    ap.add_argument(
        "--cache",
        type=pathlib.Path,
        default=None,
        help="default: a temporary folder (a folder that already holds a classifier makes its offline s a load)",
    )
    ap.add_argument("--repeats", type=int, default=50, help="timed calls at batch 1 (256: a tenth)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    check_options(repeats=args.repeats)
    settings = {v: variant(v, args.depth, args.num_samples) for v in args.variants}
    rows = list(read_rows(args.json)) if args.json and pathlib.Path(args.json).is_file() else []
    done = {(r["seed"], r["variant"]) for r in rows}
    scene = dj.paper_scene(-10.0, "concrete")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.cache or pathlib.Path(tmp)
        for seed in args.seeds:
            if all((seed, name) in done for name in settings):
                continue  # a resumed run: nothing of this seed left to measure
            lab = dj.measure.labeled_snapshots(jax.random.key(seed), scene, 50)
            test = dj.measure.labeled_snapshots(jax.random.key(50_000 + seed), scene, args.num_test)
            pebs = np.asarray(dj.peb_map(test.x, scene))
            for name, cells in settings.items():
                if (seed, name) in done:
                    continue
                t0 = time.perf_counter()
                off = dj.run_offline(lab.x, lab.r, lab.variance, scene, kinds=("cells",),
                                     preset="quick", cells=cells, seed=seed, progress=False,
                                     cache_dir=root / f"{name}-d{args.depth}")  # fmt: skip
                offline_s = time.perf_counter() - t0
                loc = dj.Locator.from_offline(off, "cells")
                out = jax.block_until_ready(loc(test.r))
                ms1, ms256 = per_snapshot_ms(loc, test.r, args.repeats)
                err = np.linalg.norm(np.asarray(out.x) - np.asarray(test.x), axis=1)
                truth = np.asarray(off.estimators["cells"].cells.index(test.x))
                screened = np.asarray(loc.coarse(test.r)[0])
                status = np.bincount(np.asarray(out.status), minlength=len(Status))
                weights = nnx.state(off.estimators["cells"], nnx.Param)
                params = sum(int(np.size(w)) for w in jax.tree.leaves(weights))
                rows.append(dict(
                    seed=seed, variant=name, hidden=list(cells.network.hidden),
                    epochs=cells.train.epochs, num_samples=cells.num_samples, parameters=params,
                    offline_s=offline_s, recall=float(np.any(screened == truth[:, None], axis=1).mean()),
                    statuses={s.name.lower(): int(status[s]) for s in Status},
                    rmse_over_peb=float(np.sqrt(np.mean(err**2)) / pebs.mean()),
                    p99_um=1e6 * float(np.percentile(err, 99)), ms_batch1=ms1,
                    ms_batch256=ms256,
                ))  # fmt: skip
                write_json(args.json, rows)
    columns = [("seed", "seed", "d"), ("variant", "variant", "s"), ("parameters", "params", ",d"),
               ("offline_s", "offline s", ".1f"), ("recall", "recall", ".4f"),
               ("rmse_over_peb", "RMSE/PEB", ".4f"), ("p99_um", "p99 um", ".1f"),
               ("ms_batch1", "ms batch 1", ".3f"), ("ms_batch256", "ms @256", ".3f")]  # fmt: skip
    print_table(rows, columns)
    for r in rows:
        rescued = {k: v for k, v in r["statuses"].items() if v and k != "located"}
        print(f"seed {r['seed']} {r['variant']}: statuses other than located {rescued or 'none'}")
    return rows


if __name__ == "__main__":
    main()
