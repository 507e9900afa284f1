"""Does ``calibrate`` converge from the nominal start in random deployments? Success rates.

Worlds (``datasets.synthetic_deployment``, a world per seed):

* ``room``: the paper's 17 APs on the ceiling of a box room whose six surfaces are each
  drawn from ``datasets.ROOM_MATERIALS`` (the nominal model guesses every surface
  concrete), phase centres off by N(0, sigma^2) laterally, per-AP offsets uniform;
  fit: phase centres, offsets, surfaces. Success: every phase centre within 0.1 mm.
* ``two-ray``: free-standing APs off by N(0, 1 cm) in 3-D, downward patches of exponent
  1.7 believed to be 1, offsets uniform; fit: phase centres, offsets, ground, exponent.
  Success: every phase centre within 1 mm.
* ``faces`` (``--faces``): the paper's room as a scene of faces (``datasets.face_scene``: a
  floor of two materials, walls, ceiling, a pillar, a metal cabinet), the five dielectric
  names each drawn from ``ROOM_MATERIALS`` (nominal: all concrete), APs as in ``room``; fit:
  phase centres, offsets, one permittivity per face name. Success: within 0.1 mm.

Success also needs the reduced chi-square inside its band (1 +- 5 sqrt(2 / dof)). A second
criterion is the noise's own: status "converged" and every fitted coordinate within 5 of its
stated standard errors (at -20 dBm the noise alone puts some phase centres past 0.1 mm). L labeled
snapshots at P dBm (positions uniform in the UE region, random CPOs), from the nominal model.
Rows: kind, sigma, L, P; success rate; percentiles of the largest phase-centre error over
worlds; the largest offset error; the fit's status counts; seconds per calibration as a
user sees it (the first includes compilation). Every failure is listed with its seed.

``--fine-seeds N``: for seeds 0..N-1 of the package's own benchmark world
(``synthetic_deployment(seed=s)``, the room of fixed materials, L = 50 at -10 dBm), the
fine stage under the calibrated room: 512 test UEs refined (the MLE's local stage, 10 LM
steps) from their true positions, RMSE over the world's mean PEB (what the learned online
stage reaches wherever its coarse stage finds the cell).

The worlds of a row are calibrated ``--batch`` (32) at a time by
``calibration.calibrate_many`` (each LM stage one vmapped program; each world's calibration
what its own ``calibrate`` call gives, tested to 1e-9 m); ``--loop`` calls ``calibrate`` once
per world instead. Seconds per world are the batch's wall time over its worlds.

Resumable: each batch's records are appended to ``--json`` as it finishes and a restarted run
skips the worlds already there.

    python benchmarks/calibration_robustness.py --json out/calibration_robustness.json
    python benchmarks/calibration_robustness.py --quick          # 8 worlds, main rows only
    python benchmarks/calibration_robustness.py --faces --num-worlds 20   # scenes of faces
"""

from __future__ import annotations

import argparse
import json
import pathlib
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import device_name, print_table, write_json  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.benchmarking import check_options, read_rows  # noqa: E402
from dmimo_jax.calibration import calibrate, calibrate_many  # noqa: E402
from dmimo_jax.datasets import sample_world_positions, synthetic_deployment  # noqa: E402

FITS = {
    "room": ("ap_positions", "ap_phase_offsets", "surfaces"),
    "faces": ("ap_positions", "ap_phase_offsets", "surfaces"),
    "two-ray": ("ap_positions", "ap_phase_offsets", "surfaces", "antenna"),
}
TOLERANCE_M = {"room": 1e-4, "faces": 1e-4, "two-ray": 1e-3}


def configs(num_main: int, num_grid: int, quick: bool, faces: bool = False) -> list[dict]:
    """(kind, sigma, L, power, worlds) of every row: the two main rows, then the grid (with
    ``faces``: the one row of scenes of faces instead)."""
    if faces:
        return [dict(kind="faces", sigma=5e-3, L=50, power=-10.0, worlds=num_main)]
    rows = [
        dict(kind="room", sigma=5e-3, L=50, power=-10.0, worlds=num_main),
        dict(kind="two-ray", sigma=1e-2, L=50, power=-10.0, worlds=num_main),
    ]
    if quick:
        return rows
    for sigma in (3e-3, 8e-3):
        rows.append(dict(kind="room", sigma=sigma, L=50, power=-10.0, worlds=num_grid))
    for kind, sigma in (("room", 5e-3), ("two-ray", 1e-2)):
        for num_l in (30, 100):
            rows.append(dict(kind=kind, sigma=sigma, L=num_l, power=-10.0, worlds=num_grid))
        rows.append(dict(kind=kind, sigma=sigma, L=50, power=-20.0, worlds=num_grid))
    return rows


