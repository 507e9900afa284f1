"""The Locator through faulty APs: k of 17 APs faulty, each fault model, next to the same
Locator without faults, in one run.

Two worlds at each power (:func:`world`): the quickstart's (the paper's scene, concrete,
L = 50 labeled snapshots, the ``quick`` cell classifier, cached) and a calibrated room
(:func:`dmimo_jax.synthetic_deployment`, calibrated from L = 50 labeled snapshots). For each
fault model of :func:`dmimo_jax.measure.inject_faults` and k faulty APs (drawn at random per snapshot for
``random`` and ``blocked``; the same k APs in every snapshot for ``stuck`` and ``jump``,
as a lost synchronisation is a property of the AP), on the same test snapshots:

* the RMSE of the answers not rejected over the mean PEB of the healthy APs
  (:func:`dmimo_jax.bounds.subset_peb` of the true model), and p99 / max of every answer;
* the rejected fraction (answers the Locator flags), the answers both accepted and more
  than 1 mm off (confident wrong answers), detection recall (the faulty APs all excluded)
  and the false-exclusion rate (healthy APs excluded / healthy APs);
* the protection level at integrity risk 1% (:func:`dmimo_jax.bounds.protection_level`
  under the Locator's own model, with the answer's excluded APs and ML cost): the fraction
  of snapshots accepted with their error above it (integrity holds when that is at most
  1%), and its median over the healthy APs' PEB;
* the integrity rows (``--adversarial``): for every ``max_excluded`` the Locator accepts
  (:func:`dmimo_jax.bounds.noise_fit_probability` at its ``fit_risk``; before that bound,
  0 .. M - 5), snapshots of pure noise on every AP and ``max_excluded + 1`` and ``+ 2``
  random faults: the accepted share, the fewest redundant APs (M - k - 4) of an accepted
  answer, the most APs a row left out, and the share beyond the protection level;
* seconds per snapshot relative to the fault-free batch (k = 0) of the same run (each
  batch run once before it is timed: compilation excluded), and for
  the fault-free batch its cost with fault exclusion on against ``max_excluded=0`` (median
  of five interleaved passes).

    python benchmarks/fault_tolerance.py --json out/fault_tolerance.json
    python benchmarks/fault_tolerance.py --quick     # 128 snapshots, -10 dBm
    python benchmarks/fault_tolerance.py --worlds room --quick
    python benchmarks/fault_tolerance.py --quick --worlds paper --adversarial --json out/adv.json
"""

from __future__ import annotations

import argparse
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics in float64; the networks stay float32

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import labeled_snapshots, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import bounds, pipeline  # noqa: E402
from dmimo_jax.measure import FAULT_KINDS, inject_faults  # noqa: E402

RISK = 1e-2  # the integrity risk of the protection level reported


def fault_mask(rng, n, k, kind):
    mask = np.zeros((n, 17), bool)
    if kind in ("stuck", "jump"):
        mask[:, rng.choice(17, k, replace=False)] = True
    else:
        for i in range(n):
            mask[i, rng.choice(17, k, replace=False)] = True
    return mask


def world(name, power):
    """(scene, true model, offline result) of a world at ``power`` dBm: ``paper``, the
    quickstart's (the paper's scene, its two-ray channel, trained on L = 50 labeled
    snapshots); ``room``, :func:`dmimo_jax.synthetic_deployment`'s room (APs on the ceiling
    off their survey, six surfaces, random offsets), calibrated from L = 50 labeled
    snapshots (positions, offsets, surfaces) and trained under the calibrated model."""
    if name == "paper":
        scene = dj.paper_scene(power, "concrete")
        x, r, nv = labeled_snapshots(scene, 50, 0)
        off = pipeline.run_offline(x, r, nv, scene, kinds=("cells",), preset="quick", seed=0)
        return scene, dj.TwoRayModel(scene), off
    dep = dj.synthetic_deployment(power, seed=0)
    x, r, nv = labeled_snapshots(dep.surveyed, 50, 0, model=dep.truth)
    cal = dj.calibrate(dep.nominal, x, r, nv, fit=("ap_positions", "ap_phase_offsets", "surfaces"))
    off = pipeline.run_offline(
        x, r, nv, dep.surveyed, model=cal, kinds=("cells",), preset="quick", seed=0
    )
    return dep.surveyed, dep.truth, off


