"""Timing JAX work and recording measurements, for the example and benchmark scripts and for
a user's own studies.

JAX dispatches asynchronously, so every timer here blocks on the result
(:func:`jax.block_until_ready`) and keeps the first call (tracing and compilation) apart from
the timed calls. A measurement is written as a JSON record with its provenance (the command,
the UTC date and the machine) around the rows; the documentation's Results page is generated
from these records.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from dmimo_jax._checks import check_int, is_int

PROVENANCE = ("command", "date", "machine")
"""The keys a record adds around its rows (:func:`write_json`)."""

__all__ = [
    "PROVENANCE",
    "check_options",
    "machine",
    "plain_json",
    "read_rows",
    "summarize",
    "time_call",
    "timed_passes",
    "write_json",
]


def check_options(minimum: int = 1, /, **options: int | Sequence[int]) -> None:
    """``ValueError`` naming the command-line option (``spacing_div`` is ``--spacing-div``)
    unless each value, or each element of a sequence value, is an integer >= ``minimum``; a
    script calls it on its parsed options (``check_options(spacing_div=args.spacing_div)``),
    so a 0 is refused by name and never becomes a default or an empty loop.

    >>> check_options(repeats=3, divisors=[2, 4])
    >>> check_options(2, epochs=1)
    Traceback (most recent call last):
    ...
    ValueError: --epochs must be an integer >= 2, got 1
    """
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if not values or not all(is_int(v, minimum=minimum) for v in values):
            raise ValueError(f"{flag} must be an integer >= {minimum}, got {value!r}")


def time_call(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float]]:
    """``fn()`` once (compile and run: the first-call seconds), then ``repeats`` timed calls,
    each blocked on its result: (first-call seconds, the list of timed seconds)."""
    check_int("repeats", repeats)
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return first, times


def timed_passes(run: Callable[[], Any], repeats: int) -> tuple[Any, float]:
    """``run()`` (compiled beforehand) ``repeats`` times, each blocked on: (the median pass's
    result, its seconds; the upper of the two middle passes for an even count). Timing every
    row of a table this way in one run compares passes that saw the machine alike."""
    check_int("repeats", repeats, minimum=1)
    passes = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(run())
        passes.append((time.perf_counter() - t0, out))
    seconds, out = sorted(passes, key=lambda p: p[0])[len(passes) // 2]
    return out, seconds


def summarize(times: Sequence[float]) -> dict[str, float]:
    """Median, standard deviation and minimum of a list of seconds."""
    if len(times) == 0:
        raise ValueError("times: expected at least one duration")
    bad = [t for t in times if not (isinstance(t, int | float | np.number) and np.isfinite(t))]
    if bad:
        raise ValueError(f"times: expected finite real seconds, got {bad[0]!r}")
    times = [float(t) for t in times]
    return {
        "median_s": statistics.median(times),
        "std_s": statistics.stdev(times) if len(times) > 1 else 0.0,
        "min_s": min(times),
    }


def machine() -> dict[str, Any]:
    """What ran the measurement: JAX's first device, the CPU count, the platform and the
    versions of Python and JAX."""
    d = jax.devices()[0]
    return {
        "device": f"{d.platform}:{getattr(d, 'device_kind', '')}".rstrip(":"),
        "cpus": os.cpu_count(),
        "platform": platform.platform(terse=True),
        "python": platform.python_version(),
        "jax": jax.__version__,
    }


def write_json(path: str | pathlib.Path | None, rows: Any, *, command: str | None = None) -> None:
    """Write a measurement record to ``path`` (nothing when ``path`` is None): the provenance
    ``command`` (default: this process's command line), ``date`` (UTC) and ``machine``
    (:func:`machine`), with the rows under ``"rows"`` (a list) or, for a dict of results,
    its own keys beside them (so a script that resumes from its record reads its keys back)."""
    if path is None:
        return
    path = pathlib.Path(path)
    if isinstance(rows, dict):
        clash = sorted(set(rows) & set(PROVENANCE))
        if clash:
            raise ValueError(
                f"rows: a dict of results may not use the provenance keys {clash} "
                f"(reserved: {list(PROVENANCE)}: they would be lost on read_rows); rename them"
            )
    rows = plain_json(rows, "rows")
    provenance = {
        "command": command or "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
    }
    record = provenance | (dict(rows) if isinstance(rows, dict) else {"rows": rows})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
    print(f"wrote {path}")


def plain_json(value: Any, where: str = "value") -> Any:
    """``value`` with NumPy and JAX scalars and arrays made plain Python (an integer stays an
    integer, a bool a bool, an array a nested list), so a record reads back as it was
    written. ``where`` names the value in the error.

    Raises:
        TypeError: a complex number, or a value JSON cannot hold, naming the row and key.
    """
    if isinstance(value, dict):
        return {str(k): plain_json(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic | np.ndarray | jax.Array):
        a = np.asarray(value)
        if np.iscomplexobj(a):
            raise TypeError(
                f"{where}: a complex value cannot be recorded; store its real and imaginary parts"
            )
        if a.dtype.kind not in "biuf":
            raise TypeError(f"{where}: an array of {a.dtype} cannot be recorded")
        return a.tolist()
    if isinstance(value, complex):
        raise TypeError(
            f"{where}: a complex value cannot be recorded; store its real and imaginary parts"
        )
    raise TypeError(f"{where}: {type(value).__name__} cannot be recorded as JSON")


def read_rows(path: str | pathlib.Path) -> Any:
    """The rows of a record written by :func:`write_json` (its ``"rows"``, or the dict of
    results without the provenance keys); a file without provenance is returned as it is."""
    path = pathlib.Path(path)
    try:
        record = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not a JSON record (truncated or corrupt): {e}") from None
    if isinstance(record, dict) and set(PROVENANCE) <= set(record):
        if set(record) == {*PROVENANCE, "rows"}:
            return record["rows"]
        return {k: v for k, v in record.items() if k not in PROVENANCE}
    return record
