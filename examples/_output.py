"""Shared by the example scripts: optional matplotlib, JSON rows."""

from __future__ import annotations

import json
import pathlib


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend, or None (with a hint) when not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: pip install -e '.[plots]' for the PNG")
        return None
    return plt


def save_figure(fig, path: pathlib.Path) -> None:
    """Grid and legend on every axis, tight layout, save as PNG."""
    for ax in fig.axes:
        if ax.get_legend_handles_labels()[0]:
            ax.grid(True, which="both", alpha=0.3)
            ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    print(f"wrote {path}")


def repeat_style(drawn: list, name: str, values) -> tuple[str, dict]:
    """Label and line style of a curve: one identical to an earlier curve in ``drawn``
    (a list of (name, values), appended to here) is dashed and labelled "(= earlier)"."""
    same = next((n for n, v in drawn if v == values), None)
    drawn.append((name, values))
    if same is None:
        return name, dict(ls="-")
    return f"{name} (= {same})", dict(ls=(0, (4, 3)), lw=2.5)


def write_json(path: pathlib.Path | None, rows) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1))
    print(f"wrote {path}")
