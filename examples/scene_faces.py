"""Beyond the box: a room with a pillar, a metal cabinet and a floor of two materials, as a
scene of finite faces; its PEB map, the calibration of its materials, and positioning.

The world (``datasets.synthetic_deployment(world="faces")``, hidden from every method): the
paper's 17 ceiling APs (phase centres off by N(0, 5 mm) laterally, offsets uniform in
[-pi, pi)) in :func:`dmimo_jax.datasets.face_scene`: a floor of concrete (x < 5 m) and
floorboard, brick walls, a plasterboard ceiling, a 0.6 x 0.6 m concrete pillar from floor to
ceiling and a 0.8 x 0.6 x 1.9 m metal cabinet, LoS and first-order bounces with shadows
(``dj.MeshModel``). The nominal model: the same faces, every dielectric guessed concrete.

1. The PEB map at z = 1 m of the world and of the box room of the same materials without the
   pillar and the cabinet (their ratio shows the shadows): ``OUT_peb.png``.
2. ``examples/deployment.py --world faces``: L = 50 labeled snapshots; rows for the nominal
   face model + MLE, the box room calibrated (phase centres, offsets, its surfaces) + MLE, the
   face model calibrated (phase centres, offsets, one permittivity per face name) + MLE, the
   learned online stage under the calibrated face model, the true scene + MLE.

    python examples/scene_faces.py            # 1280 test UEs, cpu preset
    python examples/scene_faces.py --quick    # 256 test UEs, quick preset

Every MLE row is the certified lambda/8 table search + refinement (a lambda/4 table misses in
this scene: 0.66 m RMSE for the true scene's MLE, measured); the tables of a scene of faces
cost about 90 us per point on this CPU (2.4 M points each).

Writes ``OUT.json`` (PEB map summary, rows, calibration tables), ``OUT.png`` (error CDFs)
and ``OUT_peb.png``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import deployment  # noqa: E402
from _helpers import pyplot, save_figure, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.datasets import synthetic_deployment  # noqa: E402

BOX_MATERIALS = dict(floor="concrete", ceiling="plasterboard", walls="brick")


def peb_maps(truth, height=1.0, step=0.1):
    """PEB on a plan-view grid at ``height``: the scene of faces (NaN inside solids) and the
    box room of its wall/ceiling materials and a concrete floor."""
    scene = truth.scene
    lo, hi = np.asarray(scene.ue_low), np.asarray(scene.ue_high)
    gx = np.arange(lo[0], hi[0] + 1e-9, step)
    gy = np.arange(lo[1], hi[1] + 1e-9, step)
    pts = np.stack(np.meshgrid(gx, gy, indexing="xy"), -1).reshape(-1, 2)
    pts = np.c_[pts, np.full(len(pts), height)]
    air = truth.in_air(pts, clearance=0.02)
    faces = np.full(len(pts), np.nan)
    faces[air] = np.asarray(dj.peb_map(jax.numpy.asarray(pts[air]), truth))
    box = dj.room_model(scene, **BOX_MATERIALS)
    boxed = np.asarray(dj.peb_map(jax.numpy.asarray(pts), box))
    return gx, gy, faces.reshape(len(gy), len(gx)), boxed.reshape(len(gy), len(gx))


def plot_peb(gx, gy, faces, boxed, truth, path):
    plt = pyplot()
    if plt is None:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.6))
    ext = (gx[0], gx[-1], gy[0], gy[-1])
    im = axes[0].imshow(np.log10(faces * 1e6), origin="lower", extent=ext, cmap="viridis")
    fig.colorbar(im, ax=axes[0], label="log10 PEB (um)")
    axes[0].set(title="PEB of the scene of faces, z = 1 m", xlabel="x (m)", ylabel="y (m)")
    im = axes[1].imshow(faces / boxed, origin="lower", extent=ext, cmap="magma", vmin=0, vmax=3)
    fig.colorbar(im, ax=axes[1], label="PEB(faces) / PEB(box room)")
    axes[1].set(title="ratio to the box room: the shadows", xlabel="x (m)")
    ap = np.asarray(truth.scene.ap_positions)
    for ax in axes:
        ax.plot(ap[:, 0], ap[:, 1], "w^", ms=5)
    save_figure(fig, path)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="256 UEs, the quick preset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/scene_faces"))
    ap.add_argument("--cache", type=pathlib.Path, default=None)
    ap.add_argument("--repeats", type=int, default=1, help="timed passes per row (median)")
    ap.add_argument(
        "--mle-starts",
        type=int,
        default=16,
        help="MLE rows: the most coherent table points refined, lowest cost wins (1: EGS + one "
        "refinement, which misses UEs whose table optimum lies across a shadow boundary)",
    )
    args = ap.parse_args(argv)
    truth = synthetic_deployment(seed=args.seed, world="faces").truth
    gx, gy, faces, boxed = peb_maps(truth)
    ratio = faces / boxed
    peb = dict(
        height_m=1.0,
        step_m=0.1,
        points=int(np.isfinite(faces).sum()),
        median_peb_m=float(np.nanmedian(faces)),
        p99_peb_m=float(np.nanpercentile(faces, 99)),
        median_ratio_to_box=float(np.nanmedian(ratio)),
        fraction_ratio_above_1_5=float(np.nanmean(ratio > 1.5)),
        max_ratio_to_box=float(np.nanmax(ratio)),
    )
    print(
        f"PEB map at z = 1 m: median {peb['median_peb_m']:.3e} m, p99 {peb['p99_peb_m']:.3e} m; "
        f"ratio to the box room median {peb['median_ratio_to_box']:.2f}, "
        f"{100 * peb['fraction_ratio_above_1_5']:.1f}% above 1.5x, max {peb['max_ratio_to_box']:.1f}"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_peb(gx, gy, faces, boxed, truth, args.out.with_name(args.out.name + "_peb.png"))
    dep_args = ["--world", "faces", "--no-baselines", "--seed", str(args.seed)]
    dep_args += ["--out", str(args.out), "--json", str(args.out.with_suffix(".json"))]
    if args.cache is not None:
        dep_args += ["--cache", str(args.cache)]
    dep_args += ["--repeats", str(args.repeats), "--mle-starts", str(args.mle_starts)]
    if args.quick:  # the MLE rows keep their lambda/8 tables: at lambda/4 the table search
        dep_args += ["--quick", "--preset", "quick"]  # misses in this scene (0.66 m RMSE)
    result = deployment.main(dep_args)
    result["peb_map"] = peb
    write_json(args.out.with_suffix(".json"), result)
    return result


if __name__ == "__main__":
    main()
