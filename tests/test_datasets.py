"""The Techtile loader, the residual field and the coherent search, on files the tests write.

The real measurements are not the project's to ship: every file here is generated in the
format of ``../shared/data/techtile`` (NetCDF3 via scipy, YAML geometry).
"""

import dataclasses
import runpy
import sys
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml
from scipy.io import netcdf_file

from dmimo_jax.benchmarking import read_rows
from dmimo_jax.calibration import (
    confirmed_by_neighbours,
    fit_residual_field,
    offsets_closed_form,
    residual_phasors,
    self_train_field,
)
from dmimo_jax.datasets import (
    list_experiments,
    load_techtile,
    techtile_room_model,
    techtile_scene,
)
from dmimo_jax.estimators import (
    coherent_peaks,
    coherent_refine,
    coherent_search,
    coherent_table,
    expected_phasor,
    knn_locate,
    make_grid,
)
from dmimo_jax.physics import ImageSourceModel

FREQ = 920e6
LAM = 299_792_458.0 / FREQ
TILES = ["A05", "A07", "B06", "C05", "C08", "D06", "E05", "E09"]


def _antennas(tiles):
    """Ceiling tiles on a 1.2 m x 0.6 m raster; channel 1 at the listed point, channel 0 0.3 m off."""
    out = []
    for t in tiles:
        row, col = "ABCDEFG".index(t[0]), int(t[1:])
        x, y = 7.85 - 1.2 * row, 0.66 + 0.6 * (col - 5)
        out.append(
            {
                "tile": t,
                "channels": [
                    {"ch": 0, "x": x - 0.3, "y": y, "z": 2.4, "vx": 0, "vy": 0, "vz": -1},
                    {"ch": 1, "x": x, "y": y, "z": 2.4, "vx": 0, "vy": 0, "vz": -1},
                ],
            }
        )
    return out


def _positions(num, seed):
    """A 5 cm raster walk in a 0.6 m patch near the room's centre, z ~ 0.74 m."""
    rng = np.random.default_rng(seed)
    g = np.stack(np.meshgrid(np.arange(13), np.arange(13), indexing="ij"), -1).reshape(-1, 2)
    pick = g[rng.permutation(len(g))[:num]] * 0.05
    return np.c_[4.0 + pick[:, 0], 1.6 + pick[:, 1], 0.74 + 0.002 * rng.standard_normal(num)]


def write_folder(
    folder,
    experiments,
    *,
    tiles=TILES,
    geometry_tiles=None,
    nan_rows=(),
    held_rows=(),
    offsets_seed=0,
    residual_std=0.0,
):
    """Write csi_<id>.nc for each {id: num} plus the geometry files; returns the truth."""
    folder.mkdir(parents=True, exist_ok=True)
    geo = _antennas(tiles if geometry_tiles is None else geometry_tiles)
    (folder / "techtile_antenna_locations.yml").write_text(yaml.safe_dump({"antennes": geo}))
    room = {
        "room": {
            "dimensions": {"length_x_m": 8.0, "width_y_m": 4.0, "height_z_m": 2.4},
            "materials": {"walls": "plywood", "floor": "wood", "ceiling": "wood"},
        }
    }
    (folder / "techtile_room.yml").write_text(yaml.safe_dump(room))
    ap = np.array(
        [[c["x"], c["y"], c["z"]] for a in _antennas(tiles) for c in a["channels"] if c["ch"] == 1]
    )
    offsets = np.random.default_rng(offsets_seed).uniform(-np.pi, np.pi, len(tiles))
    truth = {}
    for k, (exp, num) in enumerate(experiments.items()):
        x = _positions(num, k)
        for i in held_rows:  # a motion-capture frame held: the previous row's position
            x[i] = x[i - 1]
        rng = np.random.default_rng(100 + k)
        d = np.linalg.norm(x[:, None] - ap[None], axis=-1)
        phase = 2 * np.pi * d / LAM + offsets + rng.uniform(-np.pi, np.pi, (num, 1))
        phase = phase + residual_std * rng.standard_normal(phase.shape)
        csi = (0.01 + 0.005 * rng.random(phase.shape)) * np.exp(1j * phase)
        csi[list(nan_rows), 2] = np.nan
        with netcdf_file(folder / f"csi_{exp}.nc", "w") as nc:
            nc.createDimension("experiment", 1)
            nc.createDimension("cycle", num)
            nc.createDimension("host", len(tiles))
            nc.createDimension("name_len", 3)
            nc.createDimension("id_len", len(exp))
            v = nc.createVariable("cycle_id", "i4", ("cycle",))
            v[:] = np.arange(num) + 1000
            v = nc.createVariable("hostname", "S1", ("host", "name_len"))
            v[:] = np.array([list(t) for t in tiles], "S1")
            v = nc.createVariable("experiment_id", "S1", ("experiment", "id_len"))
            v[:] = np.array([list(exp)], "S1")
            for name, val in (("csi_real", csi.real), ("csi_imag", csi.imag)):
                v = nc.createVariable(name, "f8", ("experiment", "cycle", "host"))
                v[:] = val[None]
            for a, col in zip("xyz", x.T, strict=True):
                v = nc.createVariable(f"rover_{a}", "f8", ("experiment", "cycle"))
                v[:] = col[None]
        truth[exp] = {"x": x, "phase": phase, "csi": csi}
    return {"ap": ap, "offsets": offsets, "experiments": truth}


