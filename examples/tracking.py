"""Moving UEs (beyond the paper): a walking UE tracked from its carrier phases, against the
posterior bound, the single-snapshot PEB and single-snapshot positioning.

Per power: UEs walk through the paper's scene (constant velocity, sigma_a = 1 m/s^2 per
axis, 1.5 m/s horizontal start, bouncing at the UE region's faces) with 100 Hz snapshots
(eq. 8, a fresh CPO each). The first 5 snapshots are positioned by the single-snapshot
pipeline (lambda/8 EGS + refinement under the matched model; --single-divisor sets the 8);
their medoid starts the tracker (iterated EKF with profiled CPOs, lock test, lattice
re-acquisition); the tracker then runs twice, once on every snapshot and once with a 1 s
outage (no snapshots). The same pipeline positions a sample of the snapshots on their own.
Errors count after the first second; "lock" is an error below lambda/4, over the steps
with a snapshot.

    python examples/tracking.py                      # PNGs + JSON in out/tracking
    python examples/tracking.py --quick              # a smoke run (seconds)
    python examples/tracking.py --powers-dbm -10 -68 --num-ues 64 --seconds 10 --json t.json
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import jax

jax.config.update("jax_enable_x64", True)  # physics and estimation in float64 (entry point)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from tqdm import tqdm  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _helpers import pyplot, save_figure, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax import tracking  # noqa: E402
from dmimo_jax.benchmarking import check_options, read_rows  # noqa: E402
from dmimo_jax.estimators import egs, phasor_table, refine_batch, search_grid  # noqa: E402

DT = 0.01  # 100 Hz snapshots
SIGMA_A = 1.0  # m/s^2
SPEED = 1.5  # m/s, walking

COLUMNS = [
    ("power_dbm", "P dBm", ".0f"),
    ("rmse_m", "track m", ".3g"),
    ("pcrb_m", "PCRB m", ".3g"),
    ("mean_peb_m", "PEB m", ".3g"),
    ("single_rmse_m", "single m", ".3g"),
    ("single_outside_lobe_fraction", "single>l/4", ".3f"),
    ("lock_fraction", "lock", ".4f"),
    ("lock_fraction_outage", "lock(out)", ".4f"),
    ("rmse_locked_m", "locked m", ".3g"),
    ("pcrb_locked_m", "PCRB lk m", ".3g"),
    ("locked_flag_wrong_fraction", "flag wrong", ".4f"),
    ("ms_per_update_per_ue", "ms/upd/UE", ".3f"),
]


def paths(key, scene, num_ues, num_steps):
    """Walking paths: random start in the region, 1.5 m/s in a random horizontal direction."""
    motion = tracking.ConstantVelocity(SIGMA_A, region=scene)
    k_x, k_dir, k_path = jax.random.split(key, 3)
    x0 = dj.sample_positions(k_x, num_ues, scene)
    heading = jax.random.uniform(k_dir, (num_ues,), maxval=2 * np.pi)
    v0 = SPEED * jnp.stack([jnp.cos(heading), jnp.sin(heading), jnp.zeros(num_ues)], axis=1)
    keys = jax.random.split(k_path, num_ues)
    sim = jax.vmap(tracking.simulate_trajectory, in_axes=(0, None, 0, 0, None, None))
    return motion, sim(keys, motion, x0, v0, num_steps, DT)


class SingleSnapshot:
    """lambda/8 EGS (certified table screen) + refinement under the matched model
    (``divisor``: the grid's spacing lambda/divisor)."""

    def __init__(self, scene, divisor: int = 8):
        grid = search_grid(scene, scene.wavelength / divisor)
        self.table = phasor_table(dj.TwoRayModel(scene), grid)

    def __call__(self, r, model):
        res = egs(r, model, self.table)
        return np.asarray(refine_batch(res.x, r, model).x)


def run_power(power_dbm, args, single: SingleSnapshot) -> tuple[dict, dict]:
    scene = dj.paper_scene(power_dbm)
    model = dj.TwoRayModel(scene)
    lam = float(scene.wavelength)
    num_steps = int(round(args.seconds / DT)) + 1
    key = jax.random.PRNGKey(args.seed)
    k_path, k_snap, k_pick = jax.random.split(key, 3)
    motion, truth = paths(k_path, scene, args.num_ues, num_steps)
    snap_keys = jax.random.split(k_snap, args.num_ues)
    r = jax.vmap(tracking.simulate_track_phases, in_axes=(0, None, 0))(
        snap_keys, model, truth.positions
    )  # (N, T, M)

    # single-snapshot pipeline: the first snapshots (the tracker's start: their medoid)
    # and a sample
    k0 = args.start_snapshots
    x_firsts = single(r[:, :k0].reshape(-1, r.shape[-1]), model).reshape(args.num_ues, k0, 3)
    x_first = x_firsts[:, 0]
    x_start = np.asarray(tracking.medoid_start(x_firsts))
    rng = np.random.default_rng(args.seed)
    ue = rng.integers(0, args.num_ues, args.num_single)
    step = rng.integers(1, num_steps, args.num_single)
    t0 = time.perf_counter()
    x_single = single(r[ue, step], model)
    single_ms = 1e3 * (time.perf_counter() - t0) / args.num_single
    e_single = np.linalg.norm(x_single - np.asarray(truth.positions[ue, step]), axis=1)
    show = np.arange(1, num_steps, max(1, (num_steps - 1) // 40))  # UE 0, for the plot
    x_show = single(r[0, show], model)

    # the tracker, started from the medoid (the UE moves up to ~6 cm over those
    # snapshots: the start's standard deviation), acquiring from its first window
    # the single-snapshot stage's table also serves the tracker's global re-acquisition
    # (re-acquisitions that keep failing re-centre on the window's table searches)
    settings = tracking.TrackerSettings(relinearize=not args.chord)
    tracker = tracking.Tracker(model, motion, dt=DT, settings=settings, table=single.table)
    init = jax.vmap(lambda x: tracker.init(x, position_std=SPEED * DT * k0))
    state0 = init(jnp.asarray(x_start))
    rs = jnp.swapaxes(r[:, 1:], 0, 1)  # (T-1, N, M)
    true = np.swapaxes(np.asarray(truth.positions[:, 1:]), 0, 1)
    _, out = tracking.run_tracker(tracker, state0, rs)
    jax.block_until_ready(out)
    t0 = time.perf_counter()  # timed again, compiled: acquisitions included, compilation not
    jax.block_until_ready(tracking.run_tracker(tracker, state0, rs))
    wall = time.perf_counter() - t0
    valid = np.ones(rs.shape[:2], bool)
    o0 = min(int(round(args.outage_start / DT)), rs.shape[0])
    o1 = min(o0 + int(round(args.outage / DT)), rs.shape[0])
    valid[o0:o1] = False
    _, out_o = tracking.run_tracker(tracker, state0, rs, jnp.asarray(valid))

    err = np.linalg.norm(np.asarray(out.position) - true, axis=-1)  # (T-1, N)
    err_o = np.linalg.norm(np.asarray(out_o.position) - true, axis=-1)
    after = slice(int(round(1.0 / DT)) - 1, None)  # snapshots after the first second
    pcrb = jax.vmap(lambda xs, c: tracking.pcrb(model, motion, xs, DT, c))(
        truth.positions[:, 1:], state0.cov
    )
    pcrb_m = np.asarray(tracking.pcrb_position_rmse(pcrb)).T  # (T-1, N)
    peb = np.asarray(dj.peb_map(truth.positions[:, 1:].reshape(-1, 3), model))
    peb = peb.reshape(args.num_ues, -1).T
    e = np.asarray(out.position) - true
    nees = np.einsum("tni,tnij,tnj->tn", e, np.linalg.inv(np.asarray(out.position_cov)), e)
    locked = err[after] < lam / 4
    locked_o = err_o[after] < lam / 4
    flagged = np.asarray(out.locked)[after]
    snap = valid[after]
    row = dict(
        power_dbm=float(power_dbm),
        rmse_m=float(np.sqrt(np.mean(err[after] ** 2))),
        pcrb_m=float(np.sqrt(np.mean(pcrb_m[after] ** 2))),
        mean_peb_m=float(np.mean(peb[after])),
        rms_peb_m=float(np.sqrt(np.mean(peb[after] ** 2))),
        single_rmse_m=float(np.sqrt(np.mean(e_single**2))),
        single_median_m=float(np.median(e_single)),
        single_outside_lobe_fraction=float(np.mean(e_single > lam / 4)),
        single_first_outside_lobe_fraction=float(
            np.mean(np.linalg.norm(x_first - np.asarray(truth.positions[:, 0]), axis=1) > lam / 4)
        ),
        start_outside_lobe_fraction=float(
            np.mean(np.linalg.norm(x_start - np.asarray(truth.positions[:, 0]), axis=1) > lam / 4)
        ),
        lock_fraction=float(np.mean(locked)),
        # over the steps within lambda/4: the tracker's accuracy where it holds the lobe
        rmse_locked_m=float(np.sqrt(np.mean(err[after][locked] ** 2))),
        pcrb_locked_m=float(np.sqrt(np.mean(pcrb_m[after][locked] ** 2))),
        locked_flag_fraction=float(np.mean(flagged)),
        locked_flag_wrong_fraction=float(np.mean(flagged & ~locked)),
        lock_fraction_outage=float(np.mean(locked_o[snap])),
        lock_fraction_outage_all_steps=float(np.mean(locked_o)),
        median_error_outage_end_m=float(np.median(err_o[o1 - 1])) if o1 > o0 else 0.0,
        rmse_outage_m=float(np.sqrt(np.mean(err_o[after][snap] ** 2))),
        mean_nees=float(np.mean(nees[after])),  # 3 when the filter is consistent
        restarts_per_ue=float(np.mean(np.sum(np.asarray(out.reacquired), axis=0))),
        restarts_per_ue_outage=float(np.mean(np.sum(np.asarray(out_o.reacquired), axis=0))),
        ms_per_update_per_ue=1e3 * wall / (rs.shape[0] * rs.shape[1]),
        single_ms_per_snapshot=single_ms,
        num_ues=args.num_ues,
        seconds=args.seconds,
        outage_s=args.outage,
        num_single=args.num_single,
        seed=args.seed,
        relinearize=not args.chord,
    )
    curves = dict(
        t=np.arange(1, num_steps) * DT,
        err=err,
        err_o=err_o,
        pcrb=pcrb_m,
        peb=peb,
        truth0=np.asarray(truth.positions[0]),
        track0=np.asarray(out.position[:, 0]),
        single0=x_show,
        single_t=show * DT,
        single_err0=np.linalg.norm(x_show - np.asarray(truth.positions[0, show]), axis=1),
        outage=(o0 * DT + DT, o1 * DT + DT),
    )
    return row, curves


def print_rows(rows):
    widths = [max(len(h), 9) for _, h, _ in COLUMNS]
    print("  ".join(h.rjust(w) for (_, h, _), w in zip(COLUMNS, widths, strict=True)))
    for r in rows:
        print(
            "  ".join(
                format(r[k], f).rjust(w) for (k, _, f), w in zip(COLUMNS, widths, strict=True)
            )
        )


def plot(curves_by_power, out_dir: pathlib.Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    powers = sorted(curves_by_power)
    fig, axes = plt.subplots(1, len(powers), figsize=(5 * len(powers), 4.5), squeeze=False)
    for ax, p in zip(axes[0], powers, strict=True):
        c = curves_by_power[p]
        ax.plot(c["truth0"][:, 0], c["truth0"][:, 1], "k-", lw=2, label="truth")
        ax.plot(c["track0"][:, 0], c["track0"][:, 1], "C0--", label="tracker")
        ax.plot(c["single0"][:, 0], c["single0"][:, 1], "C3x", label="single snapshot")
        ax.set(xlabel="x (m)", ylabel="y (m)", title=f"UE 0, {p:.0f} dBm")
        ax.set_aspect("equal", adjustable="datalim")
    save_figure(fig, out_dir / "tracking_trajectory.png")
    fig, axes = plt.subplots(1, len(powers), figsize=(5 * len(powers), 4.5), squeeze=False)
    for ax, p in zip(axes[0], powers, strict=True):
        c = curves_by_power[p]
        t = c["t"]
        ax.semilogy(t, np.sqrt(np.mean(c["err"] ** 2, axis=1)), "C0", label="tracker RMSE")
        ax.semilogy(t, np.sqrt(np.mean(c["err_o"] ** 2, axis=1)), "C1", label="with 1 s outage")
        ax.semilogy(t, np.sqrt(np.mean(c["pcrb"] ** 2, axis=1)), "k--", label="PCRB")
        ax.semilogy(t, np.mean(c["peb"], axis=1), "k:", label="single-snapshot PEB")
        ax.semilogy(c["single_t"], c["single_err0"], "C3x", label="single snapshot (UE 0)")
        ax.axvspan(*c["outage"], color="0.9")
        ax.set(xlabel="time (s)", ylabel="position error (m)", title=f"{p:.0f} dBm")
    save_figure(fig, out_dir / "tracking_error.png")


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--powers-dbm", type=float, nargs="+", default=None, help="default -10 -60 -69 -72"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--num-ues", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--outage", type=float, default=1.0, help="outage length, s")
    ap.add_argument("--outage-start", type=float, default=2.0, help="s after the start")
    ap.add_argument("--num-single", type=int, default=256, help="single-snapshot sample")
    ap.add_argument(
        "--start-snapshots", type=int, default=5, help="first snapshots whose medoid starts"
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="-10 and -69 dBm (unless --powers-dbm), 6 UEs, 2.5 s (smoke run)",
    )
    ap.add_argument(
        "--single-divisor",
        type=int,
        default=8,
        help="the single-snapshot pipeline's EGS grid spacing lambda/d",
    )
    ap.add_argument("--resume", action="store_true", help="keep powers already in --json")
    ap.add_argument(
        "--chord",
        action="store_true",
        help="TrackerSettings(relinearize=False): chord second steps",
    )
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/tracking"))
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    if args.quick:
        args.powers_dbm = args.powers_dbm or [-10.0, -69.0]
        args.num_ues, args.seconds, args.outage_start, args.num_single = 6, 2.5, 1.2, 32
    args.powers_dbm = args.powers_dbm or [-10.0, -60.0, -69.0, -72.0]
    if args.seconds < args.outage_start + args.outage or args.outage_start < 1.0:
        ap.error("need 1 <= --outage-start and --outage-start + --outage <= --seconds")
    check_options(single_divisor=args.single_divisor)
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = args.json or args.out / "tracking.json"
    done = {}
    if args.resume and json_path.exists():
        done = {r["power_dbm"]: r for r in read_rows(json_path)}
    # the lambda/8 table (3.9 M points, about 1 GB, 10-15 s on 2 cores) is built only when
    # a power is left to run: a resumed run that finds every power computes nothing
    single = None
    rows, curves = [], {}
    for p in tqdm(args.powers_dbm, desc="powers"):
        if float(p) in done:
            rows.append(done[float(p)])
            continue
        if single is None:
            single = SingleSnapshot(dj.paper_scene(), args.single_divisor)
        row, curves[p] = run_power(p, args, single)
        rows.append(row)
        write_json(json_path, rows)  # after every power: an interrupted run resumes
    print_rows(rows)
    if curves:
        plot(curves, args.out)
    return rows


if __name__ == "__main__":
    main()
