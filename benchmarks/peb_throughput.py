"""Time the PEB over many UE positions by three routes, side by side in one run.

Routes (all float64, jit + vmap, same positions):
  autodiff   : H by jax.jacfwd, closed-form EFIM (eq. 13b)      -> dmimo_jax.peb_map
  channel_fim: channel FIM by autodiff (eq. 10) -> Schur (13a) -> H by jacfwd (eq. 14)
  analytic   : H from the Appendix's analytic Jacobian, closed-form EFIM

    python benchmarks/peb_throughput.py                 # 10 000 positions
    python benchmarks/peb_throughput.py --n 100000 --json out/peb.json
"""

from __future__ import annotations

import argparse
import pathlib

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import (  # noqa: E402
    device_name,
    peak_rss_mb,
    print_table,
    summarize,
    time_call,
    write_json,
)

import dmimo_jax as dj  # noqa: E402


def _peb_from(h, j_theta):
    return jnp.sqrt(jnp.trace(jnp.linalg.inv(h.T @ j_theta @ h)))


def peb_channel_fim(x, scene):
    return _peb_from(
        dj.bounds.phase_jacobian(x, scene), dj.bounds.efim_schur(dj.bounds.channel_fim(x, scene))
    )


def peb_analytic(x, scene):
    return _peb_from(dj.bounds.jacobian_analytic(x, scene), dj.bounds.efim(x, scene))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000, help="number of UE positions")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--power-dbm", type=float, default=-10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)

    scene = dj.paper_scene(args.power_dbm)
    xs = dj.sample_positions(jax.random.key(args.seed), args.n, scene)
    routes = {
        "autodiff": lambda: dj.peb_map(xs, scene),
        "channel_fim": jax.jit(lambda: jax.vmap(peb_channel_fim, (0, None))(xs, scene)),
        "analytic": jax.jit(lambda: jax.vmap(peb_analytic, (0, None))(xs, scene)),
    }
    rows, outputs = [], {}
    for name, fn in routes.items():
        first, times = time_call(fn, args.repeats)  # first call includes compilation
        stats = summarize(times)
        outputs[name] = values = np.asarray(fn())
        reference = outputs["autodiff"]
        rows.append(
            {
                "method": name,
                "n_positions": args.n,
                "first_call_s": first,
                **stats,
                "us_per_peb": stats["median_s"] / args.n * 1e6,
                "max_rel_diff_vs_autodiff": float(np.max(np.abs(values - reference) / reference)),
                "mean_peb_m": float(values.mean()),
                "median_peb_m": float(np.median(values)),
                "device": device_name(),
                "peak_rss_mb": peak_rss_mb(),
            }
        )
    base = rows[0]["median_s"]
    for r in rows:
        r["time_ratio_vs_autodiff"] = r["median_s"] / base
    print(f"PEB throughput, {args.n} positions, P = {args.power_dbm} dBm, {device_name()}")
    print_table(
        rows,
        [
            ("method", "method", "s"),
            ("first_call_s", "first call s", ".3f"),
            ("median_s", "median s", ".4f"),
            ("std_s", "std s", ".4f"),
            ("us_per_peb", "us / PEB", ".2f"),
            ("time_ratio_vs_autodiff", "ratio", ".2f"),
            ("max_rel_diff_vs_autodiff", "max rel diff", ".1e"),
            ("mean_peb_m", "mean PEB m", ".3e"),
        ],
    )
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