def test_loader_conventions_and_nan_rows(tmp_path):
    truth = write_folder(tmp_path, {"EXP901": 30, "EXP902": 12}, nan_rows=(3, 7))
    assert list_experiments(tmp_path) == ["EXP901", "EXP902"]
    d = load_techtile(tmp_path, "EXP901")
    t = truth["experiments"]["EXP901"]
    keep = np.setdiff1d(np.arange(30), [3, 7])
    assert d.num_dropped == 2 and d.num_snapshots == 28
    np.testing.assert_array_equal(d.cycles, 1000 + keep)
    np.testing.assert_allclose(d.positions, t["x"][keep])
    np.testing.assert_allclose(d.ap_positions, truth["ap"])
    np.testing.assert_allclose(d.ap_orientations, np.tile([0, 0, -1.0], (len(TILES), 1)))
    assert d.hosts == tuple(TILES) and d.wavelength == pytest.approx(LAM)
    # sign: the files' phase is +2 pi d / lambda, the package's LoS mean; the loader wraps it
    np.testing.assert_allclose(np.exp(1j * d.phases), np.exp(1j * t["phase"][keep]), atol=1e-12)
    assert np.all((d.phases >= -np.pi) & (d.phases < np.pi + 1e-12))
    scene = techtile_scene(d)
    z = residual_phasors(
        ImageSourceModel(scene.replace(ap_phase_offsets=truth["offsets"]), []),
        d.positions,
        d.phases,
    )
    np.testing.assert_allclose(
        np.angle(np.asarray(z) * np.conj(np.asarray(z[:, :1]))), 0, atol=1e-9
    )
    # a flipped sign would not fit: the opposite convention leaves residuals of radians
    zf = residual_phasors(ImageSourceModel(scene, []), d.positions, -d.phases)
    assert np.std(np.angle(np.asarray(zf) * np.conj(np.asarray(zf[:, :1])))) > 0.5
    np.testing.assert_allclose(d.amplitudes, np.abs(t["csi"][keep]))
    np.testing.assert_allclose(d.csi, t["csi"][keep], rtol=1e-12)  # the complex CSI as written


def test_held_labels_are_the_exact_repeats_of_the_previous_position(tmp_path):
    """A position equal bit for bit to the previous kept one is a held frame; one a tenth of
    a millimetre off (a still rover's jitter) is not; a dropped row between does not hide a
    repeat."""
    write_folder(tmp_path, {"EXP901": 20}, held_rows=(5, 12, 13), nan_rows=(9,))
    d = load_techtile(tmp_path, "EXP901")
    kept = np.setdiff1d(np.arange(20), [9])
    np.testing.assert_array_equal(np.flatnonzero(d.held_labels), np.searchsorted(kept, [5, 12, 13]))
    assert d.held_labels.shape == (19,) and d.held_labels.dtype == bool
    x = d.positions.copy()
    x[5, 1] += 1e-4  # a still rover's jitter: measured, not held
    np.testing.assert_array_equal(
        np.flatnonzero(dataclasses.replace(d, positions=x).held_labels), [11, 12]
    )


def test_a_frame_held_after_a_dropped_cycle_is_a_held_label(tmp_path):
    """Cycle 10 repeats cycle 9's position, and cycle 9 is dropped (a NaN CSI entry): the
    frame is still held (compared with the kept cycle 8 it looked measured)."""
    write_folder(tmp_path, {"EXP902": 20}, held_rows=(10,), nan_rows=(9,))
    d = load_techtile(tmp_path, "EXP902")
    kept = np.setdiff1d(np.arange(20), [9])
    np.testing.assert_array_equal(np.flatnonzero(d.held_labels), np.searchsorted(kept, [10]))


