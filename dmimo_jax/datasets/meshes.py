r"""Scenes from the files ray tracers use: Wavefront OBJ, and Mitsuba XML with PLY meshes (the
format of Sionna RT and DiffeRT scenes), loaded into :class:`~dmimo_jax.physics.Face` s.

* :func:`load_obj`: one face per polygon, named by its ``usemtl`` material (else its ``o`` /
  ``g`` name);
* :func:`load_mitsuba`: every ``<shape type="ply">`` (or ``"obj"``) of the scene, named by its
  material: a ``<bsdf type="itu-radio-material">`` with a ``type`` string (Sionna RT >= 0.17),
  or a bsdf whose id reads ``mat-itu_<name>`` / ``itu_<name>`` (older Sionna and DiffeRT
  scenes);
* :func:`read_ply`: ASCII and binary PLY (vertices and polygon lists).

The coplanar triangles of one shape and one material are merged into one face where their
union is a convex polygon (a wall exported as two triangles becomes one quad; a shared
diagonal inside a wall is no edge of the scene). A material is a name of
:data:`~dmimo_jax.materials.ITU_MATERIALS` (evaluated at ``frequency_hz``; ``"metal"`` a
perfect conductor) unless ``materials={name: spec}`` says otherwise (a complex permittivity,
an ITU name or ``None`` for a perfect conductor). Faces' normals follow the files' vertex
order (right-hand rule), which must point to the air (:mod:`dmimo_jax.physics.faces`).

Transforms (``<transform name="to_world">``) are refused: bake them into the meshes.
"""

from __future__ import annotations

import pathlib
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
from jax.typing import ArrayLike

from dmimo_jax._checks import check_bool, check_finite
from dmimo_jax.materials import ITU_MATERIALS
from dmimo_jax.physics import Face
from dmimo_jax.physics.faces import check_polygon, has_zero_area, newell_normal

_PLY_TYPES = MappingProxyType({
    "char": "i1", "int8": "i1", "uchar": "u1", "uint8": "u1",
    "short": "i2", "int16": "i2", "ushort": "u2", "uint16": "u2",
    "int": "i4", "int32": "i4", "uint": "u4", "uint32": "u4",
    "float": "f4", "float32": "f4", "double": "f8", "float64": "f8",
})  # fmt: skip


def _ply_header(path: Any, data: bytes) -> tuple[str, list[list[Any]], int]:
    """``(format, elements, body offset)`` of a PLY file's header, each line checked (the
    header ends at the first line that is exactly ``end_header``: a comment may mention it).
    Elements are ``[name, count, [(property, type, list count type | None)]]``."""
    if not data.startswith(b"ply"):
        raise ValueError(f"{path} is not a PLY file (no 'ply' magic)")
    fmt, elements, pos, lineno = None, [], 0, 0
    while True:
        nl = data.find(b"\n", pos)
        if nl < 0:
            raise ValueError(f"{path} is not a PLY file (no 'end_header' line)")
        line = data[pos:nl].decode("ascii", "replace").strip()
        pos, lineno = nl + 1, lineno + 1
        words = line.split()
        where = f"{path}:{lineno}"
        if line == "end_header":
            break
        if not words or words[0] in ("ply", "comment", "obj_info"):
            continue
        if words[0] == "format":
            if len(words) < 2 or words[1] not in (
                "ascii",
                "binary_little_endian",
                "binary_big_endian",
            ):
                raise ValueError(f"{where}: unknown PLY format {line!r}")
            fmt = words[1]
        elif words[0] == "element":
            if len(words) != 3 or not words[2].isdigit():
                raise ValueError(f"{where}: expected 'element NAME COUNT', got {line!r}")
            elements.append([words[1], int(words[2]), []])
        elif words[0] == "property":
            if not elements:
                raise ValueError(f"{where}: a property before any element")
            if words[1:2] == ["list"]:
                if len(words) != 5:
                    raise ValueError(f"{where}: expected 'property list COUNT_TYPE TYPE NAME'")
                types, prop = (words[2], words[3]), (words[4], words[3], words[2])
            else:
                if len(words) != 3:
                    raise ValueError(f"{where}: expected 'property TYPE NAME', got {line!r}")
                types, prop = (words[1],), (words[2], words[1], None)
            unknown = [t for t in types if t not in _PLY_TYPES]
            if unknown:
                raise ValueError(
                    f"{where}: unknown PLY type {unknown[0]!r} (known: {sorted(_PLY_TYPES)})"
                )
            elements[-1][2].append(prop)
        else:
            raise ValueError(f"{where}: unexpected header line {line!r}")
    if fmt is None:
        raise ValueError(f"{path}: no 'format' line in the PLY header")
    return fmt, elements, pos