def world(cfg: dict, seed: int):
    """(truth, nominal, x, r, noise_var) of one world."""
    if cfg["kind"] in ("room", "faces"):
        kind = "faces" if cfg["kind"] == "faces" else "room"
        w = synthetic_deployment(
            cfg["power"], seed=seed, world=kind, position_std=cfg["sigma"], random_materials=True
        )
    else:
        w = synthetic_deployment(
            cfg["power"], seed=seed, world="two-ray", patch=True, position_std=cfg["sigma"]
        )
    k_x, k_cpo, k_noise = jax.random.split(jax.random.key(10_000 + seed), 3)
    x = sample_world_positions(k_x, cfg["L"], w.truth)  # in the air
    r = dj.simulate_phases_batch(k_noise, w.truth, x, dj.random_cpos(k_cpo, cfg["L"]))
    return w.truth, w.nominal, x, r, jax.vmap(w.truth.variance)(x)


def run_worlds(cfg: dict, seeds: list[int], batched: bool = True) -> list[dict]:
    """The records of worlds ``seeds``: calibrated at once (``calibration.calibrate_many``,
    one program per LM stage; each calibration what its own ``calibrate`` call gives) or one
    ``calibrate`` call each (``batched=False``). Seconds: the wall time per world."""
    worlds = [world(cfg, seed) for seed in seeds]
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if batched:
            stack = [np.stack([w[i] for w in worlds]) for i in (2, 3, 4)]
            cals = calibrate_many([w[1] for w in worlds], *stack, fit=FITS[cfg["kind"]])
        else:
            cals = [calibrate(w[1], *w[2:], fit=FITS[cfg["kind"]]) for w in worlds]
    seconds = (time.perf_counter() - t0) / len(seeds)
    return [
        record(cfg, seed, w[0], cal, seconds)
        for seed, w, cal in zip(seeds, worlds, cals, strict=True)
    ]


def record(cfg: dict, seed: int, truth, cal, seconds: float) -> dict:
    """One world's record: its calibration ``cal`` against the truth."""
    pos = np.asarray(cal.values["ap_positions"])
    pos_err = np.linalg.norm(pos - np.asarray(truth.scene.ap_positions), axis=1)
    true_off = np.asarray(truth.scene.ap_phase_offsets)
    off_err = np.angle(
        np.exp(1j * (np.asarray(cal.values["ap_phase_offsets"]) - (true_off - true_off[0])))
    )
    se = np.asarray(cal.stderr["ap_positions"])
    diff = np.abs(pos - np.asarray(truth.scene.ap_positions))
    free = se > 0  # a mounted AP's height is held: error 0 and standard error 0
    max_z = float(np.max(diff[free] / se[free]))
    chi2 = float(cal.reduced_chi2)
    in_band = abs(chi2 - 1.0) <= 5.0 * np.sqrt(2.0 / cal.dof)
    return dict(
        seed=seed,
        seconds=seconds,
        max_position_error_m=float(pos_err.max()),
        max_offset_error_rad=float(np.abs(off_err).max()),
        max_position_z=max_z,
        reduced_chi2=chi2,
        status=getattr(cal, "status", "converged" if in_band else "misfit"),
        success=bool(pos_err.max() <= TOLERANCE_M[cfg["kind"]] and in_band),
        # the noise's own yardstick: converged, and every coordinate within 5 standard errors
        success_5sigma=bool(cal.status == "converged" and max_z <= 5.0),
    )