def allowed_exclusions(loc):
    """The ``max_excluded`` values ``loc`` accepts: 0 .. the most its noise-fit bound allows
    (0 .. M - 5 for a Locator without that bound)."""
    most = getattr(loc.settings, "most_excluded", None)  # None: no bound (or an older Locator)
    return list(range((loc.num_aps - 5 if most is None else most) + 1))


def integrity_row(loc, xt, rt, truth, mask, **labels):
    """The integrity columns of one batch: accepted share, the fewest redundant APs of an
    accepted answer, the most APs left out, the share accepted beyond the protection level
    (under the Locator's model, at ``RISK``) and the accepted answers more than 1 mm off."""
    out = loc(rt)
    m = loc.num_aps
    err = np.linalg.norm(np.asarray(out.x) - xt, axis=1)
    level = np.asarray(
        jax.vmap(bounds.protection_level_unchecked, in_axes=(0, None, 0, None, 0))(
            out.x, loc.fine_model, out.excluded, RISK, out.cost
        )
    )
    accepted = np.asarray(out.accepted)
    k = np.asarray(out.excluded).sum(axis=1)
    return dict(
        **labels,
        num=len(xt),
        accepted=float(accepted.mean()),
        min_redundancy=int((m - k - 4)[accepted].min()) if accepted.any() else None,
        most_excluded=int(k.max()),
        beyond_protection=float(np.mean(accepted & (err > level))),
        confident_wrong=float(np.mean(accepted & (err > 1e-3))),
    )


def adversarial(name, power, loc, truth, xt, rt):
    """Integrity rows (module docstring) of every ``max_excluded`` the Locator accepts."""
    rows = []
    rng = np.random.default_rng(7)
    num, m = rt.shape
    noise = jnp.asarray(rng.uniform(-np.pi, np.pi, (num, m)))
    for e in allowed_exclusions(loc):
        each = loc.replace(max_excluded=e)
        cases = [("noise", m, noise, np.ones((num, m), bool))]
        for k in (e + 1, e + 2):
            if k <= m - 4:
                mask = fault_mask(rng, num, k, "random")
                rf = inject_faults(jax.random.key(100 + k), rt, jnp.asarray(mask), "random")
                cases.append(("random", k, rf, mask))
        for kind, k, rf, mask in cases:
            row = integrity_row(
                each,
                xt,
                rf,
                truth,
                mask,
                world=name,
                power_dbm=power,
                max_excluded=e,
                fault=kind,
                k=k,
            )
            rows.append(row)
            print(row, flush=True)
    return rows