def read_ply(path: str | pathlib.Path) -> tuple[np.ndarray, list[np.ndarray]]:
    """``(vertices (V, 3) float64, polygons: list of index arrays)`` of a PLY file (ASCII,
    binary little or big endian; other vertex properties and elements are skipped).

    Raises:
        ValueError: not a PLY file, a malformed header line (with the file and line), an
            unknown type, a body shorter than its header announces or with a value that is
            not a number, no x/y/z vertex properties, or an index out of range.
    """
    data = pathlib.Path(path).read_bytes()
    fmt, elements, start = _ply_header(path, data)
    body = data[start:]
    order = "<" if fmt == "binary_little_endian" else ">"
    tokens = body.decode("ascii", "replace").split() if fmt == "ascii" else None
    pos = 0

    def short(name: str) -> ValueError:
        return ValueError(
            f"{path}: the file ends inside element {name!r}: shorter than its header announces "
            "(truncated?)"
        )

    def binary(typ: str, n: int, name: str) -> np.ndarray:
        nonlocal pos
        dt = np.dtype(order + _PLY_TYPES[typ])
        if pos + n * dt.itemsize > len(body):
            raise short(name)
        out = np.frombuffer(body, dt, n, pos)
        pos += n * dt.itemsize
        return out

    def text(n: int, name: str, cast: Any) -> list[Any]:
        nonlocal pos
        if pos + n > len(tokens):
            raise short(name)
        try:
            out = [cast(t) for t in tokens[pos : pos + n]]
        except ValueError:
            raise ValueError(
                f"{path}: element {name!r} holds a value that is not a number among "
                f"{tokens[pos : pos + n]}"
            ) from None
        pos += n
        return out

    vertices, polygons = None, []
    for name, count, props in elements:
        rows: list[dict[str, Any]] = []
        for _ in range(count):
            row = {}
            for prop, typ, list_type in props:
                if tokens is not None:
                    if list_type is None:
                        row[prop] = text(1, name, float)[0]
                    else:
                        n = text(1, name, int)[0]
                        row[prop] = np.array(text(n, name, int), int)
                elif list_type is None:
                    row[prop] = float(binary(typ, 1, name)[0])
                else:
                    n = int(binary(list_type, 1, name)[0])
                    row[prop] = binary(typ, n, name).astype(int)
            rows.append(row)
        if name == "vertex":
            if not rows or not all(k in rows[0] for k in "xyz"):
                raise ValueError(f"{path}: the vertex element needs x, y and z properties")
            vertices = np.array([[r["x"], r["y"], r["z"]] for r in rows], float)
        elif name == "face":
            key = next((p[0] for p in props if p[2] is not None), None)
            polygons = [np.asarray(r[key], int) for r in rows] if key else []
    if vertices is None:
        raise ValueError(f"{path}: no vertex element")
    for i, p in enumerate(polygons):
        if p.size and (p.min() < 0 or p.max() >= len(vertices)):
            raise ValueError(f"{path}: face {i} indexes a vertex out of range")
    return vertices, polygons


def triangulate(poly: np.ndarray) -> list[np.ndarray]:
    """The triangles (each (3, 3)) of a simple polygon (K, 3), concave or not, by ear
    clipping in its plane: they cover the polygon exactly once and keep its orientation
    (a fan from the first vertex covers a concave polygon's outside and flips triangles).

    Raises:
        ValueError: a polygon of zero area or one that crosses itself.
    """
    v = np.asarray(poly, float)
    n = newell_normal(v)
    norm = float(np.linalg.norm(n))
    if not norm > 0:
        raise ValueError("a mesh polygon has zero area: a degenerate face")
    n = n / norm
    e1 = np.cross(n, [1.0, 0, 0] if abs(n[0]) < 0.9 else [0, 1.0, 0])
    e1 /= np.linalg.norm(e1)
    uv = np.c_[v @ e1, v @ np.cross(n, e1)]  # counter-clockwise (Newell's normal)
    scale = float(np.ptp(uv, axis=0).max()) or 1.0
    tol = 1e-12 * scale * scale

    def cross(a: int, b: int, c: int) -> float:
        (ax, ay), (bx, by), (cx, cy) = uv[a], uv[b], uv[c]
        return float((bx - ax) * (cy - ay) - (by - ay) * (cx - ax))

    idx, out = list(range(len(v))), []
    while len(idx) > 3:
        for k in range(len(idx)):
            a, b, c = idx[k - 1], idx[k], idx[(k + 1) % len(idx)]
            turn = cross(a, b, c)
            if abs(turn) <= tol:  # b on the edge a-c: drop it
                idx.pop(k)
                break
            if turn < 0:  # a reflex vertex is no ear
                continue
            others = (j for j in idx if j not in (a, b, c))
            if any(
                cross(a, b, j) >= -tol and cross(b, c, j) >= -tol and cross(c, a, j) >= -tol
                for j in others
            ):
                continue
            out.append(v[[a, b, c]])
            idx.pop(k)
            break
        else:
            raise ValueError("a mesh polygon crosses itself: it has no triangulation")
    if abs(cross(*idx)) > tol:
        out.append(v[idx])
    return out


