"""Regenerate every numerical result of the paper, one script per figure/table, resumable.

Runs in sequence: Fig. 2 (``fig2_gp_example.py``), Fig. 4(a) (``fig4a_perturbation.py``),
Fig. 4(b, c) (``fig4bc_modeling.py``), Table I (``table1_materials.py``), Fig. 5(a)
(``fig5a_power.py``), Fig. 5(b, c) (``fig5bc_localization.py``) and Table II
(``table2_complexity.py``). A finished script is recorded in ``<out>/status.json`` and not
run again; the scripts themselves keep partial results, so an interrupted run continues
where it stopped. ``--quick`` passes ``--quick`` (CPU, minutes each).

    python examples/paper/reproduce_all.py --quick
    python examples/paper/reproduce_all.py            # the paper's sizes (a GPU for training)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import runpy
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent


def steps(out: pathlib.Path, quick: bool) -> list[tuple[str, str, list[str]]]:
    q = ["--quick"] if quick else []
    return [
        ("fig2", "fig2_gp_example.py", ["--out", str(out / "fig2" / "gp_example")]),
        ("fig4a", "fig4a_perturbation.py", [*q, "--out", str(out / "fig4a")]),
        ("fig4bc", "fig4bc_modeling.py", [*q, "--out", str(out / "fig4bc" / "gp_modeling")]),
        (
            "table1",
            "table1_materials.py",
            [*q, "--json", str(out / "table1" / "material_table.json")],
        ),
        ("fig5a", "fig5a_power.py", [*q, "--out", str(out / "fig5a")]),
        ("fig5bc", "fig5bc_localization.py", [*q, "--out", str(out / "fig5bc")]),
        (
            "table2",
            "table2_complexity.py",
            [*q, "--out", str(out / "table2"), "--fig5", str(out / "fig5bc" / "results.json")],
        ),
    ]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*", default=None, help="a subset of the step names")
    ap.add_argument("--out", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or pathlib.Path("out/paper_quick" if args.quick else "out/paper")
    out.mkdir(parents=True, exist_ok=True)
    status_file = out / "status.json"
    status = json.loads(status_file.read_text()) if status_file.exists() else {}
    sys.path.insert(0, str(HERE.parent))  # examples/_helpers.py
    for name, script, script_argv in steps(out, args.quick):
        if args.only is not None and name not in args.only:
            continue
        if status.get(name, {}).get("done"):
            print(f"== {name}: done earlier ({status[name]['seconds']:.0f} s), skipped")
            continue
        print(f"== {name}: python examples/{script} {' '.join(script_argv)}", flush=True)
        t0 = time.perf_counter()
        saved = sys.argv
        sys.argv = [script, *script_argv]
        try:
            runpy.run_path(str(HERE / script), run_name="__main__")
        finally:
            sys.argv = saved
        status[name] = dict(
            done=True, seconds=time.perf_counter() - t0, script=script, argv=script_argv
        )
        status_file.write_text(json.dumps(status, indent=1))
    total = sum(s["seconds"] for s in status.values())
    print(f"all steps done; total {total:.0f} s ({total / 60:.1f} min) of script time")
    return status


if __name__ == "__main__":
    main()
