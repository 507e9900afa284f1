"""Cost of the scene-of-faces model against the number of faces, next to the box room.

Rows (float64, the mean phases of N UEs in the air, jit + ``lax.map`` in batches; every row
timed in turn within each repeat):
  image_source_box : ``ImageSourceModel`` of the paper's box room (6 infinite planes)
  faces_box        : the same box as 6 faces (``MeshModel``; nothing can block)
  faces_F          : the box plus (F - 6) / 5 random cabinets (5 faces each, metal or
                     concrete) standing on the floor: F = 11, 31, 101, 301 by default

The cost grows as (faces that reflect) x (faces that can block); the room's enclosure never
blocks (``physics.occluders``). Rows with many faces run on fewer UEs (``--n-large``); the
table reports microseconds per UE and the ratio to the image-source box.

    python benchmarks/face_cost.py                       # 10 000 UEs, faces 11/31/101/301
    python benchmarks/face_cost.py --json out/face_cost.json
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from _common import device_name, print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.datasets import sample_world_positions  # noqa: E402
from dmimo_jax.physics import box_faces, cuboid_faces  # noqa: E402


def scene_of(scene, num_cabinets, seed=0):
    """The box room with ``num_cabinets`` random cabinets (5 faces each), no two overlapping."""
    f = float(scene.frequency)
    faces = list(
        box_faces(scene.room_size, floor="concrete", ceiling="plasterboard", walls="brick",
                  frequency_hz=f)
    )  # fmt: skip
    rng = np.random.default_rng(seed)
    placed = []
    while len(placed) < num_cabinets:
        c = rng.uniform([0.8, 0.8], [9.2, 9.2])
        half = rng.uniform(0.05, 0.25, 2)
        if any(np.all(np.abs(c - pc) < half + ph + 0.02) for pc, ph in placed):
            continue
        placed.append((c, half))
        top = rng.uniform(0.5, 3.0)
        mat = None if rng.random() < 0.3 else "concrete"
        faces += cuboid_faces((*(c - half), 0.0), (*(c + half), top), mat,
                              name=f"cabinet{len(placed)}", frequency_hz=f, skip=("z0",))  # fmt: skip
    return faces


def timed(fn, xs, repeats):
    jax.block_until_ready(fn(xs))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(xs))
        times.append(time.perf_counter() - t0)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000, help="UEs for rows up to 31 faces")
    ap.add_argument("--n-large", type=int, default=500, help="UEs for rows above 31 faces")
    ap.add_argument("--faces", type=int, nargs="+", default=[11, 31, 101, 301])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=pathlib.Path, default=None)
    args = ap.parse_args(argv)
    if any((f - 6) % 5 for f in args.faces):
        raise ValueError(f"--faces must be 6 + 5 k (a box and k cabinets), got {args.faces}")
    scene = dj.paper_scene(-10.0, convention="itu")
    models = {
        "image_source_box": dj.room_model(
            scene, floor="concrete", ceiling="plasterboard", walls="brick"
        ),
        "faces_box": dj.MeshModel(scene, scene_of(scene, 0)),
    }
    for f in args.faces:
        models[f"faces_{f}"] = dj.MeshModel(scene, scene_of(scene, (f - 6) // 5))
    rows = []
    for name, model in models.items():
        num_faces = len(getattr(model, "faces", getattr(model, "reflectors", ())))
        n = args.n if num_faces <= 31 else args.n_large
        xs = sample_world_positions(jax.random.key(0), n, model, clearance=0.01)
        batch = max(1, min(500, 20_000 // max(num_faces, 1) ** 2 * 10))
        fn = jax.jit(lambda xs, model=model, batch=batch: jax.lax.map(model._mean, xs,
                                                                       batch_size=batch))  # fmt: skip
        t0 = time.perf_counter()
        jax.block_until_ready(fn(xs))
        first = time.perf_counter() - t0
        times = timed(fn, xs, args.repeats)
        rows.append(
            dict(
                method=name,
                faces=num_faces,
                blockers=len(getattr(model, "blockers", ())),
                n_ues=n,
                first_call_s=first,
                median_s=float(np.median(times)),
                us_per_ue=float(np.median(times)) / n * 1e6,
                device=device_name(),
            )
        )
        print(f"{name}: {rows[-1]['us_per_ue']:.1f} us / UE", flush=True)
    base = rows[0]["us_per_ue"]
    for r in rows:
        r["ratio_vs_image_source_box"] = r["us_per_ue"] / base
        r["seconds_per_10k_ues"] = r["us_per_ue"] * 1e-2
    print(f"Mean phases of UEs in scenes of faces, 17 APs, first order, {device_name()}")
    print_table(
        rows,
        [
            ("method", "model", "s"),
            ("faces", "faces", "d"),
            ("blockers", "blockers", "d"),
            ("n_ues", "UEs", "d"),
            ("first_call_s", "first call s", ".2f"),
            ("us_per_ue", "us / UE", ".1f"),
            ("seconds_per_10k_ues", "s / 10k UEs", ".2f"),
            ("ratio_vs_image_source_box", "ratio", ".1f"),
        ],
    )
    write_json(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
