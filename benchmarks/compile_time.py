"""The Locator's program: its size and compile time per batch size, next to a reference program
compiled in the same run.

The quickstart's world (the paper's scene, concrete, -10 dBm, L = 50, the ``quick`` cell
classifier, cached; ``--tiny``: a 0.6 m region and a small classifier, for a smoke run). For
each batch size of the Locator's buckets: the StableHLO lines of ``Locator.program`` (with
and without fault exclusion; compiled with the package's ``PROGRAM_COMPILER_OPTIONS`` and,
where those are not empty, also with XLA's defaults), the trace+lower time, XLA's compile time, the first call and
the steady call per snapshot; the reference is ``peb_map`` over 256 points, lowered and
compiled in the same process (these machines are noisy: compare the ratio). Then a sweep of
every batch size 1..``--sweep`` through ``loc(r)``: how many programs it compiled and the
seconds they took. No persistent compilation cache is used in this process (each compile
is measured); the last row is a *second process*: the Locator exported at batch 1
(:func:`~dmimo_jax.pipeline.export_locator`), loaded and called in two fresh processes
sharing a persistent compilation cache; the second's load and first call are timed.

    python benchmarks/compile_time.py --json out/compile_time.json
    python benchmarks/compile_time.py --tiny --batches 1 16 --sweep 20
    python benchmarks/compile_time.py --batches 1 256 --sweep 0 --levels  # XLA's levels 0, 1
    python benchmarks/compile_time.py --batches 1 --sweep 0 --phases  # what XLA's compile does

With ``--phases`` the Locator's program is compiled once more per batch size under JAX's
profiler, and the row gets XLA's phases of that compile (its HLO passes, its code
generation, the whole backend compile; seconds, from the trace's events of those names in
the installed XLA, absent where it names them otherwise) and its ``phases_top``, the
largest events by name.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics in float64; the networks stay float32
jax.config.update("jax_enable_compilation_cache", False)  # every compile measured, none read

import jax.numpy as jnp  # noqa: E402
from _common import device_name, print_table, trace_seconds, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import pipeline  # noqa: E402


def offline_world(tiny: bool):
    """``(offline, scene)`` of the quickstart's world, or of a tiny one."""
    from dmimo_jax.learning import get_preset

    scene = dj.paper_scene(-10.0, "concrete")
    preset = get_preset("quick")
    cells = preset.cells
    if tiny:
        import dataclasses

        scene = scene.replace(ue_low=jnp.array([5.0, 5.0, 1.5]), ue_high=jnp.array([5.6, 5.6, 1.9]))
        train = dataclasses.replace(cells.train, epochs=2, batch_size=200)
        cells = dataclasses.replace(cells, num_samples=4000, train=train, cell_size=0.2)
    lab = dj.measure.labeled_snapshots(jax.random.key(0), scene, 50)
    off = dj.run_offline(lab.x, lab.r, lab.variance, scene, kinds=("cells",), preset="quick",
                         cells=cells, seed=0, progress=False)  # fmt: skip
    return off, scene


def compile_row(loc, r, capacity, label, options=None, phases=False):
    """StableHLO lines, lower and compile seconds of ``loc.program`` at ``r``'s shape,
    compiled as the package compiles it (``options`` None: :func:`pipeline.program_jit`,
    with :data:`pipeline.PROGRAM_COMPILER_OPTIONS`) or with the XLA ``options`` given
    (``{}``: XLA's defaults); with ``phases``, XLA's phases of the same program compiled once
    more (:func:`compile_phases`)."""
    if options is None:
        fn = pipeline.program_jit(pipeline.Locator.program, static_argnums=2)
    else:
        jit_options = dict(options) or None
        fn = jax.jit(pipeline.Locator.program, static_argnums=2, compiler_options=jit_options)
    t0 = time.perf_counter()
    lowered = fn.lower(loc, r, capacity, jnp.int32(r.shape[0]))
    t1 = time.perf_counter()
    lines = lowered.as_text().count("\n")
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    out = compiled(loc, r, jnp.int32(r.shape[0]))
    jax.block_until_ready(out)
    t4 = time.perf_counter()
    steady = []
    for _ in range(3):
        s = time.perf_counter()
        jax.block_until_ready(compiled(loc, r, jnp.int32(r.shape[0])))
        steady.append(time.perf_counter() - s)
    row = dict(program=label, batch=r.shape[0], stablehlo_lines=lines, lower_s=t1 - t0,
               compile_s=t3 - t2, first_call_s=t4 - t3,
               steady_ms_per_snapshot=1e3 * min(steady) / r.shape[0])  # fmt: skip
    return {**row, **compile_phases(lowered)} if phases else row


PHASES = (
    ("hlo_passes_s", (("HLO passes through layout assignment", "HLO passes after layout assignment"),)),
    ("codegen_s", (("Codegen",),)),
    ("backend_compile_s", (("PjRtCpuClient::Compile",), ("CompileCpuExecutable",))),
)  # fmt: skip
"""``--phases``: row keys and the XLA:CPU trace events of each: the first group of names
that the trace holds, summed (jaxlib 0.10 and 0.12 name the backend's compile differently;
an event's name may carry the module's after a space: ``... (jit_program)``)."""


def compile_phases(lowered) -> dict:
    """XLA's phases of one more compile of the ``lowered`` program, under JAX's profiler
    (``--phases``: :data:`PHASES`, and the 12 largest events by name). A ``Lowered`` hands
    back its first executable unless given compiler options, so it is given none in a dict
    (``{}``: the same options); JAX's in-memory caches, which would too, are cleared first."""
    jax.clear_caches()
    events = trace_seconds(lambda: lowered.compile({}), top=200)
    row = {}
    for key, groups in PHASES:
        row[key] = None
        for names in groups:
            found = [t for name, t, _ in events if name.split(" (")[0] in names]
            if found:
                row[key] = sum(found)
                break
    row["phases_top"] = [(name, round(t, 4), n) for name, t, n in events[:12]]
    return row