def timed(fn):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="128 snapshots at -10 dBm only")
    ap.add_argument("--num", type=int, default=None, help="test snapshots per row (1280)")
    ap.add_argument("--powers", type=float, nargs="*", default=None, help="dBm (-10 -20)")
    ap.add_argument("--faulty", type=int, nargs="*", default=[1, 2, 3], help="k values")
    ap.add_argument(
        "--worlds", nargs="*", default=["paper", "room"], choices=["paper", "room"], help="worlds"
    )
    ap.add_argument(
        "--adversarial", action="store_true", help="only the integrity rows (noise, k > max)"
    )
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    num = args.num or (128 if args.quick else 1280)
    powers = args.powers or ([-10.0] if args.quick else [-10.0, -20.0])
    rows = []
    for name, power in [(w, p) for w in args.worlds for p in powers]:
        scene, truth, off = world(name, power)
        loc = dj.Locator.from_offline(off, "cells")
        xt, rt = labeled_snapshots(scene, num, 1, salt=10_000, model=truth)[:2]
        xt = np.asarray(xt)
        if args.adversarial:
            rows += adversarial(name, power, loc, truth, xt, rt)
            continue
        off_loc = loc.replace(max_excluded=0)  # the same Locator without fault exclusion
        for each in (loc, off_loc):
            each(rt)  # compile
        passes = [
            (timed(lambda rt=rt, loc=loc: loc(rt)), timed(lambda rt=rt, o=off_loc: o(rt))[1])
            for _ in range(5)
        ]  # interleaved: both saw the machine alike
        (clean, t_clean), t_off = sorted(passes, key=lambda p: p[0][1])[2]
        t_off = sorted(p[1] for p in passes)[2]
        rng = np.random.default_rng(0)
        cases = [("none", 0)] + [(kind, k) for kind in FAULT_KINDS for k in args.faulty]
        for kind, k in cases:
            mask = fault_mask(rng, num, k, kind)
            rf = rt if k == 0 else inject_faults(jax.random.key(k), rt, jnp.asarray(mask), kind)
            if k == 0:
                out, seconds = clean, t_clean
            else:
                loc(rf)  # compile the exclusion paths (and the re-run of overflowing rows)
                out, seconds = timed(lambda rf=rf, loc=loc: loc(rf))
            err = np.linalg.norm(np.asarray(out.x) - xt, axis=1)
            peb = np.asarray(
                jax.vmap(bounds.subset_peb_unchecked, in_axes=(0, None, 0))(
                    jnp.asarray(xt), truth, jnp.asarray(mask)
                )
            )
            level = np.asarray(
                jax.vmap(bounds.protection_level_unchecked, in_axes=(0, None, 0, None, 0))(
                    out.x, loc.fine_model, out.excluded, RISK, out.cost
                )
            )
            rejected = np.asarray(out.rejected)
            excluded = np.asarray(out.excluded)
            ok = ~rejected
            healthy = ~mask
            row = dict(
                world=name,
                power_dbm=power,
                fault=kind,
                k=k,
                num=num,
                rmse_over_peb=float(np.sqrt(np.mean(err[ok] ** 2)) / np.mean(peb[ok]))
                if ok.any()
                else None,
                p99_m=float(np.quantile(err, 0.99)),
                max_m=float(err.max()),
                rejected=float(rejected.mean()),
                confident_wrong=float(np.mean(ok & (err > 1e-3))),
                recall=float(np.mean(np.all(excluded >= mask, axis=1))) if k else None,
                false_exclusion=float(np.sum(excluded & healthy) / np.sum(healthy)),
                # the protection level at risk RISK under the Locator's own model: how often
                # an accepted answer's error exceeds it, and its median over the PEB
                beyond_protection=float(np.mean(ok & (err > level))),
                protection_over_peb=float(np.median(level[ok] / peb[ok])) if ok.any() else None,
                cost_ratio=seconds / t_clean,
            )
            if k == 0:
                row["ms_per_snapshot"] = 1e3 * t_clean / num
                row["off_ms_per_snapshot"] = 1e3 * t_off / num
                row["cost_vs_no_exclusion"] = t_clean / t_off
            rows.append(row)
            print(row, flush=True)
    if args.adversarial:
        print_table(
            rows,
            [
                ("world", "world", "s"),
                ("power_dbm", "P dBm", ".0f"),
                ("max_excluded", "max excl", "d"),
                ("fault", "fault", "s"),
                ("k", "k", "d"),
                ("accepted", "accepted", ".3f"),
                ("min_redundancy", "min redund", "d"),
                ("most_excluded", "most out", "d"),
                ("beyond_protection", "err > PL", ".4f"),
                ("confident_wrong", "wrong, kept", ".3f"),
            ],
        )
        write_json(args.json, rows)
        return
    print_table(
        rows,
        [
            ("world", "world", "s"),
            ("power_dbm", "P dBm", ".0f"),
            ("fault", "fault", "s"),
            ("k", "k", "d"),
            ("rmse_over_peb", "RMSE/PEB", ".2f"),
            ("p99_m", "p99 m", ".2e"),
            ("rejected", "rejected", ".3f"),
            ("confident_wrong", "wrong, kept", ".3f"),
            ("recall", "recall", ".3f"),
            ("false_exclusion", "false excl", ".4f"),
            ("beyond_protection", "err > PL", ".4f"),
            ("protection_over_peb", "PL/PEB", ".1f"),
            ("cost_ratio", "cost x", ".1f"),
        ],
    )
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
