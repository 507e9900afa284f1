"""Smoke runs of the example and benchmark scripts with tiny settings (they must not rot)."""

import runpy
import sys

import numpy as np
import pytest

from dmimo_jax.benchmarking import read_rows


def _run(path, argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", [path, *argv])
    monkeypatch.syspath_prepend("examples")
    monkeypatch.syspath_prepend("benchmarks")
    runpy.run_path(path, run_name="__main__")


def test_trace_seconds_names_the_compile_and_leaves_python_out(monkeypatch):
    """benchmarks/_common.trace_seconds (compile_time.py --phases, locator_latency.py
    --trace): the events of a compile, largest first, no Python frame, none longer than
    the traced call itself."""
    import time

    import jax
    import jax.numpy as jnp

    monkeypatch.syspath_prepend("benchmarks")
    from _common import trace_seconds

    # a program no run compiled before (a fresh constant in it): a compile, not a read of
    # the tests' persistent compilation cache (conftest.py)
    fresh = time.time_ns() % 1_000_003
    lowered = jax.jit(lambda x: jnp.sin(x) @ x + fresh).lower(jnp.ones((8, 8)))
    t0 = time.perf_counter()
    events = trace_seconds(lowered.compile, top=50)
    wall = time.perf_counter() - t0
    seconds = [s for _, s, _ in events]
    assert events and seconds == sorted(seconds, reverse=True)
    assert all(s >= 0 and n >= 1 for _, s, n in events)
    assert not any(name.startswith("$") for name, _, _ in events)
    assert any("compile" in name.lower() for name, _, _ in events)
    assert seconds[0] <= wall


@pytest.mark.slow
def test_mle_mismatch_example(tmp_path, monkeypatch):
    out = tmp_path / "mm"
    argv = ["--betas", "1.0", "1.1", "--powers-dbm", "-10", "--realizations", "8"]
    _run("examples/mle_mismatch.py", [*argv, "--spacing-div", "4", "--out", str(out)], monkeypatch)
    rows = read_rows(out.with_suffix(".json"))
    assert {(r["beta"], r["power_dbm"]) for r in rows} == {(1.0, -10.0), (1.1, -10.0)}
    by_beta = {r["beta"]: r for r in rows}
    # matched: RMSE at the PEB scale; 10% mismatch: a bias far above it
    assert by_beta[1.0]["rmse_m"] < 3 * by_beta[1.0]["peb_m"]
    assert by_beta[1.1]["rmse_m"] > 5 * by_beta[1.1]["peb_m"]


@pytest.mark.slow  # .ci/run runs these after the test command
def test_scaling_benchmark_small(tmp_path, monkeypatch):
    """benchmarks/scaling.py on the 10 m hall (four tiles): every column, the tiles' tables
    smaller than the all-AP one, every answer on the right lobe; the 20 m hall by its tiling
    only, with the local exponent between the two."""
    out = tmp_path / "scaling.json"
    argv = [
        "--sizes",
        "10",
        "--tiling-sizes",
        "20",
        "--num",
        "8",
        "--peb-points",
        "64",
        "--repeats",
        "1",
        "--json",
        str(out),
    ]
    _run("benchmarks/scaling.py", argv, monkeypatch)
    rows = read_rows(out)["rows"]
    keys = {"num_aps", "tiles", "k", "worst_ratio", "all_table_bytes", "tiled_table_bytes"}
    keys |= {"peb_dense_us", "peb_us", "tiled_ms_per_snapshot", "rmse_over_peb", "right_lobe"}
    assert len(rows) == 1 and keys <= set(rows[0])
    row = rows[0]
    assert row["num_aps"] == 17 and row["tiled_table_bytes"] < row["all_table_bytes"]
    assert row["worst_ratio"] <= 2.0 and row["right_lobe"] == 1.0
    (larger,) = read_rows(out)["larger"]
    assert larger["num_aps"] == 68 and larger["k"] == max(larger["k"], larger["need_p90"])
    assert larger["tiled_table_bytes"] > row["tiled_table_bytes"]
    (p,) = read_rows(out)["local_exponents"]["tiled_table_bytes"]
    want = np.log(larger["tiled_table_bytes"] / row["tiled_table_bytes"]) / np.log(4.0)
    assert p == pytest.approx(want)


@pytest.mark.slow  # .ci/run runs these after the test command
def test_egs_flops_benchmark_quick(tmp_path, monkeypatch):
    out = tmp_path / "egs.json"
    argv = ["--quick", "--batch", "16", "--realizations", "8", "--repeats", "1", "--json", str(out)]
    # plain and table rows at lambda/2 only: the plain search at lambda/4 (8x the points,
    # computed on the fly without XLA's passes) was half of this test's time
    _run("benchmarks/egs_flops.py", [*argv, "--divisors", "2"], monkeypatch)
    rows = read_rows(out)
    keys = {"method", "spacing_m", "n_points", "flops_paper", "flops_xla", "batch", "device"}
    keys |= {"ms_per_snapshot_single", "ms_per_snapshot_batched", "peak_rss_mb", "fine_rmse_m"}
    assert all(keys <= set(r) for r in rows)
    methods = {r["method"] for r in rows}
    assert {"plain", "table"} <= methods and any("hier" in m for m in methods)
    assert all("agree_with_lambda8" in r for r in rows if "hier" in r["method"])
    table = [r for r in rows if r["method"] == "table"]
    assert all(np.isfinite(r["fine_rmse_m"]) and r["fine_rmse_m"] < 1e-3 for r in table)


@pytest.mark.parametrize("bad", [["--realizations", "1"]])
def test_mle_mismatch_rejects_bad_arguments(bad, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="realizations"):
        _run("examples/mle_mismatch.py", [*bad, "--out", str(tmp_path / "x")], monkeypatch)


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    [
        (
            "examples/quickstart.py",
            ["--spacing-div", "0"],
            "--spacing-div must be an integer >= 1, got 0",
        ),
        (
            "examples/deployment.py",
            ["--spacing-div", "0"],
            "--spacing-div must be an integer >= 1, got 0",
        ),
        ("examples/deployment.py", ["--repeats", "0"], "--repeats must be an integer >= 1, got 0"),
        ("benchmarks/egs_flops.py", ["--divisors", "2", "0"], "--divisors must be an integer >= 1"),
        ("benchmarks/tracking_throughput.py", ["--quick", "--repeats", "0"], "--repeats must"),
        ("benchmarks/tracking_throughput.py", ["--mle-divisor", "0"], "--mle-divisor must"),
        ("examples/tracking.py", ["--single-divisor", "0"], "--single-divisor must"),
        ("benchmarks/calibration_batch.py", ["--sizes", "4", "0"], "--sizes must"),
        ("benchmarks/calibration_robustness.py", ["--batch", "0"], "--batch must"),
        ("benchmarks/train_throughput.py", ["--epochs", "1"], "--epochs must be an integer >= 2"),
        ("benchmarks/cell_classifier_size.py", ["--repeats", "0"], "--repeats must"),
    ],
)
def test_scripts_refuse_integer_options_below_their_minimum(
    script, argv, message, tmp_path, monkeypatch
):
    """The scripts' spacing, repeat and size options refuse a value below their minimum by
    name (benchmarking.check_options), never silently a default."""
    if script.startswith("examples/"):
        argv = [*argv, "--out", str(tmp_path / "x")]
    with pytest.raises(ValueError, match=message):
        _run(script, argv, monkeypatch)


