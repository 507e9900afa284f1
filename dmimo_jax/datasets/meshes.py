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
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
from jax.typing import ArrayLike

from dmimo_jax.datasets.polygons import convex_polygons, scene_faces
from dmimo_jax.physics import Face

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
            (:func:`~dmimo_jax.datasets.orient_polygons`: closed meshes are solids or rooms, open ones sheets)
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