def test_loader_errors(tmp_path):
    write_folder(tmp_path / "a", {"EXP901": 10}, geometry_tiles=TILES[:-1])
    with pytest.raises(ValueError, match="E09"):
        load_techtile(tmp_path / "a", "EXP901")
    write_folder(tmp_path / "b", {"EXP901": 10})
    with pytest.raises(ValueError, match="EXP777"):
        load_techtile(tmp_path / "b", "EXP777")
    with pytest.raises(ValueError, match="folder"):
        load_techtile(tmp_path / "nothing", "EXP901")
    with pytest.raises(ValueError, match="channel 3"):
        load_techtile(tmp_path / "b", "EXP901", channel=3)
    (tmp_path / "b" / "techtile_room.yml").unlink()
    with pytest.raises(ValueError, match="techtile_room.yml"):
        load_techtile(tmp_path / "b", "EXP901")
    write_folder(tmp_path / "c", {"EXP901": 4}, nan_rows=(0, 1, 2, 3))
    with pytest.raises(ValueError, match="no snapshot"):
        load_techtile(tmp_path / "c", "EXP901")
    with netcdf_file(tmp_path / "c" / "csi_EXP902.nc", "w") as nc:
        nc.createDimension("host", 1)
        nc.createDimension("name_len", 3)
        v = nc.createVariable("hostname", "S1", ("host", "name_len"))
        v[:] = np.array([list("A05")], "S1")
    with pytest.raises(ValueError, match="csi_real"):
        load_techtile(tmp_path / "c", "EXP902")


def test_scene_and_room_from_files(tmp_path):
    write_folder(tmp_path, {"EXP901": 20})
    d = load_techtile(tmp_path, "EXP901")
    scene = techtile_scene(d, phase_noise_std=0.05)
    np.testing.assert_allclose(scene.ue_low, d.positions.min(0))
    dist = np.linalg.norm(d.positions[:, None] - d.ap_positions[None], axis=-1)
    i = np.unravel_index(np.argmin(np.abs(dist - np.median(dist))), dist.shape)
    std = float(jnp.sqrt(ImageSourceModel(scene, []).variance(d.positions[i[0]])[i[1]]))
    assert std == pytest.approx(0.05, rel=0.02)
    room = techtile_room_model(scene)
    assert [r.name for r in room.reflectors] == [
        "floor",
        "wall_x0",
        "wall_x1",
        "wall_y0",
        "wall_y1",
    ]
    assert np.all(np.isfinite(np.asarray(room.mean(d.positions[0]))))
    with pytest.raises(ValueError, match="phase_noise_std"):
        techtile_scene(d, phase_noise_std=0.0)


def _labeled(tmp_path, residual_std=0.0):
    truth = write_folder(tmp_path, {"EXP901": 120}, residual_std=residual_std)
    d = load_techtile(tmp_path, "EXP901")
    los = ImageSourceModel(techtile_scene(d), [])
    return d, truth, los


def test_offsets_closed_form_on_files(tmp_path):
    d, truth, los = _labeled(tmp_path, residual_std=0.8)
    off = np.asarray(offsets_closed_form(los, d.positions[:60], d.phases[:60]))
    err = np.angle(np.exp(1j * (off - truth["offsets"] - (off[0] - truth["offsets"][0]))))
    # 60 snapshots x 8 APs of 0.8 rad noise: each offset to ~0.8 / sqrt(60) ~ 0.1 rad
    assert np.max(np.abs(err)) < 0.35