MERGE_TOLERANCE = 1e-6  # m: vertices closer than this (per axis) are one (at least 1e-9 of
# the scene's extent): absolute, so a millimetre box beside a 20 km ground keeps its shape


def _edge_pairs(
    users: list[tuple[int, bool]], a: np.ndarray, b: np.ndarray, centres: list[np.ndarray]
) -> list[tuple[tuple[int, bool], tuple[int, bool]]]:
    """The polygons of one edge (a -> b) paired into surfaces: two users are one pair; an
    even number (solids touching along the edge or a face: a cabinet on a cabinet) are
    paired with their neighbours in angle around the edge, the pairing (of the two) whose
    pairs the file's vertex order traverses in opposite directions most often; an odd
    number pairs none (a fin on a surface: no closed solid through it)."""
    if len(users) == 2:
        return [(users[0], users[1])]
    if len(users) % 2:
        return []
    u = (b - a) / np.linalg.norm(b - a)
    e1 = np.cross(u, [1.0, 0.0, 0.0] if abs(u[0]) < 0.9 else [0.0, 1.0, 0.0])
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(u, e1)
    w = np.array([centres[i] - a for i, _ in users])
    angle = np.round(np.arctan2(w @ e2, w @ e1), 9)
    # ties (coincident faces of two solids) alternate their directions where they can
    order = sorted(range(len(users)), key=lambda t: (angle[t], users[t][1]))
    ring = [users[t] for t in order]
    n = len(ring)
    pairings = [
        [(ring[t], ring[(t + 1) % n]) for t in range(start, n + start, 2)] for start in (0, 1)
    ]
    return max(pairings, key=lambda ps: sum(x[1] != y[1] for x, y in ps))


