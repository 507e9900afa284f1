"""The Techtile results as a figure, from the JSON records `examples/real_techtile.py` wrote.

Reads `real_techtile_seed*.json` (the phase-only methods) and `real_techtile_complex_seed*.json`
(the complex ones) in a measurements folder and plots each method's median and 90th-percentile
error per experiment, one marker per label draw (seed). No data are needed: the records hold
the errors.

    python examples/real_techtile_figure.py                    # docs/measurements/cpu-2026-11-26
    python examples/real_techtile_figure.py --records DIR --out docs/figures/real_data_methods.png
"""

from __future__ import annotations

import argparse
import json
import pathlib

from _helpers import pyplot, save_figure

METHODS = ("los_offsets", "knn", "paper_gp", "complex", "best", "best_field")
EXPERIMENTS = ("EXP003", "EXP005", "EXP002")


def read_rows(folder: pathlib.Path) -> list[dict]:
    """Every row of the folder's real_techtile records (the complex records last, so that a
    method both list is taken from its own run)."""
    rows = []
    for pattern in ("real_techtile_seed*.json", "real_techtile_complex_seed*.json"):
        for path in sorted(folder.glob(pattern)):
            rows += json.loads(path.read_text())["rows"]
    if not rows:
        raise ValueError(f"--records: no real_techtile_seed*.json records in {folder}")
    return rows


def main(argv: list[str] | None = None) -> pathlib.Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", default="docs/measurements/cpu-2026-11-26")
    parser.add_argument("--out", default="docs/figures/real_data_methods.png")
    args = parser.parse_args(argv)
    rows = read_rows(pathlib.Path(args.records))
    best = {}
    for r in rows:  # the last record of a (method, experiment, seed) wins
        best[(r["method"], r["experiment"], r["seed"])] = r
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.6), sharey=True)
    for ax, exp in zip(axes, EXPERIMENTS, strict=True):
        for i, method in enumerate(METHODS):
            runs = [v for (m, e, _), v in best.items() if m == method and e == exp]
            for r in runs:
                ax.plot(i - 0.12, 100 * r["median_m"], "o", color="C0", ms=4)
                ax.plot(i + 0.12, 100 * r["p90_m"], "s", color="C3", ms=4)
        ax.set_yscale("log")
        ax.set_xticks(range(len(METHODS)), METHODS, rotation=40, ha="right", fontsize=8)
        ax.set_title(f"{exp}" + (" (rover mostly still)" if exp == "EXP002" else ""))
        ax.grid(True, which="both", axis="y", alpha=0.3)
    axes[0].set_ylabel("error [cm]")
    axes[0].plot([], [], "o", color="C0", label="median")
    axes[0].plot([], [], "s", color="C3", label="90th percentile")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.suptitle("Techtile, L = 50 labeled snapshots, one marker per label draw", fontsize=10)
    out = pathlib.Path(args.out)
    save_figure(fig, out)  # says where it wrote
    return out


if __name__ == "__main__":
    main()