def test_coherent_search_and_knn(tmp_path):
    d, truth, los = _labeled(tmp_path)
    model = ImageSourceModel(los.scene.replace(ap_phase_offsets=truth["offsets"]), [])
    x, r = d.positions, d.phases
    low, high = x.min(0) - 0.1, x.max(0) + 0.1
    z = float(np.median(x[:, 2]))
    low[2], high[2] = z - 0.005, z + 0.005
    grid = make_grid(low, high, 0.01)
    res = coherent_search(model, grid, r[:20])
    err = np.linalg.norm(np.asarray(res.x)[:, :2] - x[:20, :2], axis=1)
    assert np.max(err) < 4e-3  # 2 mm local stage; heights differ by ~2 mm from z
    assert np.all(np.asarray(res.score) > 0.99)
    same = coherent_search(model, grid, r[:20], np.ones((20, len(TILES))))
    np.testing.assert_allclose(same.x, res.x)
    # the grid stage tabulated beforehand: the same positions and scores, chunks or not
    table = coherent_table(model, grid, chunk_size=1000)
    assert table.rows.shape == (-(-grid.size // 1000), 1000, 2 * len(TILES))
    tab = coherent_search(model, grid, r[:20], table=table)
    np.testing.assert_array_equal(tab.x, res.x)
    np.testing.assert_allclose(tab.score, res.score, rtol=1e-12)
    coarse = coherent_search(model, grid, r[:20], refine_steps=1, table=coherent_table(model, grid))
    np.testing.assert_array_equal(coarse.x, coherent_search(model, grid, r[:20], refine_steps=1).x)
    other = make_grid(low, high + 0.01, 0.01)
    with pytest.raises(ValueError, match="table must be"):
        coherent_search(model, other, r[:2], table=table)
    with pytest.raises(ValueError, match="table must be"):
        coherent_search(model, grid, r[:2], table=table.rows)
    with pytest.raises(ValueError, match="of this model"):
        coherent_search(los, grid, r[:2], table=table)  # the offsets differ
    with pytest.raises(ValueError, match="grid"):
        coherent_table(model, "grid")
    # a wrong offset model misses by far
    bad = coherent_search(los, grid, r[:20])
    assert np.median(np.linalg.norm(np.asarray(bad.x)[:, :2] - x[:20, :2], axis=1)) > 0.03
    with pytest.raises(ValueError, match="amplitudes"):
        coherent_search(model, grid, r[:2], -np.ones((2, len(TILES))))
    with pytest.raises(ValueError, match="amplitudes"):
        coherent_search(model, grid, r[:2], np.ones((3, len(TILES))))
    with pytest.raises(ValueError, match="grid"):
        coherent_search(model, "grid", r[:2])
    # k-NN returns a labeled snapshot's own position, whatever its CPO
    np.testing.assert_allclose(knn_locate(x[:50], r[:50], r[10:12] + 1.0), x[10:12], atol=1e-12)
    np.testing.assert_allclose(knn_locate(x[:50], r[:50], r[10], k=1)[0], x[10], atol=1e-12)
    with pytest.raises(ValueError, match="k must"):
        knn_locate(x[:5], r[:5], r[10], k=6)
    with pytest.raises(ValueError, match="same snapshots"):
        knn_locate(x[:5], r[:4], r[10])


def test_coherent_peaks_are_the_local_maxima_and_refine_like_the_search(tmp_path):
    d, truth, _ = _labeled(tmp_path)
    model = ImageSourceModel(techtile_scene(d).replace(ap_phase_offsets=truth["offsets"]), [])
    x, r = d.positions, d.phases
    z = float(np.median(x[:, 2]))
    grid = make_grid([3.9, 1.5, z - 0.005], [4.8, 2.4, z + 0.005], 0.01)  # 8 APs: many lobes
    peaks = coherent_peaks(model, grid, r[:6], num_peaks=5, separation=3, batch_size=4)
    assert peaks.x.shape == (6, 5, 3) and peaks.score.shape == (6, 5)
    # the grid score everywhere, by brute force in float64: the peaks are its 5 largest
    # local maxima (no point within 3 cells scores higher), best first
    pts = (
        np.asarray(grid.low)[:2]
        + (np.stack(np.mgrid[: grid.shape[0], : grid.shape[1]], -1) + 0.5) * 0.01
    )
    full = np.concatenate([pts, np.full((*pts.shape[:2], 1), z)], -1).reshape(-1, 3)
    h = np.asarray(jax.vmap(partial(expected_phasor, model))(jnp.asarray(full)))  # (P, M)
    score = np.abs(np.exp(1j * r[:6]) @ h.T) / len(TILES)  # (6, P)
    for k in range(6):
        s = score[k].reshape(grid.shape[:2])
        pad = np.pad(s, 3, constant_values=-np.inf)
        win = np.lib.stride_tricks.sliding_window_view(pad, (7, 7)).max(axis=(2, 3))
        ij = np.argwhere(s >= win - 1e-6)
        expected = np.sort(s[ij[:, 0], ij[:, 1]])[::-1][:5]
        # each peak is a grid point, a local maximum and one of the 5 largest, best first;
        # two neighbours that tie to float32 rounding may go either way on another backend
        # (a GPU chose the next grid point), so scores are compared, not which of the two
        got = np.asarray(peaks.x[k])[:, :2]
        at = np.rint((got - np.asarray(grid.low)[:2]) / 0.01 - 0.5).astype(int)
        np.testing.assert_allclose(got, pts[at[:, 0], at[:, 1]], atol=1e-9)
        got_score = s[at[:, 0], at[:, 1]]
        assert np.all(got_score >= win[at[:, 0], at[:, 1]] - 1e-5)
        np.testing.assert_allclose(got_score, expected, atol=1e-5)
        np.testing.assert_allclose(np.asarray(peaks.score[k]), expected, atol=1e-5)
    # the best peak is the search's grid stage; the true position's lobe is among the peaks
    coarse = coherent_search(model, grid, r[:6], refine_steps=1)
    np.testing.assert_array_equal(peaks.x[:, 0], coarse.x)
    near = np.min(np.linalg.norm(np.asarray(peaks.x)[:, :, :2] - x[:6, None, :2], axis=2), axis=1)
    assert np.all(near < 0.01)
    # refined from a peak: the search's own local stage
    np.testing.assert_array_equal(
        coherent_refine(model, grid, peaks.x[:, 0], r[:6]).x, coherent_search(model, grid, r[:6]).x
    )
    # a grid too small for K maxima: the missing ones repeat the best, at -inf
    small = make_grid([4.0, 1.6, z - 0.005], [4.04, 1.64, z + 0.005], 0.01)
    few = coherent_peaks(model, small, r[:2], num_peaks=4, separation=3)
    assert np.all(np.isfinite(few.score[:, 0])) and np.all(few.score[:, 1:] == -np.inf)
    np.testing.assert_array_equal(few.x[:, 1:], np.repeat(few.x[:, :1], 3, axis=1))
    with pytest.raises(ValueError, match="num_peaks"):
        coherent_peaks(model, small, r[:2], num_peaks=17)
    with pytest.raises(ValueError, match="separation"):
        coherent_peaks(model, grid, r[:2], separation=0)
    with pytest.raises(ValueError, match="one position per snapshot"):
        coherent_refine(model, grid, peaks.x[:3, 0], r[:6])


def _smooth_field(x):
    """(N, M) a smooth per-AP phase perturbation the LoS model lacks: 1.2 rad, ~0.5 m period."""
    k = np.array([[np.cos(a), np.sin(a)] for a in np.linspace(0, np.pi, len(TILES))]) * 12.0
    return 1.2 * np.sin(x[:, :2] @ k.T + np.arange(len(TILES)))


def test_residual_field_learns_a_smooth_perturbation(tmp_path):
    """A smooth per-AP phase field the LoS model lacks: the field recovers it between labels."""
    d, truth, los = _labeled(tmp_path)
    model = ImageSourceModel(los.scene.replace(ap_phase_offsets=truth["offsets"]), [])
    r = np.angle(np.exp(1j * (d.phases + _smooth_field(d.positions))))
    train, test = slice(0, 100), slice(100, None)
    fitted = fit_residual_field(model, d.positions[train], r[train], length_scale=0.15, noise=0.01)

    def rms(m):
        z = np.asarray(residual_phasors(m, d.positions[test], r[test]))
        return float(
            np.sqrt(
                np.mean(
                    np.angle(
                        z * np.conj(z.mean(1, keepdims=True) / np.abs(z.mean(1, keepdims=True)))
                    )
                    ** 2
                )
            )
        )

    assert rms(model) > 0.6
    assert rms(fitted) < 0.3 * rms(model)
    v_base = jax.vmap(model.variance)(d.positions[test])
    v = jax.vmap(fitted.variance)(d.positions[test])
    assert np.all(np.asarray(v) >= np.asarray(v_base))
    far = jnp.array([1.0, 1.0, 0.74])  # 3 m from every label: the prior, the mean phasor's
    m = len(TILES)  # spread (|E exp(j 1.2 sin)| = J0(1.2) = 0.67 -> 0.8 rad^2)
    prior = np.abs(np.asarray(fitted.prior[:m] + 1j * fitted.prior[m:]))
    extra = np.asarray(fitted.variance(far) - model.variance(far))
    np.testing.assert_allclose(extra, -2 * np.log(prior), rtol=1e-6)
    assert np.all(extra > 0.4)
    # a mask conditions on a subset at a fixed shape: the same field as the subset's
    mask = np.arange(100) % 3 != 0
    masked = fit_residual_field(model, d.positions[train], r[train], mask=mask)
    subset = fit_residual_field(model, d.positions[train][mask], r[train][mask])
    np.testing.assert_allclose(
        jax.vmap(masked.phasor)(d.positions[test]),
        jax.vmap(subset.phasor)(d.positions[test]),
        atol=1e-9,
    )
    with pytest.raises(ValueError, match="mask"):
        fit_residual_field(model, d.positions[train], r[train], mask=mask[:50])
    with pytest.raises(ValueError, match="mask"):
        fit_residual_field(model, d.positions[:5], r[:5], mask=np.array([1, 0, 0, 0, 0], bool))
    with pytest.raises(ValueError, match="length_scale"):
        fit_residual_field(model, d.positions[train], r[train], length_scale=-1.0)
    with pytest.raises(ValueError, match="same L"):
        fit_residual_field(model, d.positions[:5], r[:4])


def test_confirmed_by_neighbours():
    x = np.array([[0, 0, 0.7], [0.05, 0, 0.7], [1, 0, 0.7], [1.05, 0, 0.7], [1.05, 0, 0.7]])
    r = np.random.default_rng(0).uniform(-np.pi, np.pi, (5, 8))
    r[4] = r[3] + 0.3  # a still UE (and a common phase): coherence 1
    t = np.array([0, 1, 2, 10, 11])
    # 0-1 moved 5 cm in one step; 1-2 jumped 95 cm; 2-3 are 8 steps apart; 3-4 did not move
    np.testing.assert_array_equal(confirmed_by_neighbours(x, r, t), [1, 1, 0, 0, 0])
    np.testing.assert_array_equal(
        confirmed_by_neighbours(x, r, t, max_coherence=1.0), [1, 1, 0, 1, 1]
    )
    np.testing.assert_array_equal(confirmed_by_neighbours(x, r, t, max_gap=8), [1, 1, 1, 1, 0])
    np.testing.assert_array_equal(confirmed_by_neighbours(x, r, t, max_step=0.04), [0] * 5)
    with pytest.raises(ValueError, match="strictly increasing"):
        confirmed_by_neighbours(x, r, t[::-1])
    with pytest.raises(ValueError, match="time_index"):
        confirmed_by_neighbours(x, r, t.astype(float))
    with pytest.raises(ValueError, match="max_coherence"):
        confirmed_by_neighbours(x, r, t, max_coherence=1.5)
    with pytest.raises(ValueError, match="r must"):
        confirmed_by_neighbours(x, r[:4], t)


@pytest.mark.slow  # over about 6 s here (.ci/run runs it after the test command)
def test_self_training_finds_the_lobes_the_labels_miss(tmp_path):
    """A raster walk (5 cm steps) through a smooth 1.2 rad field the LoS model lacks, 12 labels:
    the labels-only field lands on wrong lobes; pseudo-labels confirmed in time fix most."""
    d, truth, los = _labeled(tmp_path)
    model = ImageSourceModel(los.scene.replace(ap_phase_offsets=truth["offsets"]), [])
    i, j = np.meshgrid(np.arange(13), np.arange(13), indexing="ij")
    j = np.where(i % 2 == 1, 12 - j, j)  # boustrophedon: consecutive snapshots 5 cm apart
    x = np.c_[4.0 + 0.05 * i.ravel(), 1.6 + 0.05 * j.ravel(), np.full(169, 0.74)]
    rng = np.random.default_rng(0)
    phase = np.asarray(jax.vmap(model.mean)(x)) + _smooth_field(x)
    phase += 0.1 * rng.standard_normal(phase.shape) + rng.uniform(-np.pi, np.pi, (169, 1))
    r = np.angle(np.exp(1j * phase))
    lab = np.sort(rng.permutation(169)[:12])
    un = np.setdiff1d(np.arange(169), lab)
    low, high = x.min(0) - 0.1, x.max(0) + 0.1
    low[2], high[2] = 0.735, 0.745
    grid = make_grid(low, high, 0.01)

    def errors(m):
        xe = np.asarray(coherent_search(m, grid, r[un]).x)
        return np.linalg.norm((xe - x[un])[:, :2], axis=1)

    st = self_train_field(model, grid, x[lab], r[lab], r[un], un, rounds=3)
    labels_only = errors(fit_residual_field(model, x[lab], r[lab]))
    self_trained = errors(st.model)
    # measured: p90 47 cm -> 9 cm (4 rounds), about 100 pseudo-labels, 23% of them > 5 cm off
    assert np.percentile(labels_only, 90) > 0.3
    assert np.percentile(self_trained, 90) < 0.5 * np.percentile(labels_only, 90)
    assert np.median(self_trained) < np.median(labels_only)
    assert st.num_pseudo_labels.shape == (3,) and st.num_pseudo_labels[-1] > 60
    assert st.pseudo_labels.sum() == st.num_pseudo_labels[-1]
    wrong = np.linalg.norm((st.x_unlabeled - x[un])[:, :2], axis=1)[st.pseudo_labels] > 0.05
    assert wrong.mean() < 0.35
    with pytest.raises(ValueError, match="rounds"):
        self_train_field(model, grid, x[lab], r[lab], r[un], un, rounds=0)
    with pytest.raises(ValueError, match="time_index"):
        self_train_field(model, grid, x[lab], r[lab], r[un], un[:-1])
    with pytest.raises(ValueError, match="r_unlabeled"):
        self_train_field(model, grid, x[lab], r[lab], r[un, :5], un)


@pytest.mark.slow
def test_real_techtile_example_on_generated_folder(tmp_path, monkeypatch):
    # two experiments of one size: the second reuses the first one's compiled functions
    held = (20, 30)  # two motion-capture frames held in each experiment
    write_folder(tmp_path / "data", {"EXP901": 36, "EXP902": 36}, residual_std=0.1, held_rows=held)
    out = tmp_path / "rt.json"
    argv = [
        "--data",
        str(tmp_path / "data"),
        "--num-labeled",
        "12",
        "--seed",
        "1",
        "--out",
        str(tmp_path / "rt"),
        "--json",
        str(out),
    ]
    monkeypatch.setattr(sys, "argv", ["examples/real_techtile.py", *argv])
    monkeypatch.syspath_prepend("examples")
    runpy.run_path("examples/real_techtile.py", run_name="__main__")
    result = read_rows(out)
    keys = {
        "experiment",
        "method",
        "kind",
        "num_labeled",
        "median_m",
        "p90_m",
        "p99_m",
        "max_m",
        "residual_rms_rad",
        "ms_per_snapshot",
    }
    rows = result["rows"]
    assert all(keys <= set(r) for r in rows)
    assert {(r["experiment"], r["kind"]) for r in rows} == {
        (e, k)
        for e in ("EXP901", "EXP902")
        for k in (
            "los_offsets",
            "knn",
            "paper_gp",
            "field",
            "self_trained",
            "trajectory",
            "lobe_oracle",
            "complex",
            "best",
            "best_trajectory",
            "best_field",
        )
    }
    located = np.random.default_rng(1).permutation(36)[12:]  # the example's draw (seed 1)
    for r in rows:
        assert r["num_labeled"] == 12
        assert r["num_held_located"] == np.isin(located, held).sum()
        assert r["p90_unheld_m"] <= r["max_m"]
        if r["kind"] in ("los_offsets", "field", "self_trained", "complex", "best", "best_field"):
            # 0.1 rad of white phase noise on 8 APs: millimetres, no wrong lobes
            assert r["median_m"] < 0.01 and r["max_m"] < 0.03, r
            assert 0.07 < r["residual_rms_rad"] < 0.15, r
    floor = {f["experiment"]: f for f in result["noise_floor"]}
    assert set(floor) == {"EXP901", "EXP902"}
    assert all(f["mean_peb_still_m"] > 0 for f in floor.values())
    assert (tmp_path / "rt.png").exists()
    per_snapshot = np.load(tmp_path / "rt_errors.npz")
    for r in rows:
        err = per_snapshot[f"{r['experiment']}_{r['method']}"]
        assert err.shape == (24,) and np.median(err) == pytest.approx(r["median_m"], rel=1e-12)
    np.testing.assert_array_equal(per_snapshot["EXP901_located"], np.sort(located))
    assert per_snapshot["EXP902_x"].shape == (24, 3)
    # --resume keeps the rows of the same request (nothing recomputed) and refuses another's
    monkeypatch.setattr(sys, "argv", ["examples/real_techtile.py", *argv, "--resume"])
    runpy.run_path("examples/real_techtile.py", run_name="__main__")
    assert read_rows(out)["rows"] == rows
    other = [*argv[:5], "2", *argv[6:], "--resume"]  # another seed: another label draw
    assert argv[4:6] == ["--seed", "1"]
    monkeypatch.setattr(sys, "argv", ["examples/real_techtile.py", *other])
    with pytest.raises(SystemExit):
        runpy.run_path("examples/real_techtile.py", run_name="__main__")
    assert read_rows(out)["rows"] == rows


def test_real_techtile_label_draw_distinct_spots(monkeypatch):
    """--distinct-labels: one label per spot, however many copies a still rover left there."""
    monkeypatch.syspath_prepend("examples")
    draw = runpy.run_path("examples/real_techtile.py", run_name="real_techtile")["draw_labels"]
    rng = np.random.default_rng(3)
    moving = np.c_[rng.uniform(0, 1, (40, 2)), np.zeros(40)]
    still = np.array([0.5, 0.5, 0.0]) + 1e-4 * rng.standard_normal((60, 3))
    x = np.concatenate([still[:30], moving, still[30:]])  # 60 copies of one spot
    li, ti = draw(x, 12, 0)
    np.testing.assert_array_equal(li, np.random.default_rng(0).permutation(100)[:12])
    li, ti = draw(x, 12, 0, distinct=True)
    assert len(li) == 12 and len(set(li)) == 12
    np.testing.assert_array_equal(np.sort(np.r_[li, ti]), np.arange(100))
    assert np.all(np.diff(ti) > 0)  # the located ones in time order
    d = np.linalg.norm(x[li, None, :2] - x[None, li, :2], axis=-1)
    assert np.min(d + np.eye(12)) >= 0.02
    assert np.sum(np.linalg.norm(x[li, :2] - 0.5, axis=1) < 0.01) <= 1  # the still spot once
    with pytest.raises(ValueError, match="num_labeled"):
        draw(x[:40], 12, 0, distinct=True)  # 30 copies and 10 moving snapshots: 11 spots


@pytest.mark.slow
def test_real_techtile_self_calibration_row_on_generated_folder(tmp_path, monkeypatch):
    """The optional rows: best_unlabeled (best's calibration with held-out complex snapshots
    as unlabeled ones) and best_self_trained (best_field's field self-trained on them), at
    millimetres on generated data."""
    write_folder(tmp_path / "data", {"EXP901": 36}, residual_std=0.1)
    out = tmp_path / "rt.json"
    argv = ["--data", str(tmp_path / "data"), "--num-labeled", "12", "--json", str(out)]
    argv += ["--methods", "best,best_unlabeled,best_self_trained", "--out", str(tmp_path / "rt")]
    monkeypatch.setattr(sys, "argv", ["examples/real_techtile.py", *argv])
    monkeypatch.syspath_prepend("examples")
    runpy.run_path("examples/real_techtile.py", run_name="__main__")
    rows = {r["kind"]: r for r in read_rows(out)["rows"]}
    assert set(rows) == {"best", "best_unlabeled", "best_self_trained"}
    for kind in ("best_unlabeled", "best_self_trained"):
        assert rows[kind]["median_m"] < 0.01 and rows[kind]["max_m"] < 0.03, rows[kind]


def _rewrite(src, dst, typecodes=None, **changes):
    """Copy the netCDF file ``src`` to ``dst`` with some variables replaced by (dims, values)
    and some stored with other type codes (``{"csi_real": "f"}``: float32)."""
    with netcdf_file(src, "r", mmap=False) as nc:
        dims = dict(nc.dimensions)
        variables = {
            k: (v.dimensions, np.array(v.data), v.typecode()) for k, v in nc.variables.items()
        }
    for name, (vdims, values) in changes.items():
        variables[name] = (vdims, values, variables[name][2])
        for dim, n in zip(vdims, values.shape, strict=True):
            dims[dim] = n
    with netcdf_file(dst, "w") as nc:
        for d, n in dims.items():
            nc.createDimension(d, n)
        for k, (vdims, values, code) in variables.items():
            v = nc.createVariable(k, (typecodes or {}).get(k, code), vdims)
            v[:] = values


def test_loader_refuses_malformed_files_by_name(tmp_path):
    write_folder(tmp_path, {"EXP901": 10})
    src = tmp_path / "csi_EXP901.nc"
    with netcdf_file(src, "r", mmap=False) as nc:
        real = np.array(nc.variables["csi_real"].data)
        hosts = np.array(nc.variables["hostname"].data)
    cases = {
        "EXP902": ({"csi_imag": (("experiment", "cycle", "host2"), real[..., :-1])}, "csi_imag"),
        "EXP903": ({"hostname": (("host3", "name_len"), hosts[:-1])}, "hostname lists 7"),
        "EXP904": (
            {"hostname": (("host", "name_len"), np.concatenate([hosts[:-1], hosts[:1]]))},
            r"\['A05'\] more than once",
        ),
    }
    for exp, (change, match) in cases.items():
        _rewrite(src, tmp_path / f"csi_{exp}.nc", **change)
        with pytest.raises(ValueError, match=match):
            load_techtile(tmp_path, exp)
    data = src.read_bytes()
    (tmp_path / "csi_EXP905.nc").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="csi_EXP905.nc"):
        load_techtile(tmp_path, "EXP905")


def test_loader_returns_float64_from_float32_files(tmp_path):
    write_folder(tmp_path, {"EXP901": 10})
    _rewrite(
        tmp_path / "csi_EXP901.nc",
        tmp_path / "csi_EXP906.nc",
        typecodes={"csi_real": "f", "csi_imag": "f", "rover_x": "f"},
    )
    with netcdf_file(tmp_path / "csi_EXP906.nc", "r", mmap=False) as nc:
        assert nc.variables["csi_real"].data.dtype.itemsize == 4
    d = load_techtile(tmp_path, "EXP906")
    for a in (d.phases, d.amplitudes, d.positions):
        assert a.dtype == np.float64


def test_empty_inputs_of_the_coherent_and_self_training_stages(tmp_path):
    d, truth, _ = _labeled(tmp_path)
    model = ImageSourceModel(techtile_scene(d).replace(ap_phase_offsets=truth["offsets"]), [])
    z = float(np.median(d.positions[:, 2]))
    grid = make_grid([3.9, 1.5, z - 0.03], [4.8, 2.4, z + 0.03], 0.05)
    empty = np.zeros((0, len(TILES)))
    peaks = coherent_peaks(model, grid, empty, num_peaks=3)
    assert peaks.x.shape == (0, 3, 3) and peaks.score.shape == (0, 3)
    assert coherent_search(model, grid, empty).x.shape == (0, 3)
    out = confirmed_by_neighbours(np.zeros((0, 3)), empty, np.zeros(0, int))
    assert out.shape == (0,) and out.dtype == bool
    with pytest.raises(ValueError, match="r_unlabeled must hold at least one snapshot"):
        self_train_field(model, grid, d.positions, d.phases, empty, np.zeros(0, int))
