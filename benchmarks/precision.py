"""float32 vs float64 effective phases on the paper's scene, next to the phase-noise std.

Compares two ways of evaluating eq. (7b) in float32 against the float64 reference:
  stable : dmimo_jax (LoS phase + bounded perturbation, cancellation-free path difference)
  direct : eq. (7b) literally, atan2(sum a_j sin t_j, sum a_j cos t_j) with t_j ~ 170 rad

    python benchmarks/precision.py --json out/precision.json
"""

from __future__ import annotations

import argparse
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import device_name, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402


def direct_eq7b(x, scene):
    pp = dj.physics.path_parameters(x, scene)
    s = pp.alpha1 * jnp.sin(pp.theta1) + pp.alpha2 * jnp.sin(pp.theta2)
    c = pp.alpha1 * jnp.cos(pp.theta1) + pp.alpha2 * jnp.cos(pp.theta2)
    return jnp.arctan2(s, c)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1280)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)

    rows = []
    for power in (-10.0, -60.0):
        s64 = dj.paper_scene(power)
        s32 = s64.astype(jnp.float32)
        xs = dj.sample_positions(jax.random.key(args.seed), args.n, s64)
        ref = jax.jit(jax.vmap(dj.physics.effective_phase, (0, None)))(xs, s64)
        sigma = np.sqrt(
            np.asarray(jax.jit(jax.vmap(dj.physics.phase_noise_var, (0, None)))(xs, s64))
        )
        for name, fn in (("stable", dj.physics.effective_phase), ("direct", direct_eq7b)):
            th32 = jax.jit(jax.vmap(fn, (0, None)))(xs.astype(jnp.float32), s32)
            assert th32.dtype == jnp.float32
            err = np.abs(np.asarray(dj.wrap(th32.astype(jnp.float64) - ref)))
            ratio = err / sigma
            rows.append(
                {
                    "method": name,
                    "dtype": "float32",
                    "power_dbm": power,
                    "n_positions": args.n,
                    "median_err_rad": float(np.median(err)),
                    "p99_err_rad": float(np.percentile(err, 99)),
                    "max_err_rad": float(err.max()),
                    "median_sigma_rad": float(np.median(sigma)),
                    "median_err_over_sigma": float(np.median(ratio)),
                    "max_err_over_sigma": float(ratio.max()),
                    "device": device_name(),
                }
            )
    print(f"float32 effective-phase error vs float64, {args.n} random UEs, paper scene")
    print_table(
        rows,
        [
            ("method", "eq. 7b form", "s"),
            ("power_dbm", "P dBm", ".0f"),
            ("median_err_rad", "median err", ".2e"),
            ("p99_err_rad", "p99 err", ".2e"),
            ("max_err_rad", "max err", ".2e"),
            ("median_sigma_rad", "median sigma", ".2e"),
            ("median_err_over_sigma", "med err/sigma", ".3f"),
            ("max_err_over_sigma", "max err/sigma", ".3f"),
        ],
    )
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
