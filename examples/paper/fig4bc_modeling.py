"""Fig. 4(b, c): modeling RMSE and NLPD vs transmit power for L training UEs, GP vs theory.

Concrete (paper convention), M = 17, P in {-60, ..., -10} dBm, L in {5, 10, 50, 100};
each point averages over independent test UEs (CPO of each test snapshot compressed by
eq. (15)). Writes OUT.json and OUT.png.

    python examples/paper/fig4bc_modeling.py --out out/gp_modeling
    python examples/paper/fig4bc_modeling.py --quick                 # L in {5, 10}, P in {-40, -10}
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import jax

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # examples/_helpers.py
from _helpers import fit_and_score, pyplot, save_figure  # noqa: E402
from tqdm import tqdm  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.benchmarking import read_rows  # noqa: E402


def plot(rows, path):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "rmse_deg", "RMSE [deg]"), (axes[1], "nlpd", "NLPD")):
        theory = sorted(
            {(r["power_dbm"], r[f"theory_{key}"]) for r in rows if r["L"] == rows[0]["L"]}
        )
        for num_train in sorted({r["L"] for r in rows}):
            sel = sorted((r for r in rows if r["L"] == num_train), key=lambda r: r["power_dbm"])
            ax.plot(
                [r["power_dbm"] for r in sel],
                [r[f"gp_{key}"] for r in sel],
                "o-",
                label=f"GP, L={num_train}",
            )
        ax.plot([t[0] for t in theory], [t[1] for t in theory], "k--", label="theoretical")
        if key == "rmse_deg":
            ax.set_yscale("log")
        ax.set(xlabel="transmit power P [dBm]", ylabel=label)
    save_figure(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--num-train", type=int, nargs="+", default=None)
    ap.add_argument("--powers-dbm", type=float, nargs="+", default=None)
    ap.add_argument("--num-test", type=int, default=None)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/gp_modeling"))
    ap.add_argument("--resume", action="store_true", help="keep rows already in OUT.json")
    args = ap.parse_args(argv)
    num_trains = args.num_train or ([5, 10] if args.quick else [5, 10, 50, 100])
    powers = args.powers_dbm or (
        [-40.0, -10.0] if args.quick else [-60.0, -50.0, -40.0, -30.0, -20.0, -10.0]
    )
    num_test = args.num_test or (50 if args.quick else 200)
    if min(num_trains) < 2:
        raise ValueError(f"--num-train values must be >= 2, got {num_trains}")
    json_path = args.out.with_suffix(".json")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    rows = read_rows(json_path) if args.resume and json_path.exists() else []
    done = {(r["L"], r["power_dbm"]) for r in rows}
    jobs = [(n, p) for n in num_trains for p in powers if (n, p) not in done]
    for num_train, power in tqdm(jobs, desc="gp_modeling", unit="fit"):
        scene = dj.paper_scene(power_dbm=power)
        out = fit_and_score(scene, num_train, num_test, seed=int(1000 * num_train - power))
        out = {k: v for k, v in out.items() if k not in ("model", "train")}
        rows.append(dict(L=num_train, power_dbm=power, material="concrete", **out))
        json_path.write_text(json.dumps(rows, indent=1))
    print(
        f"{'L':>4} {'P_dBm':>6} {'theory_deg':>11} {'gp_deg':>9} {'theory_nlpd':>12} {'gp_nlpd':>9} {'fit_s':>6}"
    )
    for r in sorted(rows, key=lambda r: (r["L"], r["power_dbm"])):
        print(
            f"{r['L']:4d} {r['power_dbm']:6.0f} {r['theory_rmse_deg']:11.4f} {r['gp_rmse_deg']:9.4f} "
            f"{r['theory_nlpd']:12.3f} {r['gp_nlpd']:9.3f} {r['fit_seconds']:6.1f}"
        )
    print(f"wrote {json_path}")
    plot(rows, args.out.with_suffix(".png"))


if __name__ == "__main__":
    main()