def fine_stage(seed: int, num_test: int = 512) -> dict:
    """The calibrated room's fine stage on the benchmark world ``seed`` (module docstring)."""
    w = synthetic_deployment(-10.0, seed=seed)
    k_x, k_cpo, k_noise = jax.random.split(jax.random.key(seed), 3)
    x = dj.sample_positions(k_x, 50, w.surveyed)
    r = dj.simulate_phases_batch(k_noise, w.truth, x, dj.random_cpos(k_cpo, 50))
    nv = jax.vmap(w.truth.variance)(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cal = calibrate(w.nominal, x, r, nv, fit=FITS["room"])
    k_x, k_cpo, k_noise = jax.random.split(jax.random.key(10_000 + seed), 3)
    xt = dj.sample_positions(k_x, num_test, w.surveyed)
    rt = dj.simulate_phases_batch(k_noise, w.truth, xt, dj.random_cpos(k_cpo, num_test))
    xe = dj.estimators.refine_batch(xt, rt, cal.model, num_steps=10).x
    err = np.linalg.norm(np.asarray(xe) - np.asarray(xt), axis=1)
    peb = np.asarray(dj.peb_map(xt, w.truth))
    return dict(
        seed=seed,
        status=cal.status,
        fine_rmse_over_mean_peb=float(np.sqrt(np.mean(err**2)) / peb.mean()),
        max_um=1e6 * float(err.max()),
    )


def key_of(cfg: dict) -> str:
    return f"{cfg['kind']}|{cfg['sigma']:g}|{cfg['L']}|{cfg['power']:g}"


def summary(cfg: dict, records: list[dict]) -> dict:
    err = np.array([w["max_position_error_m"] for w in records])
    secs = np.array([w["seconds"] for w in records])
    statuses: dict[str, int] = {}
    for w in records:
        statuses[w["status"]] = statuses.get(w["status"], 0) + 1
    return dict(
        kind=cfg["kind"],
        sigma_mm=1e3 * cfg["sigma"],
        L=cfg["L"],
        power_dbm=cfg["power"],
        worlds=len(records),
        success_rate=float(np.mean([w["success"] for w in records])),
        success_5sigma_rate=float(np.mean([w.get("success_5sigma", np.nan) for w in records])),
        max_z=float(np.max([w.get("max_position_z", np.nan) for w in records])),
        p50_um=1e6 * float(np.percentile(err, 50)),
        p90_um=1e6 * float(np.percentile(err, 90)),
        max_um=1e6 * float(err.max()),
        max_offset_rad=float(max(w["max_offset_error_rad"] for w in records)),
        median_s=float(np.median(secs)),
        p99_s=float(np.percentile(secs, 99)),
        statuses=statuses,
        failures=[
            {
                k: w.get(k)
                for k in (
                    "seed",
                    "max_position_error_m",
                    "max_position_z",
                    "reduced_chi2",
                    "status",
                )
            }
            for w in records
            if not w["success"]
        ],
    )


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-worlds", type=int, default=200, help="worlds per main row")
    ap.add_argument("--num-grid", type=int, default=50, help="worlds per grid row")
    ap.add_argument("--first-seed", type=int, default=100)
    ap.add_argument("--quick", action="store_true", help="8 worlds, the two main rows")
    ap.add_argument(
        "--faces",
        action="store_true",
        help="the scenes of faces (random materials of the five dielectric names) instead",
    )
    ap.add_argument(
        "--batch", type=int, default=32, help="worlds calibrated at once (calibrate_many)"
    )
    ap.add_argument("--loop", action="store_true", help="one calibrate call per world instead")
    ap.add_argument("--fine-seeds", type=int, default=0, help="the fine stage on seeds 0..N-1 only")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.num_worlds = min(args.num_worlds, 8)
    check_options(num_worlds=args.num_worlds, num_grid=args.num_grid, batch=args.batch)
    if args.fine_seeds:
        fine = [fine_stage(s) for s in tqdm(range(args.fine_seeds), desc="fine stage")]
        print_table(
            fine,
            [
                ("seed", "seed", "d"),
                ("status", "status", "s"),
                ("fine_rmse_over_mean_peb", "fine/PEB", ".3f"),
                ("max_um", "max um", ".1f"),
            ],
        )
        write_json(args.json, {"fine_stage": fine})
        return fine
    done: dict[str, list[dict]] = {}
    if args.json is not None and args.json.exists():
        done = read_rows(args.json).get("worlds", {})
    rows = []
    for cfg in configs(args.num_worlds, args.num_grid, args.quick, args.faces):
        key = key_of(cfg)
        records = done.setdefault(key, [])
        have = {w["seed"] for w in records}
        seeds = [s for s in range(args.first_seed, args.first_seed + cfg["worlds"])]
        todo = [s for s in seeds if s not in have]
        size = 1 if args.loop else args.batch
        with tqdm(total=len(todo), desc=key, unit="world") as bar:
            for i in range(0, len(todo), size):
                chunk = todo[i : i + size]
                records.extend(run_worlds(cfg, chunk, batched=not args.loop))
                bar.update(len(chunk))
                if args.json is not None:  # each batch kept as it finishes: resumable
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps({"rows": rows, "worlds": done}, indent=1))
        rows.append(summary(cfg, [w for w in records if w["seed"] in set(seeds)]))
    for row in rows:
        row["device"] = device_name()
    write_json(args.json, {"rows": rows, "worlds": done})
    print_table(
        rows,
        [
            ("kind", "world", "s"),
            ("sigma_mm", "sigma mm", ".0f"),
            ("L", "L", "d"),
            ("power_dbm", "P dBm", ".0f"),
            ("worlds", "worlds", "d"),
            ("success_rate", "success", ".3f"),
            ("success_5sigma_rate", "5 sigma", ".3f"),
            ("p50_um", "p50 um", ".1f"),
            ("p90_um", "p90 um", ".1f"),
            ("max_um", "max um", ".3g"),
            ("max_offset_rad", "max off rad", ".2g"),
            ("median_s", "median s", ".2f"),
            ("p99_s", "p99 s", ".1f"),
        ],
    )
    for row in rows:
        for f in row["failures"]:
            print(f"failure {row['kind']} L={row['L']} P={row['power_dbm']:g}: {f}")
    return rows


if __name__ == "__main__":
    main()
