"""Receivers that add a constant as strong as the pilot: what calibrating them buys.

Worlds: the paper's APs, free-standing, phase centres off by N(0, 1 cm) in 3-D, the two-ray
channel at -10 dBm, receivers of ``receivers.random_receivers`` (gains of uniform phase and
1 dB spread, constants of uniform phase as strong as the median pilot). L = 50 labeled complex
snapshots (random positions and snapshot factors). Per world, the fine stage alone: each of
``--num-test`` test UEs refined from its true position (10 LM steps), so the rows measure
the model's accuracy, not the search's:

* ``complex, calibrated``: ``calibrate(fit=("ap_positions", "receiver_gains",
  "receiver_constants"))`` on the complex snapshots, the complex LM
  (``estimators.complex_search``'s local stage);
* ``complex, true receivers``: the true world's complex model (the reference);
* ``phase-only, calibrated``: the paper's receivers assumed, ``calibrate(fit=("ap_positions",
  "ap_phase_offsets"))`` on the phases ``arg h``, the phase MLE refinement;

each as RMSE over the world's mean complex PEB (``bounds.complex_peb``, the snapshot
factor profiled), over ``--num-worlds`` worlds (median and worst).

    python benchmarks/receiver_calibration.py --json out/receiver_calibration.json
    python benchmarks/receiver_calibration.py --quick     # 2 worlds, 128 test UEs
"""

from __future__ import annotations

import argparse
import pathlib
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import receivers as rx  # noqa: E402
from dmimo_jax.calibration import calibrate  # noqa: E402
from dmimo_jax.estimators import make_grid  # noqa: E402
from dmimo_jax.estimators.coherent import complex_search  # noqa: E402


def world(seed: int):
    scene = dj.paper_scene(-10.0, convention="itu")
    real = dj.perturb_deployment(
        jax.random.key(seed), scene, position_std=1e-2, random_offsets=False
    )
    truth = dj.TwoRayModel(real)
    recv = rx.random_receivers(jax.random.key(seed + 1), truth)
    return scene, truth, recv


def snapshots(key, truth, recv, scene, num):
    k_x, k_s, k_n = jax.random.split(key, 3)
    x = dj.sample_positions(k_x, num, scene)
    s = jnp.exp(1j * dj.random_cpos(k_s, num))
    return x, rx.simulate_snapshots(k_n, truth, x, recv, s)


def fine_complex(model, x, h):
    """Each snapshot refined from its true position: the LM stage of complex_search (a
    one-cell grid around it, no grid search)."""
    out = []
    for xi, hi in zip(np.asarray(x), np.asarray(h), strict=True):
        g = make_grid(xi - 1e-4, xi + 1e-4, 1e-4)  # 2 cells per axis: the LM in 3-D
        out.append(np.asarray(complex_search(model, g, hi[None], refine_steps=1).x[0]))
    return np.stack(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-worlds", type=int, default=5)
    ap.add_argument("--num-test", type=int, default=512)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.num_worlds, args.num_test = 2, 128
    rows = []
    for seed in range(args.num_worlds):
        scene, truth, recv = world(seed)
        x_l, h_l = snapshots(jax.random.key(100 + seed), truth, recv, scene, 50)
        x_t, h_t = snapshots(jax.random.key(200 + seed), truth, recv, scene, args.num_test)
        nv = jnp.full(h_l.shape, float(scene.noise_power))
        peb = np.asarray(jax.vmap(dj.bounds.complex_peb, in_axes=(0, None, None))(x_t, truth, recv))
        nominal = dj.TwoRayModel(scene)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            t0 = time.perf_counter()
            cal = calibrate(
                nominal, x_l, h_l, nv, fit=("ap_positions", "receiver_gains", "receiver_constants")
            )
            t_cal = time.perf_counter() - t0
            r_l = jnp.angle(h_l)
            var_l = jax.vmap(truth.variance)(x_l) / jnp.abs(recv.gains)[None, :] ** 2
            phase = calibrate(nominal, x_l, r_l, var_l, fit=("ap_positions", "ap_phase_offsets"))
        models = {
            "complex, calibrated": rx.ReceiverModel(cal.model, cal.receivers),
            "complex, true receivers": rx.ReceiverModel(truth, recv),
        }
        for name, model in models.items():
            err = np.linalg.norm(fine_complex(model, x_t, h_t) - np.asarray(x_t), axis=1)
            rows.append(
                dict(
                    world=seed,
                    method=name,
                    rmse_over_peb=float(np.sqrt(np.mean(err**2)) / peb.mean()),
                    max_m=float(err.max()),
                    status=cal.status if "calibrated" in name else "-",
                    calibration_s=t_cal if "calibrated" in name else None,
                )
            )
        xr = dj.estimators.refine_batch(x_t, jnp.angle(h_t), phase.model).x
        err = np.linalg.norm(np.asarray(xr) - np.asarray(x_t), axis=1)
        rows.append(
            dict(
                world=seed,
                method="phase-only, calibrated",
                rmse_over_peb=float(np.sqrt(np.mean(err**2)) / peb.mean()),
                max_m=float(err.max()),
                status=phase.status,
                calibration_s=None,
            )
        )
        print(
            f"world {seed}: "
            + ", ".join(f"{r['method']} {r['rmse_over_peb']:.3g}" for r in rows[-3:]),
            flush=True,
        )
    summary = []
    for name in ("complex, calibrated", "complex, true receivers", "phase-only, calibrated"):
        v = np.array([r["rmse_over_peb"] for r in rows if r["method"] == name])
        summary.append(
            dict(
                method=name,
                worlds=len(v),
                median_rmse_over_peb=float(np.median(v)),
                worst_rmse_over_peb=float(v.max()),
                device=device_name(),
            )
        )
    print_table(
        summary,
        [
            ("method", "method", "s"),
            ("worlds", "worlds", "d"),
            ("median_rmse_over_peb", "RMSE/PEB median", ".3g"),
            ("worst_rmse_over_peb", "worst", ".3g"),
        ],
    )
    write_json(args.json, {"rows": rows, "summary": summary})
    return summary


if __name__ == "__main__":
    main()
