import json

import jax.numpy as jnp
import pytest

from dmimo_jax import benchmarking


def test_a_record_carries_its_provenance_and_gives_its_rows_back(tmp_path):
    rows = [{"method": "a", "ms": 1.5}, {"method": "b", "ms": 2.0}]
    path = tmp_path / "sub" / "rows.json"
    benchmarking.write_json(path, rows, command="python benchmarks/x.py --quick")
    record = json.loads(path.read_text())
    assert record["command"] == "python benchmarks/x.py --quick"
    assert record["date"].endswith("+00:00") and record["machine"] == benchmarking.machine()
    assert benchmarking.read_rows(path) == rows
    # a dict of results keeps its keys beside the provenance (a script resumes from them)
    benchmarking.write_json(path, {"rows": rows, "worlds": {"k": [1]}})
    assert json.loads(path.read_text())["worlds"] == {"k": [1]}
    assert benchmarking.read_rows(path) == {"rows": rows, "worlds": {"k": [1]}}
    path.write_text(json.dumps(rows))  # a file without provenance reads as it is
    assert benchmarking.read_rows(path) == rows
    benchmarking.write_json(None, rows)  # no path: nothing written, no error


def test_timers_block_on_results_and_refuse_bad_counts():
    calls = []

    def run():
        calls.append(1)
        return jnp.arange(3.0) * len(calls)

    first, times = benchmarking.time_call(run, 3)
    assert len(times) == 3 and len(calls) == 4 and first >= 0
    out, seconds = benchmarking.timed_passes(run, 3)
    assert out.shape == (3,) and seconds >= 0 and len(calls) == 7
    summary = benchmarking.summarize([1.0, 3.0, 2.0])
    assert summary == {"median_s": 2.0, "std_s": 1.0, "min_s": 1.0}
    with pytest.raises(ValueError, match="repeats"):
        benchmarking.time_call(run, -1)
    with pytest.raises(ValueError, match="repeats"):
        benchmarking.timed_passes(run, 0)
    with pytest.raises(ValueError, match="times"):
        benchmarking.summarize([])
