r"""From a mesh's polygons to the faces of a scene (:class:`~dmimo_jax.physics.Face`): the
part of loading a scene that reads no file.

* :func:`orient_polygons`: each polygon's normal made to point to the air, from the mesh's
  connectivity (closed components by winding number, :func:`winding_numbers`; open ones are
  sheets), not from the file's normals; vertices closer than :data:`MERGE_TOLERANCE` are one;
* :func:`convex_polygons`: the coplanar triangles of one shape and one material merged into
  one face where their union is a convex polygon (a wall exported as two triangles becomes
  one quad), :func:`triangulate` for the rest;
* :func:`scene_faces` / :func:`faces_from_mesh`: the faces, each with the material its name
  says (:data:`~dmimo_jax.materials.ITU_MATERIALS` at ``frequency_hz``, or ``materials``).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from jax.typing import ArrayLike

from dmimo_jax._checks import check_bool, check_finite
from dmimo_jax.materials import ITU_MATERIALS
from dmimo_jax.physics import Face
from dmimo_jax.physics.faces import check_polygon, has_zero_area, newell_normal


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
