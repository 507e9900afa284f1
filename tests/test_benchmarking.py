import json

import jax.numpy as jnp
import numpy as np
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


def test_options_below_their_minimum_are_refused_by_their_flag():
    benchmarking.check_options(repeats=1, sizes=[1, 8], spacing_div=np.int64(4))
    benchmarking.check_options(0, steps=0)
    for options, message in [
        (dict(spacing_div=0), "--spacing-div must be an integer >= 1, got 0"),
        (dict(sizes=[4, 0]), r"--sizes must be an integer >= 1, got \[4, 0\]"),
        (dict(sizes=[]), "--sizes must be"),
        (dict(repeats=2.0), "--repeats must be"),
        (dict(repeats=True), "--repeats must be"),
    ]:
        with pytest.raises(ValueError, match=message):
            benchmarking.check_options(**options)
    with pytest.raises(ValueError, match="--epochs must be an integer >= 2, got 1"):
        benchmarking.check_options(2, epochs=1)


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


def test_records_read_back_as_written_or_are_refused_by_name(tmp_path):
    import numpy as np

    path = tmp_path / "r.json"
    rows = [{"n": np.int64(5), "ok": np.bool_(True), "x": np.float32(0.5), "v": np.arange(3)}]
    benchmarking.write_json(path, rows + [{"date": "mine", "machine": "theirs"}])
    back = benchmarking.read_rows(path)
    assert back[0] == {"n": 5, "ok": True, "x": 0.5, "v": [0, 1, 2]}
    assert type(back[0]["n"]) is int and type(back[0]["ok"]) is bool
    assert back[1] == {"date": "mine", "machine": "theirs"}  # inside a row: kept
    with pytest.raises(ValueError, match=r"provenance keys \['date'\]"):
        benchmarking.write_json(path, {"date": "mine", "rmse": 1.0})
    with pytest.raises(TypeError, match=r"rows\[0\]\['z'\]: a complex"):
        benchmarking.write_json(path, [{"z": 1 + 2j}])
    with pytest.raises(TypeError, match=r"rows\[1\]\['w'\]: a complex"):
        benchmarking.write_json(path, [{}, {"w": np.ones(2, complex)}])
    with pytest.raises(TypeError, match=r"rows\[0\]\['f'\]: object cannot"):
        benchmarking.write_json(path, [{"f": object()}])
    path.write_text(path.read_text()[:-20])  # truncated
    with pytest.raises(ValueError, match="r.json: not a JSON record"):
        benchmarking.read_rows(path)
    with pytest.raises(ValueError, match="times: expected finite"):
        benchmarking.summarize([1.0, float("nan")])