def _components(polygons: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Connectivity of polygons that share vertices by position (within
    ``MERGE_TOLERANCE``): per polygon, its component (polygons joined across the edges they
    pair on, :func:`_edge_pairs`), whether it must be reversed to traverse every such edge
    opposite to its neighbour, and whether its component is closed and consistently
    orientable (every edge of it paired)."""
    pts = np.concatenate([np.asarray(p, float) for p in polygons])
    scale = max(float(np.ptp(pts, axis=0).max()), 1e-300)
    quantum = max(MERGE_TOLERANCE, 1e-9 * scale)
    _, ids = np.unique(np.round(pts / quantum).astype(np.int64), axis=0, return_inverse=True)
    ids = ids.reshape(-1)
    where = np.zeros((int(ids.max()) + 1, 3))
    where[ids] = pts
    centres = [np.asarray(p, float).mean(axis=0) for p in polygons]
    edges: dict[tuple[int, int], list[tuple[int, bool]]] = {}
    start = 0
    for i, p in enumerate(polygons):
        k = ids[start : start + len(p)]
        start += len(p)
        for a, b in zip(k, np.roll(k, -1), strict=True):
            edges.setdefault((min(a, b), max(a, b)), []).append((i, bool(a < b)))
    neighbours: list[list[tuple[int, bool, bool]]] = [[] for _ in polygons]
    manifold = np.ones(len(polygons), bool)
    for (a, b), users in edges.items():
        pairs = _edge_pairs(users, where[a], where[b], centres)
        if not pairs:
            for i, _ in users:
                manifold[i] = False
        for (i, di), (j, dj) in pairs:
            neighbours[i].append((j, di, dj))
            neighbours[j].append((i, dj, di))
    comp = np.full(len(polygons), -1)
    flip = np.zeros(len(polygons), bool)
    closed = np.zeros(len(polygons), bool)
    for seed in range(len(polygons)):
        if comp[seed] >= 0:
            continue
        comp[seed], stack, members, consistent = seed, [seed], [seed], True
        while stack:
            i = stack.pop()
            for j, di, dj in neighbours[i]:
                want = flip[i] ^ (di == dj)  # opposite directions along the shared edge
                if comp[j] < 0:
                    comp[j], flip[j] = seed, want
                    stack.append(j)
                    members.append(j)
                elif flip[j] != want:
                    consistent = False  # a non-orientable surface (a Moebius strip)
        closed[members] = consistent and bool(np.all(manifold[members]))
    return comp, flip, closed


def winding_numbers(points: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """The generalized winding number (P,) of a closed surface of ``triangles`` (T, 3, 3)
    about ``points`` (P, 3): the solid angle it subtends over 4 pi (Van Oosterom and
    Strackee's formula). With the normals out of the solid: 1 inside, 0 outside, 1/2 on a
    face (less on an edge); no ray is cast, so no grazing ray can miscount."""
    out = np.zeros(len(points))
    step = max(1, 2**18 // max(len(triangles), 1))
    for k in range(0, len(points), step):
        r = triangles[None] - points[k : k + step, None, None, :]  # (p, T, 3, 3)
        a, b, c = r[..., 0, :], r[..., 1, :], r[..., 2, :]
        la, lb, lc = (np.linalg.norm(x, axis=-1) for x in (a, b, c))
        det = np.sum(a * np.cross(b, c), axis=-1)
        den = (
            la * lb * lc + np.sum(a * b, -1) * lc + np.sum(a * c, -1) * lb + np.sum(b * c, -1) * la
        )
        out[k : k + step] = np.sum(np.arctan2(det, den), axis=-1) / (2.0 * np.pi)
    return out


def _finite_polygon(name: str, p: Any) -> np.ndarray:
    """``p`` as (K, 3) finite float coordinates, or ``ValueError`` naming ``name``."""
    v = np.asarray(p)
    if v.dtype.kind not in "biuf" or v.ndim != 2 or v.shape[1] != 3 or len(v) < 3:
        raise ValueError(f"{name} must be (K, 3) real coordinates, K >= 3, got {v.dtype} {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} has a vertex that is not finite (NaN or inf): {v.tolist()}")
    return v.astype(float)


def air_points(air: ArrayLike | None) -> np.ndarray:
    """``air`` (points known to be in the air, (A, 3) or one (3,)) as (A, 3) floats; None:
    none. ``ValueError`` for anything else (a string, a wrong shape, NaN)."""
    if air is None:
        return np.zeros((0, 3))
    pts = np.asarray(air)
    if pts.dtype.kind not in "biuf" or pts.ndim not in (1, 2) or pts.shape[-1] != 3:
        raise ValueError(f"air must be finite points (A, 3) in metres (or None), got {air!r:.60}")
    pts = pts.astype(float).reshape(-1, 3)
    if not np.all(np.isfinite(pts)):
        raise ValueError(f"air must be finite points (A, 3), got a NaN or inf: {pts.tolist()}")
    return pts


def orient_polygons(
    polygons: Sequence[np.ndarray], air: ArrayLike | None = None
) -> tuple[list[np.ndarray], np.ndarray]:
    """Orient a scene's polygons from their connectivity, not from the file's vertex order.

    Polygons that share an edge (by vertex position) form a surface, made consistently
    oriented (each shared edge traversed opposite ways). A **closed** surface (every edge
    shared by exactly two of its polygons) is either a solid (normals out of it) or a room
    (normals into it): a room when more of the ``air`` points lie inside it than outside
    (:func:`winding_numbers`; points on it, such as mounted APs, do not vote); without a
    vote, a room when it encloses the centres of at least half of the scene's other
    polygons (a box around a scene, or a box alone), else a solid. An **open** surface (a ground plane, a screen, a wall, a
    building shell without a bottom) bounds nothing: it is a sheet, air on both sides
    (:class:`~dmimo_jax.physics.Face`'s ``sheet``).

    Args:
        polygons: planar convex polygons, each (K, 3), metres.
        air: (A, 3) points known to be in the air (the APs, the UE region's centre), or
            None.

    Returns:
        ``(polygons, sheet)``: the polygons, reversed where needed, and (N,) bool.

    Raises:
        ValueError: ``air`` not (A, 3) finite points, a polygon with a NaN or inf vertex.
    """
    polys = [_finite_polygon(f"polygon {i}", p) for i, p in enumerate(polygons)]
    if not polys:
        return [], np.zeros(0, bool)
    pts = air_points(air)
    comp, flip, closed = _components(polys)
    polys = [p[::-1] if f else p for p, f in zip(polys, flip, strict=True)]
    everything = np.concatenate(polys)
    tol = 1e-9 * max(float(np.ptp(everything, axis=0).max()), 1.0)
    for c in np.unique(comp[closed]):
        members = np.flatnonzero(comp == c)
        tris = np.array([t for i in members for t in _fan(polys[i])])
        if np.sum(np.linalg.det(tris)) < 0:  # normals out of the enclosed volume
            tris = tris[:, ::-1]
            for i in members:
                polys[i] = polys[i][::-1]
        w = winding_numbers(pts, tris)
        inside, outside = int(np.sum(w > 0.75)), int(np.sum(w < 0.25))
        if inside == outside:  # no vote: a room when it encloses most of the rest
            rest = np.array([polys[i].mean(axis=0) for i in np.flatnonzero(comp != c)]).reshape(
                -1, 3
            )
            mine = tris.reshape(-1, 3)
            # only centres inside its bounding box can be inside it (spares the winding numbers)
            near = rest[np.all((rest >= mine.min(0) - tol) & (rest <= mine.max(0) + tol), axis=1)]
            enclosed = int(np.sum(winding_numbers(near, tris) > 0.5)) if len(near) else 0
            room = 2 * enclosed >= len(rest)
        else:
            room = inside > outside
        if room:
            for i in members:
                polys[i] = polys[i][::-1]
    return polys, ~closed


def _fan(p: np.ndarray) -> list[np.ndarray]:
    """A convex polygon's triangles from its first vertex, in its orientation."""
    return [p[[0, k, k + 1]] for k in range(1, len(p) - 1)]


def _merge_coplanar(
    polys: list[np.ndarray], sheets: np.ndarray
) -> tuple[list[np.ndarray], list[bool]]:
    """Coplanar polygons (of one kind: sheets or not) whose union is a convex polygon become
    that union (its hull); the others, and any union that is not a valid face (a float32
    mesh's vertices off the merged plane), stay as they are."""
    groups: dict[tuple, list[tuple[np.ndarray, np.ndarray, float]]] = {}
    for v, sheet in zip(polys, sheets, strict=True):
        n = check_polygon("a mesh polygon", v)
        area = 0.5 * abs(float(np.cross(v[1:-1] - v[0], v[2:] - v[0]).sum(axis=0) @ n))
        key = (bool(sheet), *np.round(np.r_[n, n @ v[0]], 6))
        groups.setdefault(key, []).append((v, n, area))
    out, kinds = [], []
    for key, items in groups.items():
        merged = [v for v, _, _ in items]
        if len(items) > 1:
            n = items[0][1]
            hull = _hull_in_plane(np.concatenate(merged), n)
            hull_area = 0.5 * abs(
                float(np.cross(hull[1:-1] - hull[0], hull[2:] - hull[0]).sum(0) @ n)
            )
            total = sum(a for _, _, a in items)
            if abs(hull_area - total) <= 1e-9 * max(total, 1e-12):
                try:
                    check_polygon("a merged polygon", hull)
                    merged = [hull]
                except ValueError:
                    pass  # keep the polygons
        out.extend(merged)
        kinds.extend([key[0]] * len(merged))
    return out, kinds


def _distinct(polys: Sequence[np.ndarray]) -> list[int]:
    """The indices of the polygons that are not repeats of an earlier one (the same vertices
    in any cyclic order or direction, as a mesh that holds a wall twice)."""
    seen, keep = set(), []
    for i, p in enumerate(polys):
        key = tuple(sorted(map(tuple, np.round(np.asarray(p, float), 9).tolist())))
        if key not in seen:
            seen.add(key)
            keep.append(i)
    return keep


def _hull_in_plane(pts: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The convex hull (counter-clockwise about ``n``) of coplanar points (monotone chain)."""
    e1 = np.cross(n, [1.0, 0, 0] if abs(n[0]) < 0.9 else [0, 1.0, 0])
    e1 /= np.linalg.norm(e1)
    e2 = np.cross(n, e1)
    uv = np.round(np.c_[pts @ e1, pts @ e2], 12)
    _, keep = np.unique(uv, axis=0, return_index=True)
    pts, uv = pts[keep], uv[keep]
    order = np.lexsort((uv[:, 1], uv[:, 0]))

    def chain(idx):
        out: list[int] = []
        for i in idx:
            while len(out) >= 2:
                a, b = uv[out[-2]], uv[out[-1]]
                if (b[0] - a[0]) * (uv[i][1] - a[1]) - (b[1] - a[1]) * (uv[i][0] - a[0]) > 1e-12:
                    break
                out.pop()
            out.append(i)
        return out

    lower, upper = chain(order), chain(order[::-1])
    return pts[lower[:-1] + upper[:-1]]


def _spec(name: str, materials: Mapping[str, Any] | None) -> Any:
    if materials is not None and name in materials:
        return materials[name]
    for prefix in ("mat-itu_", "itu_", "mat-"):
        if name.startswith(prefix) and name[len(prefix) :] in ITU_MATERIALS:
            return name[len(prefix) :]
    if name in ITU_MATERIALS:
        return name
    raise ValueError(
        f"no material for {name!r}: it is not an ITU-R P.2040 name ({sorted(ITU_MATERIALS)}); "
        f"pass materials={{{name!r}: eps_r or an ITU name or None}}"
    )


def convex_polygons(
    vertices: np.ndarray, polygons: Sequence[Sequence[int]], source: str = "a mesh"
) -> list[np.ndarray]:
    """The planar convex polygons (each (K, 3)) of a mesh: each polygon as it is when it is
    one, else its triangles (:func:`triangulate`). A polygon of zero area (collinear or
    repeated vertices: exporters leave them) bounds nothing: it is skipped with a warning
    naming ``source`` (the file) and the face.

    Raises:
        ValueError: (naming ``source`` and the face) a vertex that is not finite, a polygon
            that is not simple or not planar.
    """
    v = np.asarray(vertices, float)
    out = []
    for i, p in enumerate(polygons):
        poly = v[np.asarray(p, int)]
        name = f"{source}: face {i} (vertices {[int(j) for j in p]})"
        check_finite(name, poly)
        if has_zero_area(poly):
            warnings.warn(f"{name} has zero area: skipped", stacklevel=2)
            continue
        try:
            check_polygon(name, poly)
            out.append(poly)
        except ValueError:
            if len(poly) == 3:
                raise
            out.extend(triangulate(poly))
    return out


def scene_faces(
    meshes: Sequence[tuple[str, Sequence[np.ndarray]]],
    *,
    materials: Mapping[str, Any] | None = None,
    frequency_hz: float | None = None,
    convention: str = "itu",
    merge: bool = True,
    orient: bool = True,
    air: ArrayLike | None = None,
) -> tuple[Face, ...]:
    """The faces of a scene given as ``(material name, convex polygons)`` pairs: oriented
    from the connectivity of all of them together (:func:`orient_polygons`, unless
    ``orient=False``: then the vertex order is trusted and no face is a sheet), coplanar
    polygons of one mesh merged where their union is convex and repeated ones dropped
    (a polygon a mesh holds twice would count its bounce twice), materials as the loaders
    take them (module docstring).

    Raises:
        ValueError: a material that is not known, ``air`` not points (A, 3).
    """
    merge, orient = check_bool("merge", merge), check_bool("orient", orient)
    air = air_points(air)
    meshes = [(name, [ps[i] for i in _distinct(ps)]) for name, ps in meshes]
    polys = [p for _, ps in meshes for p in ps]
    if orient:
        polys, sheets = orient_polygons(polys, air)
    else:
        sheets = np.zeros(len(polys), bool)
    out: list[Face] = []
    start = 0
    for name, ps in meshes:  # one mesh at a time: a union is never across two meshes
        mine, kinds = polys[start : start + len(ps)], sheets[start : start + len(ps)]
        start += len(ps)
        if merge:
            mine, kinds = _merge_coplanar(mine, kinds)
            keep = _distinct(mine)  # two unions can be the same polygon
            mine, kinds = [mine[i] for i in keep], [kinds[i] for i in keep]
        spec = _spec(name, materials)
        if isinstance(spec, str) and spec == "metal":
            spec = None
        out.extend(
            Face(
                p, spec, name=name, frequency_hz=frequency_hz, convention=convention, sheet=bool(k)
            )
            for p, k in zip(mine, kinds, strict=True)
        )
    return tuple(out)


def faces_from_mesh(
    vertices: np.ndarray,
    polygons: Sequence[Sequence[int]],
    name: str,
    *,
    materials: Mapping[str, Any] | None = None,
    frequency_hz: float | None = None,
    convention: str = "itu",
    merge: bool = True,
    orient: bool = True,
    air: ArrayLike | None = None,
) -> tuple[Face, ...]:
    """Faces of one mesh of one material ``name``: its :func:`convex_polygons`, oriented and
    merged by :func:`scene_faces`.

    Raises:
        ValueError: a degenerate polygon, one that is not simple, a material that is not
            known (see module).
    """
    return scene_faces(
        [(name, convex_polygons(vertices, polygons))], materials=materials,
        frequency_hz=frequency_hz, convention=convention, merge=merge, orient=orient, air=air,
    )  # fmt: skip


def read_obj(path: str | pathlib.Path) -> tuple[np.ndarray, dict[str, list[list[int]]]]:
    """``(vertices (V, 3), {name: polygons})`` of a Wavefront OBJ file: ``v`` and ``f``
    records (indices may be negative and carry ``/vt/vn`` parts), polygons named by their
    ``usemtl`` material, else their ``o`` / ``g`` name, else ``"face"``.

    Raises:
        ValueError: (with the file and line) a vertex without three numbers, an index that
            is not an integer or is out of range, a face with fewer than 3 vertices; a file
            that is not text.
    """
    verts: list[list[float]] = []
    groups: dict[str, list[list[int]]] = {}
    current, fallback = None, "face"
    try:
        lines = pathlib.Path(path).read_text().splitlines()
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not a text OBJ file (byte {e.start} is not text)") from None
    for lineno, raw in enumerate(lines, 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{lineno}"
        if words[0] == "v":
            try:
                xyz = [float(w) for w in words[1:4]]
            except ValueError:
                raise ValueError(
                    f"{where}: a vertex needs three numbers, got {raw.strip()!r}"
                ) from None
            if len(xyz) != 3:
                raise ValueError(f"{where}: a vertex needs three numbers, got {raw.strip()!r}")
            if not np.all(np.isfinite(xyz)):
                raise ValueError(f"{where}: a vertex must be finite, got {raw.strip()!r}")
            verts.append(xyz)
        elif words[0] in ("o", "g") and len(words) > 1:
            fallback = words[1]
        elif words[0] == "usemtl" and len(words) > 1:
            current = words[1]
        elif words[0] == "f":
            idx = []
            for w in words[1:]:
                try:
                    i = int(w.split("/")[0])
                except ValueError:
                    raise ValueError(f"{where}: {w!r} is not a vertex index") from None
                i = i - 1 if i > 0 else len(verts) + i
                if not 0 <= i < len(verts):
                    raise ValueError(f"{where}: vertex index {w} out of range")
                idx.append(i)
            if len(idx) < 3:
                raise ValueError(f"{where}: a face needs at least 3 vertices")
            groups.setdefault(current or fallback, []).append(idx)
    return np.asarray(verts, float).reshape(-1, 3), groups


def load_obj(
    path: str | pathlib.Path,
    *,
    materials: Mapping[str, Any] | None = None,
    frequency_hz: float | None = None,
    convention: str = "itu",
    merge: bool = True,
    orient: bool = True,
    air: ArrayLike | None = None,
) -> tuple[Face, ...]:
    """The faces of a Wavefront OBJ file (:func:`read_obj`), one material per name.

    Args:
        path: the ``.obj`` file (text; its groups or ``usemtl`` names name the materials).
        materials: a material for a name of the file: a complex relative permittivity, an
            ITU-R P.2040 name (``"concrete"``; ``"metal"``) or None (a perfect conductor).
            Names not given here must be ITU names themselves (``"concrete"``,
            ``"itu_concrete"``, ``"mat-itu_concrete"``).
        frequency_hz: the carrier at which ITU material names are evaluated (needed when a
            material is a name).
        convention: ``"itu"`` (f in GHz, the correct one) or ``"paper"`` (f in Hz: the
            paper's permittivity, :func:`~dmimo_jax.materials.relative_permittivity`).
        merge: merge coplanar triangles where their union is convex (fewer faces, the same
            surfaces).
        orient: decide each face's air side from the meshes' connectivity
            (:func:`orient_polygons`: closed meshes are solids or rooms, open ones sheets)
            instead of trusting the file's vertex order.
        air: (A, 3) points known to be in the air, e.g. the scene's APs: a closed mesh
            around most of them is a room (its normals point in), not a solid.

    Returns:
        The faces (``Face``), ready for :class:`~dmimo_jax.physics.MeshModel`.

    Raises:
        ValueError: what :func:`read_obj` refuses, a degenerate polygon, a material that
            is not known, ``air`` not points.

    Examples:
        A room exported the usual way (normals out of the box) becomes a room around its
        APs:

        >>> import pathlib, tempfile
        >>> corners = [(x, y, z) for x in (0, 4) for y in (0, 3) for z in (0, 2.5)]
        >>> quads = [(1, 2, 4, 3), (5, 7, 8, 6), (1, 5, 6, 2), (3, 4, 8, 7), (1, 3, 7, 5),
        ...          (2, 6, 8, 4)]
        >>> text = "".join(f"v {x} {y} {z}\\n" for x, y, z in corners)
        >>> text += "usemtl concrete\\n" + "".join(f"f {a} {b} {c} {d}\\n" for a, b, c, d in quads)
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "room.obj"
        >>> _ = path.write_text(text)
        >>> faces = load_obj(path, frequency_hz=800e6, air=[[2.0, 1.5, 1.0]])
        >>> [f.normal.tolist() for f in faces if f.normal[2] != 0]  # floor up, ceiling down
        [[0.0, 0.0, 1.0], [0.0, 0.0, -1.0]]
    """
    v, groups = read_obj(path)
    meshes = [
        (name, convex_polygons(v, polys, f"{path} ({name})")) for name, polys in groups.items()
    ]
    return scene_faces(meshes, materials=materials, frequency_hz=frequency_hz,
                       convention=convention, merge=merge, orient=orient, air=air)  # fmt: skip


def _bsdf_material(bsdf: ET.Element) -> str:
    """The material name of a bsdf element: an ITU radio material's type, else its id."""
    if bsdf.get("type") == "itu-radio-material":
        for s in bsdf.iter("string"):
            if s.get("name") == "type":
                return s.get("value", "")
    return bsdf.get("id", "")


def load_mitsuba(
    path: str | pathlib.Path,
    *,
    materials: Mapping[str, Any] | None = None,
    frequency_hz: float | None = None,
    convention: str = "itu",
    merge: bool = True,
    orient: bool = True,
    air: ArrayLike | None = None,
) -> tuple[Face, ...]:
    """The faces of a Mitsuba XML scene's PLY (or OBJ) shapes, named by their materials (see
    the module docstring), all shapes oriented together from their connectivity (a building
    split into one file per material is one solid).

    Args:
        path: the ``.xml`` scene; its meshes' paths are relative to it.
        materials: as in :func:`load_obj`.
        frequency_hz: as in :func:`load_obj`.
        convention: as in :func:`load_obj`.
        merge: as in :func:`load_obj`.
        orient: as in :func:`load_obj` (all shapes oriented together).
        air: as in :func:`load_obj`.

    Returns:
        The faces (``Face``), ready for :class:`~dmimo_jax.physics.MeshModel`.

    Raises:
        ValueError: malformed or empty XML (with the file), a shape without a material or a
            file, a ``to_world`` transform, an unknown shape type, or what :func:`read_ply` /
            :func:`load_obj` refuse.
    """
    path = pathlib.Path(path)
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as e:
        raise ValueError(f"{path}: not a Mitsuba XML scene ({e})") from None
    bsdfs = {b.get("id"): _bsdf_material(b) for b in root.iter("bsdf") if b.get("id")}
    meshes: list[tuple[str, list[np.ndarray]]] = []
    for i, shape in enumerate(root.iter("shape")):
        label = shape.get("id", f"shape {i}")
        kind = shape.get("type")
        if kind not in ("ply", "obj"):
            raise ValueError(f"{path}: {label} has type {kind!r}: only ply and obj shapes load")
        if shape.find("transform") is not None:
            raise ValueError(f"{path}: {label} has a to_world transform: bake it into the mesh")
        file = next((s.get("value") for s in shape.iter("string") if s.get("name") == "filename"),
                    None)  # fmt: skip
        if file is None:
            raise ValueError(f"{path}: {label} names no filename")
        ref, inner = shape.find("ref"), shape.find("bsdf")
        if ref is not None and ref.get("id") in bsdfs:
            name = bsdfs[ref.get("id")]
        elif inner is not None:
            name = _bsdf_material(inner) or label
        else:
            raise ValueError(f"{path}: {label} has no material (a <ref id=...> to a bsdf)")
        mesh = path.parent / file
        if kind == "obj":
            v, groups = read_obj(mesh)
            polys = [p for g in groups.values() for p in g]
        else:
            v, polys = read_ply(mesh)
        meshes.append((name, convex_polygons(v, polys, str(mesh))))
    return scene_faces(meshes, materials=materials, frequency_hz=frequency_hz,
                       convention=convention, merge=merge, orient=orient, air=air)  # fmt: skip