@pytest.mark.slow  # .ci/run runs these after the test command
def test_gp_examples_quick(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend("examples")
    out = tmp_path / "ex"
    _run("examples/paper/fig2_gp_example.py", ["--num-train", "5", "--out", str(out)], monkeypatch)
    summary = read_rows(out.with_suffix(".json"))
    assert summary["slice_rmse_deg"] < 5.0 and len(summary["slice"]["g_true"]) == 300
    table = tmp_path / "table.json"
    argv = ["--quick", "--num-train", "8", "--num-test", "20", "--json", str(table)]
    _run("examples/paper/table1_materials.py", argv, monkeypatch)
    rows = read_rows(table)
    assert {r["material"] for r in rows} == {"wood", "plasterboard", "concrete", "glass", "metal"}
    keys = {"material", "convention", "model", "L", "power_dbm", "rmse_deg", "nlpd"}
    assert all(keys <= set(r) for r in rows)
    theory = {r["material"]: r["rmse_deg"] for r in rows if r["model"] == "theory"}
    assert all(v < 0.1 for v in theory.values())  # the true model sees only the noise


@pytest.mark.slow
def test_quickstart_tiny(tmp_path, monkeypatch):
    """The README's main job end to end at toy sizes: offline stage, cache, online stage."""
    out = tmp_path / "q.json"
    argv = ["--num-train", "20", "--num-test", "8", "--num-samples", "2000"]
    argv += ["--spacing-div", "4"]  # the MLE's table: lambda/8 is 3.9 M points, 7 s here
    argv += ["--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "o"), "--json", str(out)]
    _run("examples/quickstart.py", argv, monkeypatch)
    rows = {r["method"].split()[0]: r for r in read_rows(out)}
    keys = {"fine_rmse_m", "p99_m", "max_m", "ms_per_snapshot", "mean_peb_m", "wall_s"}
    assert all(keys <= set(r) for r in rows.values())
    assert rows["MLE"]["fine_rmse_m"] < 3 * rows["MLE"]["mean_peb_m"]
    # a 2000-sample classifier is unsure: the fallback screen still finds the basin
    learned = rows["cells"]
    assert learned["max_m"] < 1e-3
    assert 0.0 <= learned["fallback_fraction"] <= 1.0 and 0.0 <= learned["cell_recall"] <= 1.0
    # the figure is named by its options: another run's does not overwrite it
    assert (tmp_path / "o" / "error_cdf_concrete_-10dBm_L20.png").is_file()
    (spec,) = (tmp_path / "cache").glob("*/cells-*/model/spec.json")
    # the smoke run's own settings reach the offline stage (not the preset's 600k samples)
    assert read_rows(spec.parent.parent / "config.json")["num_samples"] == 2000


@pytest.mark.slow  # .ci/run runs these after the test command
def test_cell_screen_benchmark_quick(tmp_path, monkeypatch):
    out = tmp_path / "cs.json"
    _run(
        "benchmarks/cell_screen.py", ["--quick", "--repeats", "1", "--json", str(out)], monkeypatch
    )
    rows = read_rows(out)
    assert [r["rule"] for r in rows] == ["by cell", "gather"]  # 64 x 16 grouped, 32 x 16 not
    assert rows[0]["same_starts"] and rows[0]["ms_by_cell"] > 0 and rows[1]["ms_gather"] > 0


@pytest.mark.slow  # .ci/run runs these after the test command
def test_screen_product_benchmark_times_both_orientations(tmp_path, monkeypatch):
    out = tmp_path / "sp.json"
    argv = ["--aps", "3", "--points", "64", "--batches", "1", "20", "--calls", "2"]
    _run("benchmarks/screen_product.py", [*argv, "--json", str(out)], monkeypatch)
    rows = read_rows(out)
    assert [(r["aps"], r["points"], r["batch"]) for r in rows] == [(3, 64, 1), (3, 64, 20)]
    for r in rows:  # the same sums, to float32 rounding
        assert r["max_rel_diff"] < 1e-5 and r["skinny_ms"] > 0 and r["wide_ms"] > 0
        assert r["wide_over_skinny"] == pytest.approx(r["wide_ms"] / r["skinny_ms"])


@pytest.mark.slow  # .ci/run runs these after the test command
def test_popt_latency_benchmark_quick(tmp_path, monkeypatch):
    out = tmp_path / "lat.json"
    _run(
        "benchmarks/popt_latency.py",
        ["--repeats", "5", "--batch", "8", "--rounds", "2", "--json", str(out)],
        monkeypatch,
    )
    rows = read_rows(out)
    keys = {
        "method",
        "framework",
        "batch",
        "ms_median",
        "ms_std",
        "flops_formula",
        "flops_xla",
        "device",
    }
    assert all(keys <= set(r) for r in rows)
    assert {"POPT", "MLP", "HI"} <= {r["method"] for r in rows}
    popt = [r for r in rows if r["method"] == "POPT" and r["framework"] == "jax"]
    assert popt[0]["flops_formula"] == pytest.approx(81.1e6, rel=2e-3)
    assert 0.8 < popt[0]["flops_xla"] / popt[0]["flops_formula"] < 1.3
    assert len(popt[0]["floor_ratio_rounds"]) == 2 and popt[0]["floor_ratio_median"] > 0


@pytest.mark.slow  # .ci/run runs these after the test command
def test_receiver_jacobian_benchmark_quick(tmp_path, monkeypatch):
    """Both Jacobians reach the same fit (the compressed one is autodiff's to rounding)."""
    out = tmp_path / "jac.json"
    _run("benchmarks/receiver_jacobian.py", ["--quick", "--json", str(out)], monkeypatch)
    (row,) = read_rows(out)
    assert row["auto_status"] == row["autodiff_status"] == "converged"
    assert row["max_position_difference_m"] < 1e-9 and row["speedup"] > 0


@pytest.mark.slow  # .ci/run runs these after the test command
def test_calibration_batch_benchmark_quick(tmp_path, monkeypatch):
    """calibrate_many reaches the loop's calibrations (every deployment converged)."""
    out = tmp_path / "batch.json"
    _run("benchmarks/calibration_batch.py", ["--quick", "--json", str(out)], monkeypatch)
    (row,) = read_rows(out)
    assert row["deployments"] == row["converged"] == 4 and row["same_status"]
    assert row["max_position_difference_m"] < 1e-9 and row["speedup"] > 0


@pytest.mark.slow  # .ci/run runs these after the test command
def test_unlabeled_calibration_benchmark_quick(tmp_path, monkeypatch):
    out = tmp_path / "unl.json"
    argv = ["--quick", "--num-test", "32", "--json", str(out)]
    _run("benchmarks/unlabeled_calibration.py", argv, monkeypatch)
    rows = {(r["calibration"], r["num_unlabeled"]): r for r in read_rows(out)}
    labeled, both = rows[("labeled", 0)], rows[("labeled + unlabeled", 64)]
    assert 60 <= both["unlabeled_used"] <= 64
    assert both["exponent_stderr"] < 0.8 * labeled["exponent_stderr"]
    assert abs(both["reduced_chi2"] - 1) < 0.1 and both["fine_over_peb"] < 2.0


@pytest.mark.slow  # .ci/run runs these after the test command
def test_gp_table_benchmark_quick(tmp_path, monkeypatch):
    out = tmp_path / "table.json"
    argv = ["--num-train", "4", "--repeats", "1", "--json", str(out)]
    _run("benchmarks/gp_table.py", argv, monkeypatch)
    rows = read_rows(out)
    assert [r["method"] for r in rows] == [
        "mean (factorized)",
        "mean + variance",
        "mean node by node",
    ]
    assert all(r["median_s"] > 0 and r["training_inputs"] == 4 * 17 for r in rows)
    assert rows[0]["max_abs_diff_rad"] < 1e-9  # the factorized table is the node-by-node one


@pytest.mark.slow  # two tiny classifiers trained twice (~10 s)
def test_tile_training_benchmark_smoke(tmp_path, monkeypatch):
    out = tmp_path / "tiles.json"
    argv = ["--tiles", "2", "--samples", "3000", "--hidden", "32", "32", "--repeats", "1",
            "--json", str(out)]  # fmt: skip
    _run("benchmarks/tile_training.py", argv, monkeypatch)
    (row,) = read_rows(out)["rows"]
    assert row["tiles"] == 2 and row["one_by_one_s"] > 0 and row["together_s"] > 0
    assert row["speedup"] == pytest.approx(row["one_by_one_s"] / row["together_s"])


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_train_throughput_benchmark_quick(tmp_path, monkeypatch):
    out = tmp_path / "tt.json"
    argv = ["--steps", "2", "--epochs", "2", "--only", "POPT cpu-preset", "MLP", "--json", str(out)]
    _run("benchmarks/train_throughput.py", argv, monkeypatch)
    rows = read_rows(out)
    assert [r["method"] for r in rows] == ["POPT cpu-preset", "MLP"]
    for r in rows:
        assert r["samples_per_second"] > 0 and r["batch"] == 100
        # the preset's training time is its sample count over the measured throughput
        assert r["preset_hours"] == pytest.approx(
            r["preset_samples"] / r["samples_per_second"] / 3600
        )
    # the cpu preset trains 15 epochs on 8/9 of 60 000 samples
    assert rows[0]["preset_samples"] == pytest.approx(15 * 60_000 * 8 / 9)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_popt_region_scaling_tiny_and_resumable(tmp_path, monkeypatch):
    argv = ["--half-widths", "0.25", "--num-samples", "300", "--epochs", "1", "--num-test", "32"]
    argv += ["--out", str(tmp_path)]
    _run("examples/popt_region_scaling.py", argv, monkeypatch)
    (first,) = read_rows(tmp_path / "results.json")
    assert first["half_width_m"] == 0.25 and 0 <= first["within_10cm"] <= 1
    # the "predict the centre" baseline of a uniform cube: sqrt(3 x h^2 / 3) = h
    assert first["centre_rmse_m"] == pytest.approx(0.25, rel=0.2)
    _run("examples/popt_region_scaling.py", argv, monkeypatch)  # finished h: not retrained
    assert read_rows(tmp_path / "results.json") == [first]
    with pytest.raises(ValueError, match="half-widths"):
        _run("examples/popt_region_scaling.py", ["--half-widths", "2"], monkeypatch)


@pytest.mark.slow
def test_multipath_room_example_tiny(tmp_path, monkeypatch):
    out = tmp_path / "room"
    argv = ["--walls", "concrete", "--num-test", "24", "--num-train", "20", "--num-starts", "8"]
    argv += ["--out", str(out)]
    _run("examples/multipath_room.py", argv, monkeypatch)
    (res,) = read_rows(out.with_suffix(".json"))
    rows = {r["method"][:3]: r for r in res["rows"]}
    assert set(rows) == {"(a)", "(b)", "(c)", "(d)", "(e)", "(e'"}
    # the true room model and the calibrated one reach the PEB scale; two rays do not
    assert rows["(c)"]["fine_over_peb"] < 2.0 and rows["(e)"]["fine_over_peb"] < 2.0
    assert rows["(b)"]["fine_over_peb"] > 10.0
    assert out.with_suffix(".png").exists()


@pytest.mark.slow
def test_calibrate_material_example_tiny(tmp_path, monkeypatch):
    out = tmp_path / "cal"
    argv = ["--powers-dbm", "-10", "--num-train", "10", "--draws", "8", "--num-test", "16"]
    argv += ["--coverage-repeats", "1"]  # no assert on coverage: the NUTS run, once
    _run(
        "examples/calibrate_material.py", [*argv, "--betas", "1.05", "--out", str(out)], monkeypatch
    )
    res = read_rows(out.with_suffix(".json"))
    assert len(res["table"]) == 10  # 5 materials x 2 polarizations
    assert all(r["right_polarization"] for r in res["table"] if r["material"] != "metal")
    assert all(r["relative_error"] < 0.01 for r in res["table"])
    by = {r["method"]: r for r in res["region"]}
    assert by["calibrated MLE (L=50)"]["fine_over_peb"] < 1.5
    assert by["MLE beta=1.05"]["fine_over_peb"] > 3.0


@pytest.mark.slow
def test_ap_placement_example_tiny(tmp_path, monkeypatch):
    out = tmp_path / "ap"
    argv = ["--cases", "walls_mean", "--num-random", "4", "--steps", "30", "--num-starts", "1"]
    _run("examples/ap_placement.py", [*argv, "--num-eval", "200", "--out", str(out)], monkeypatch)
    (res,) = read_rows(out.with_suffix(".json"))
    assert res["optimized"]["mean_m"] < res["paper"]["mean_m"]
    assert res["optimized_min_separation_m"] >= 1.0 * (1 - 1e-3)
    assert out.with_suffix(".png").exists()


@pytest.mark.slow
def test_deployment_example_tiny(tmp_path, monkeypatch):
    """Calibration of a generated deployment, the learned stage on the calibrated room."""
    out = tmp_path / "dep.json"
    argv = ["--num-test", "16", "--num-samples", "2000", "--preset", "quick", "--spacing-div", "2"]
    argv += ["--no-baselines", "--repeats", "1"]
    argv += ["--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "d"), "--json", str(out)]
    _run("examples/deployment.py", argv, monkeypatch)
    result = read_rows(out)
    rows = {r["method"].split(" + ")[0]: r for r in result["rows"]}
    keys = {"fine_rmse_m", "fine_over_peb", "fine_over_rms_peb", "p99_m", "max_m"}
    assert all(keys | {"ms_per_snapshot"} <= set(r) for r in rows.values())
    # the RMS PEB is at least the mean PEB (equal only for equal PEBs)
    assert result["rms_peb_m"] > result["mean_peb_m"]
    assert all(r["fine_over_rms_peb"] < r["fine_over_peb"] for r in rows.values())
    # the calibrated room is the world to the noise; the nominal room misses by metres (the
    # MLE rows' lambda/2 grid is too coarse to trust here: the learned stage's cost gate
    # re-screens its misses over the whole region at lambda/4)
    room = result["calibration"]["room"]
    assert abs(room["reduced_chi2"] - 1) < 0.2
    positions = next(g for g in room["groups"] if g["group"] == "ap_positions")
    assert positions["max"] < 1e-4
    learned = rows["room calibrated"]
    assert learned["fine_rmse_m"] < 1e-3
    assert rows["surveyed nominal room (ITU guesses)"]["fine_rmse_m"] > 0.1
    assert {"cell_recall", "fallback_fraction", "recovered_fraction"} <= set(learned)
    assert (tmp_path / "cache").is_dir()


@pytest.mark.slow  # .ci/run runs these after the test command
def test_deployment_example_with_unlabeled_snapshots(tmp_path, monkeypatch):
    """The two-ray world recalibrated with unlabeled snapshots, the learned stage under it."""
    out = tmp_path / "dep.json"
    argv = ["--world", "two-ray", "--num-test", "16", "--num-samples", "2000"]
    argv += ["--preset", "quick", "--spacing-div", "4", "--no-baselines", "--unlabeled", "12"]
    argv += ["--repeats", "1"]
    argv += ["--cache", str(tmp_path / "cache"), "--out", str(tmp_path / "d"), "--json", str(out)]
    _run("examples/deployment.py", argv, monkeypatch)
    result = read_rows(out)
    assert result["num_unlabeled"] == 12
    table = result["calibration"]["two rays + 12 unlabeled"]
    assert 6 <= table["unlabeled_used"] <= 12  # lambda/4 MLE starts: a wrong lobe is left out
    assert table["unlabeled_error_median_m"] < 1e-3
    assert abs(table["reduced_chi2"] - 1) < 0.2
    methods = [r["method"] for r in result["rows"]]
    assert "two rays + 12 unlabeled (L=50) + MLE" in methods
    learned = next(r for r in result["rows"] if "learned" in r["method"])
    assert learned["method"].startswith("two rays + 12 unlabeled") and learned["max_m"] < 1e-3


@pytest.mark.slow
# without XLA's passes: its lambda/8 table computes slower, its 138 programs compile
# faster (44 s against 50 s alone)
def test_tracking_example_quick_and_resumable(tmp_path, monkeypatch):
    """One seed (seed 53's start just outside the region, which once stopped this run, is
    tests/test_tracking.py's fast test of a start moved onto the region); a resumed run
    that finds every power done writes the same JSON."""
    out = tmp_path / "trk"
    argv = ["--quick", "--powers-dbm", "-10", "--seed", "0", "--out", str(out)]  # locked
    # the single-snapshot stage's EGS at lambda/4: its lambda/8 table (3.9 M points) was
    # about 16 s of this test's 43 s (profiled without XLA's passes; 20.5 s after)
    argv += ["--single-divisor", "4"]
    _run("examples/tracking.py", argv, monkeypatch)
    rows = read_rows(out / "tracking.json")
    keys = {"power_dbm", "rmse_m", "pcrb_m", "mean_peb_m", "single_rmse_m"}
    keys |= {"single_outside_lobe_fraction", "lock_fraction", "lock_fraction_outage"}
    keys |= {"ms_per_update_per_ue"}
    assert all(keys <= set(r) for r in rows)
    high = next(r for r in rows if r["power_dbm"] == -10.0)
    assert high["rmse_m"] < 1.5 * high["pcrb_m"] and high["lock_fraction"] == 1.0
    assert (out / "tracking_trajectory.png").exists() and (out / "tracking_error.png").exists()
    # a second run with --resume keeps the rows it finds (nothing recomputed, same JSON)
    before = (out / "tracking.json").read_text()
    _run("examples/tracking.py", [*argv, "--resume"], monkeypatch)
    assert (out / "tracking.json").read_text() == before


@pytest.mark.slow  # without XLA's passes: every track bit-identical still (23 s against 38 s)
def test_reacquisition_benchmark_quick(tmp_path, monkeypatch):
    out = tmp_path / "reacq.json"
    _run("benchmarks/reacquisition.py", ["--quick", "--json", str(out)], monkeypatch)
    rows = read_rows(out)
    assert [r["setting"] for r in rows] == ["whole", "screen 2/256", "screen 1/256"]
    # the outage forces a re-acquisition, and the certified screen changes no track
    assert all(r["restarts"] >= 1 and r["identical_to_whole"] for r in rows)
    assert all(r["rmse_after_outage_m"] < 1e-3 for r in rows)


@pytest.mark.slow
def test_tracking_throughput_benchmark_quick(tmp_path, monkeypatch):
    out = tmp_path / "tt.json"
    argv = ["--quick", "--num-ues", "4", "--online-snapshots", "8", "--json", str(out)]
    # one timed call a row and the mle row's table at lambda/4, not the lambda/8 one (3.9 M
    # points): 68.5 s (profiled) -> 27.6 s alone, both changes together
    argv += ["--repeats", "1", "--mle-divisor", "4"]
    _run("benchmarks/tracking_throughput.py", argv, monkeypatch)
    rows = read_rows(out)
    assert {r["method"] for r in rows} == {
        "tracker",
        "tracker_always",
        "tracker_chord",
        "tracker_ekf",
        "online",
        "mle",
    }
    assert all({"method", "num_ues", "us_per_snapshot_per_ue"} <= set(r) for r in rows)
    assert all(r["rmse_m"] < 1e-3 for r in rows)


@pytest.mark.slow  # a tiny classifier trained, its Locator compiled for one batch size
def test_cell_classifier_size_benchmark_smoke_and_resume(tmp_path, monkeypatch):
    out = tmp_path / "ccs.json"
    argv = ["--seeds", "0", "--variants", "64x1", "--num-samples", "4000", "--num-test", "1",
            "--repeats", "5", "--json", str(out)]  # fmt: skip
    _run("benchmarks/cell_classifier_size.py", argv, monkeypatch)
    (row,) = read_rows(out)
    assert row["variant"] == "64x1" and row["hidden"] == [64, 64, 64] and row["epochs"] == 1
    # 17 APs -> 32 inputs, three layers of 64, the UE region's cells out
    assert row["parameters"] > 32 * 64 + 2 * 64 * 64
    assert sum(row["statuses"].values()) == 1 and row["recall"] in (0.0, 1.0)
    assert row["rmse_over_peb"] > 0 and row["ms_batch1"] > 0 and row["ms_batch256"] > 0
    # a second call with the same record skips the row it holds (no training, no new row)
    _run("benchmarks/cell_classifier_size.py", argv, monkeypatch)
    assert read_rows(out) == [row]
    with pytest.raises(ValueError, match="--variants"):
        _run("benchmarks/cell_classifier_size.py", ["--variants", "wide"], monkeypatch)
