"""Sionna RT's bundled scenes through ``load_mitsuba``: load, orient, evaluate (or refuse).

The scenes are not the project's: pass the ``scenes`` folder of a Sionna RT checkout
(``src/sionna/rt/scenes`` in its public repository). Per scene: the faces and sheets
``load_mitsuba(xml, frequency_hz=3.5e9)`` returns and the time it takes; then, with 8 APs
drawn in the air at 2.5-4 m, the fraction of 1,000 random points at 1.5 m that
``MeshModel.in_air`` calls in the air, its agreement with an orientation-free count (an
upward ray's crossings of the faces that are not sheets: odd is inside a solid; for a room
around the scene every point is inside it, so there the count is not a reference), the same
with the files' normals trusted (``orient=False``), and whether the phases of 16 UEs are
finite. A scene whose paths need more memory than a position may take is refused by
``MeshModel`` with its size; the row says so.

    python benchmarks/sionna_scenes.py --scenes PATH/src/sionna/rt/scenes \
        --json out/sionna_scenes.json
    python benchmarks/sionna_scenes.py --scenes PATH --names box simple_street_canyon
"""

from __future__ import annotations

import argparse
import pathlib
import time

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _common import print_table, write_json  # noqa: E402

import dmimo_jax as dj  # noqa: E402
from dmimo_jax.datasets import load_mitsuba  # noqa: E402

FREQUENCY_HZ = 3.5e9
NAMES = ("box", "box_one_screen", "box_two_screens", "floor_wall", "simple_reflector",
         "simple_street_canyon", "munich")  # fmt: skip


def scene_of(aps: np.ndarray, low, high) -> dj.Scene:
    return dj.Scene(ap_positions=aps, wavelength=299792458.0 / FREQUENCY_HZ, eps_r=5.24 - 0.87j,
                    tx_power=1e-4, noise_power=1e-13, ue_low=low, ue_high=high)  # fmt: skip


def upward_crossings_odd(faces, pts: np.ndarray) -> np.ndarray:
    """Whether an upward ray from each point crosses an odd number of non-sheet faces."""
    count = np.zeros(len(pts), int)
    for f in faces:
        v, n = np.asarray(f.vertices), np.asarray(f.normal)
        if f.sheet or abs(n[2]) < 1e-12:
            continue
        t = ((v[0] - pts) @ n) / n[2]
        hit = pts + t[:, None] * np.array([0.0, 0.0, 1.0])
        w = np.cross(n, np.roll(v, -1, 0) - v)
        inside = np.all(hit @ w.T - np.sum(w * v, axis=1) >= 0, axis=1)
        count += (t > 0) & inside
    return count % 2 == 1


def in_air_fraction(faces, pts, cand):
    """(in_air (P,), a model with APs in the air) or (None, the refusal)."""
    for c in cand:  # a first AP in the air: MeshModel refuses one inside a solid
        try:
            probe = dj.MeshModel(scene_of(c[None], [0, 0, 0.5], [1, 1, 1]), faces)
            break
        except ValueError as e:
            if "inside a solid" not in str(e):
                return None, str(e)
    else:
        return None, "no AP position in the air"
    aps = cand[probe.in_air(cand, clearance=0.2)][:8]
    return probe.in_air(pts), aps


def measure(root: pathlib.Path, name: str, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    xml = root / name / f"{name}.xml"
    start = time.perf_counter()
    faces = load_mitsuba(xml, frequency_hz=FREQUENCY_HZ)
    row = {"scene": name, "faces": len(faces), "sheets": sum(f.sheet for f in faces),
           "load_s": time.perf_counter() - start}  # fmt: skip
    v = np.concatenate([np.asarray(f.vertices) for f in faces])
    lo, hi = v.min(axis=0), v.max(axis=0)
    pts = np.c_[
        rng.uniform(lo[0], hi[0], 1000), rng.uniform(lo[1], hi[1], 1000), np.full(1000, 1.5)
    ]
    cand = np.c_[rng.uniform(lo[:2], hi[:2], (400, 2)), rng.uniform(2.5, 4.0, 400)]
    start = time.perf_counter()
    air, aps = in_air_fraction(faces, pts, cand)
    if air is None:
        row.update(refused=aps, refuse_s=time.perf_counter() - start)
        return row
    reference = ~upward_crossings_odd(faces, pts)
    trusted = load_mitsuba(xml, frequency_hz=FREQUENCY_HZ, orient=False)
    air_trusted, _ = in_air_fraction(trusted, pts, cand)
    model = dj.MeshModel(scene_of(aps, lo + 0.5, np.r_[hi[:2] - 0.5, 2.0]), faces)
    xs = jnp.asarray(pts[air & model.in_air(pts, clearance=0.1)][:16])
    mean = jax.vmap(model.mean)(xs)
    row.update(
        in_air=float(air.mean()),
        agree=float(np.mean(air == reference)),
        agree_trusted=None if air_trusted is None else float(np.mean(air_trusted == reference)),
        evaluated=int(len(xs)),
        finite=bool(np.all(np.isfinite(np.asarray(mean)))),
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenes", type=pathlib.Path, required=True,
                        help="the scenes folder of a Sionna RT checkout")  # fmt: skip
    parser.add_argument("--names", nargs="+", default=list(NAMES), help="the scenes to load")
    parser.add_argument("--seed", type=int, default=0, help="the points' and APs' draw")
    parser.add_argument("--json", type=pathlib.Path, default=None, help="write the rows here")
    args = parser.parse_args()
    rows = []
    for name in args.names:
        rows.append(measure(args.scenes, name, args.seed))
        print_table(rows[-1:], COLUMNS)
    print()
    print_table(rows, COLUMNS)
    for row in rows:
        if "refused" in row:
            print(f"{row['scene']}: refused in {row['refuse_s']:.1f} s: {row['refused']}")
    write_json(args.json, rows)


COLUMNS = [("scene", "scene", ">20"), ("faces", "faces", "d"), ("sheets", "sheets", "d"),
           ("load_s", "load [s]", ".1f"), ("in_air", "in air", ".3f"),
           ("agree", "agree", ".3f"), ("agree_trusted", "agree (file)", ".3f"),
           ("evaluated", "UEs", "d"), ("finite", "finite", "")]  # fmt: skip

if __name__ == "__main__":
    main()
