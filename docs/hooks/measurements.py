"""MkDocs hook: the Results page's recorded measurements, generated at build time from the
JSON records under docs/measurements/<machine>-<date>/ (written by
``dmimo_jax.benchmarking.write_json``: command, date, machine and rows).

The marker ``<!-- measurements -->`` in results.md is replaced by one section per folder
(heading "Measurements <folder>", anchor ``#measurements-<folder>``) and one per record.
"""

from __future__ import annotations

import json
import pathlib
import re

from dmimo_jax.benchmarking import PROVENANCE  # the keys a record adds around its rows

MARKER = "<!-- measurements -->"
MAX_ROWS = 24  # longer tables show their first and last rows; the JSON holds them all


def _format(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (int, float)) for v in value) and len(value) <= 4:
            return ", ".join(_format(v) for v in value)
        return f"({len(value)} values)"
    if isinstance(value, dict):
        return f"({len(value)} entries)"
    return str(value).replace("|", "\\|")


def _rows(record) -> tuple[list[dict], dict]:
    """(rows, the record's other scalar fields)."""
    if isinstance(record, list):
        return [r if isinstance(r, dict) else {"value": r} for r in record], {}
    rest = {k: v for k, v in record.items() if k not in PROVENANCE}
    if isinstance(rest.get("rows"), list):
        rows = rest.pop("rows")
        return [r if isinstance(r, dict) else {"value": r} for r in rows], rest
    if rest and all(isinstance(v, dict) for v in rest.values()):
        return [{"key": k} | v for k, v in rest.items()], {}
    return [rest], {}


def _table(rows: list[dict]) -> list[str]:
    columns: list[str] = []
    for r in rows:
        columns += [k for k in r if k not in columns]
    shown = rows if len(rows) <= MAX_ROWS else rows[:6] + [None] + rows[-6:]
    out = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    for r in shown:
        if r is None:
            out.append("| " + " | ".join(["..."] * len(columns)) + " |")
            continue
        out.append("| " + " | ".join(_format(r.get(c)) for c in columns) + " |")
    if len(rows) > MAX_ROWS:
        out.append("")
        out.append(f"({len(rows)} rows: the first and last 6 shown.)")
    return out


def _section(path: pathlib.Path, root: pathlib.Path) -> list[str]:
    record = json.loads(path.read_text())
    folder = path.parent.name
    m = re.fullmatch(r"(.+)-(\d{4}-\d{2}-\d{2})", folder)
    machine_dir, date_dir = (m.group(1), m.group(2)) if m else (folder, "-")
    meta = record if isinstance(record, dict) else {}
    command = meta.get("command")
    if not command:
        script = root / "benchmarks" / f"{path.stem}.py"
        command = (
            f"python benchmarks/{path.stem}.py (its arguments were not recorded)"
            if script.exists()
            else "not recorded"
        )
    machine = meta.get("machine") or machine_dir
    if isinstance(machine, dict):
        machine = ", ".join(f"{k} {v}" for k, v in machine.items())
    rows, rest = _rows(record)
    lines = [
        f"#### `{path.relative_to(root).as_posix()}`",
        "",
        f"`{command}`; {meta.get('date', date_dir)}; {machine}.",
        "",
    ]
    if rest:
        scalars = {k: v for k, v in rest.items() if not isinstance(v, (dict, list))}
        if scalars:
            lines += [", ".join(f"{k} {_format(v)}" for k, v in scalars.items()) + ".", ""]
    return [*lines, *_table(rows), ""]


def generate(root: pathlib.Path) -> str:
    """The recorded measurements as Markdown, newest folder first."""
    base = root / "docs" / "measurements"
    out = []
    for folder in sorted(
        (p for p in base.iterdir() if p.is_dir()), key=lambda p: p.name[-10:], reverse=True
    ):
        # a heading per folder: other pages link to results.md#measurements-<folder>
        out += [f"### Measurements {folder.name}", ""]
        for path in sorted(folder.glob("*.json")):
            out += _section(path, root)
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):  # noqa: ARG001 (the MkDocs hook signature)
    if MARKER not in markdown:
        return markdown
    root = pathlib.Path(config["config_file_path"]).parent
    return markdown.replace(MARKER, generate(root))
