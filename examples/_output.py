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


def write_json(path: pathlib.Path | None, rows) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, indent=1))
    print(f"wrote {path}")