def reference_row(scene):
    """``peb_map`` over 256 points, lowered and compiled: the yardstick of this run."""
    x = dj.sample_positions(jax.random.key(1), 256, scene)
    fn = jax.jit(lambda x: dj.peb_map(x, scene))
    t0 = time.perf_counter()
    lowered = fn.lower(x)
    t1 = time.perf_counter()
    lines = lowered.as_text().count("\n")
    t2 = time.perf_counter()
    lowered.compile()
    t3 = time.perf_counter()
    return dict(program="reference: peb_map(256)", batch=256, stablehlo_lines=lines,
                lower_s=t1 - t0, compile_s=t3 - t2)  # fmt: skip


LEVELS = (
    ("level 0", {"xla_backend_optimization_level": 0}),
    ("level 0, expensive passes off",
     {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}),
    ("level 1", {"xla_backend_optimization_level": 1}),
    ("expensive passes off", {"xla_llvm_disable_expensive_passes": True}),
)  # fmt: skip
"""``--levels``: more compiler options beside the package's (docs/performance.md)."""


SECOND_PROCESS = """
import sys, time
import jax
jax.config.update("jax_enable_x64", True)
import numpy as np
from dmimo_jax import pipeline
pipeline.use_compilation_cache(sys.argv[2])
t0 = time.perf_counter()
loaded = pipeline.load_locator(sys.argv[1])
t1 = time.perf_counter()
jax.block_until_ready(loaded(np.full((1, loaded.num_aps), 0.1)).x)
print(t1 - t0, time.perf_counter() - t1)
"""


def second_process_row(loc) -> dict:
    """The Locator exported at batch 1, loaded and called by two fresh processes that share a
    persistent compilation cache: the second's load and first call (seconds)."""
    with tempfile.TemporaryDirectory() as tmp:
        pipeline.export_locator(loc, f"{tmp}/loc", batch_sizes=(1,))
        times = []
        for _ in range(2):
            out = subprocess.run([sys.executable, "-c", SECOND_PROCESS, f"{tmp}/loc", f"{tmp}/xla"],
                                 capture_output=True, text=True, check=True)  # fmt: skip
            times.append([float(v) for v in out.stdout.split()[-2:]])
    return dict(program="second process: load_locator + first call", batch=1,
                load_s=times[1][0], first_call_s=times[1][1], cold_first_call_s=times[0][1])  # fmt: skip


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="a small world (smoke run)")
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 256, 4096])
    ap.add_argument("--sweep", type=int, default=64, help="loc(r) for every batch 1..N (0: none)")
    ap.add_argument("--levels", action="store_true", help="also XLA's optimization levels 0, 1")
    ap.add_argument("--phases", action="store_true", help="XLA's phases of the compile")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    off, scene = offline_world(args.tiny)
    loc = dj.Locator.from_offline(off, "cells")
    rows = [reference_row(scene)]
    test = dj.measure.labeled_snapshots(jax.random.key(10_000), scene, max(args.batches))
    for b in args.batches:
        r = test.r[:b]
        own = pipeline.PROGRAM_COMPILER_OPTIONS
        programs = [("Locator", loc, None),
                    ("Locator, max_excluded=0", loc.replace(max_excluded=0), None)]  # fmt: skip
        if own:  # the package's options against XLA's defaults
            programs.append(("Locator, XLA's default options", loc, {}))
        if args.levels:  # the package's options and a lower optimization level (not taken)
            programs += [(f"Locator, + {name}", loc, {**own, **more}) for name, more in LEVELS]
        for label, lo, options in programs:
            phases = args.phases and label == "Locator"
            rows.append(compile_row(lo, r, lo.capacity_for(b), label, options, phases))
            ref = rows[0]["compile_s"]
            rows[-1]["compile_over_reference"] = rows[-1]["compile_s"] / ref
            print(rows[-1])
    # every batch size 1..sweep through the checked call: the buckets bound the programs
    if args.sweep > 0:
        sweep = dj.measure.labeled_snapshots(jax.random.key(20_000), scene, args.sweep)
        before = pipeline.Locator.compiled_programs()
        t0 = time.perf_counter()
        for n in range(1, args.sweep + 1):
            jax.block_until_ready(loc(sweep.r[:n]).x)
        sweep_s = time.perf_counter() - t0
        programs = pipeline.Locator.compiled_programs() - before
        rows.append(dict(program=f"loc(r), every batch 1..{args.sweep}", batch=args.sweep,
                         programs=programs, sweep_s=sweep_s))  # fmt: skip
    rows.append(second_process_row(loc))
    print(rows[-1])
    print(f"device {device_name()}")
    print_table(rows, [("program", "program", ">28"), ("batch", "batch", "d"),
                       ("stablehlo_lines", "HLO lines", "d"), ("lower_s", "lower s", ".2f"),
                       ("compile_s", "compile s", ".2f"),
                       ("compile_over_reference", "x reference", ".2f"),
                       ("hlo_passes_s", "HLO passes s", ".2f"), ("codegen_s", "codegen s", ".2f"),
                       ("first_call_s", "first call s", ".3f"),
                       ("steady_ms_per_snapshot", "ms/snapshot", ".4f"),
                       ("programs", "programs", "d"), ("sweep_s", "sweep s", ".1f")])  # fmt: skip
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
