r"""Planar convex faces, each with its own material: the environment of a mesh PhaseModel
(:class:`~dmimo_jax.physics.mesh_model.MeshModel`, beyond the paper).

A :class:`Face` is a triangle, a quad or any convex polygon with its complex permittivity
(``eps_r=None``: a perfect conductor). **Orientation.** A face's normal follows its vertex
order (right-hand rule) and points to the air: out of a solid (a pillar, a cabinet), into
the room for a room's walls. It matters for one thing only, the check that a position is
not inside a solid (:meth:`~dmimo_jax.physics.mesh_model.MeshModel.check_domain`). A
**sheet** (``Face(..., sheet=True)``: a screen, a ground plane, any open surface) has air on
both sides: it bounds no solid. Scenes loaded from files get their orientation and their
sheets from the meshes' connectivity, not from the files' normals
(:func:`~dmimo_jax.datasets.orient_polygons`). :func:`cuboid_faces` and :func:`box_faces`
build solids and rooms.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_bool, check_permittivity
from dmimo_jax.physics.rooms import resolve_material
from dmimo_jax.pytree import pytree_dataclass, static_field

EDGE_TOLERANCE = 1e-9
"""Metres: how far outside a face's edge a specular point may lie and still count as on the
face, and how far inside a leg must cross a face to be blocked by it."""

PLANARITY_TOLERANCE = 1e-6
"""Metres: the largest distance of a face's vertex from the face's plane."""


def newell_normal(v: np.ndarray) -> np.ndarray:
    """Newell's normal (unnormalized; length twice the area) of a polygon (K, 3)."""
    w = np.roll(v, -1, axis=0)
    return np.array(
        [
            np.sum((v[:, 1] - w[:, 1]) * (v[:, 2] + w[:, 2])),
            np.sum((v[:, 2] - w[:, 2]) * (v[:, 0] + w[:, 0])),
            np.sum((v[:, 0] - w[:, 0]) * (v[:, 1] + w[:, 1])),
        ]
    )


def has_zero_area(vertices: np.ndarray) -> bool:
    """Whether a finite polygon (K, 3) encloses no area: its Newell normal's length at most
    1e-12 of its longest edge squared (collinear or repeated vertices; exporters leave such
    faces, which bound nothing)."""
    v = np.asarray(vertices, float)
    scale = max(float(np.max(np.linalg.norm(np.roll(v, -1, axis=0) - v, axis=1))), 1e-300)
    return not float(np.linalg.norm(newell_normal(v))) > 1e-12 * scale * scale


def check_polygon(name: str, vertices: np.ndarray) -> np.ndarray:
    """The unit normal of a planar convex polygon (K, 3), or ``ValueError`` naming ``name``
    (fewer than 3 vertices, non-finite, repeated or collinear vertices, zero area,
    non-planar beyond ``PLANARITY_TOLERANCE``, or not convex)."""
    v = np.asarray(vertices)
    if np.iscomplexobj(v) or v.dtype.kind not in "biuf":
        raise ValueError(f"{name} must be real coordinates in metres, got {v.dtype} values")
    v = v.astype(float)
    if v.ndim != 2 or v.shape[1] != 3 or v.shape[0] < 3:
        raise ValueError(f"{name} must have shape (K, 3) with K >= 3 vertices, got {v.shape}")
    if not np.all(np.isfinite(v)):
        raise ValueError(f"{name} must be finite, got non-finite vertices (NaN or inf)")
    edges = np.roll(v, -1, axis=0) - v
    lengths = np.linalg.norm(edges, axis=1)
    scale = max(float(np.max(lengths)), 1e-300)
    if np.any(lengths <= 1e-12 * scale):
        raise ValueError(f"{name} repeats a vertex (a zero-length edge): a degenerate face")
    if has_zero_area(v):
        raise ValueError(f"{name} has zero area (collinear vertices): a degenerate face")
    area2 = newell_normal(v)
    norm = float(np.linalg.norm(area2))
    n = area2 / norm
    off = (v - v.mean(axis=0)) @ n
    if np.max(np.abs(off)) > PLANARITY_TOLERANCE:
        raise ValueError(
            f"{name} is not planar: a vertex lies {np.max(np.abs(off)):.3g} m from the face's "
            f"plane (at most {PLANARITY_TOLERANCE:g} m); split it into triangles"
        )
    turns = np.cross(edges, np.roll(edges, -1, axis=0)) @ n
    if np.any(turns <= 1e-12 * scale * scale):
        raise ValueError(
            f"{name} is not a convex polygon with its vertices in order (each turn must go "
            "the same way, no three consecutive vertices collinear); split it into triangles"
        )
    return n


@pytree_dataclass(init=False)
class Face:
    r"""A planar convex polygon with a material (a pytree; ``vertices``, ``normal``, ``eps_r``
    are leaves).

    Attributes:
        vertices: (K, 3) the corners in order, metres; K >= 3.
        normal: (3,) unit normal by the right-hand rule of the vertex order: the air side.
        eps_r: () complex relative permittivity :math:`\varepsilon'-j\varepsilon''` (ignored
            for a perfect conductor).
        perfect_conductor: :math:`\Gamma=-1` at every angle (static).
        name: the material's label (static): faces that share a name share a material when
            :func:`~dmimo_jax.calibration.calibrate` fits ``"surfaces"``.
        sheet: an open surface with air on both sides (static): it bounds no solid, so the
            inside-a-solid check (:meth:`MeshModel.check_domain`) ignores its normal.

    Args:
        vertices: as above (a planar convex polygon).
        eps_r: a complex permittivity, an ITU-R P.2040 material name (needs
            ``frequency_hz``; ``"metal"`` is a perfect conductor), or ``None``: a perfect
            conductor.
        name: as above (default ``"face"``).
        frequency_hz: carrier frequency for a material name.
        convention: ``"itu"`` (default) or ``"paper"`` (:mod:`dmimo_jax.materials`).
        dtype: float dtype of the leaves (default JAX's).
        sheet: as above (default False: the normal points to the air).

    Raises:
        ValueError: vertices not (K >= 3, 3), non-finite, degenerate, non-planar or not
            convex; a permittivity that is not a passive medium; a name without a frequency.

    Examples:
        >>> f = Face([[0, 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]], "concrete",
        ...          name="floor", frequency_hz=800e6)
        >>> f.normal.tolist(), f.perfect_conductor
        ([0.0, 0.0, 1.0], False)
    """

    vertices: Array
    normal: Array
    eps_r: Array
    perfect_conductor: bool = static_field()
    name: str = static_field()
    sheet: bool = static_field()

    def __init__(
        self,
        vertices: ArrayLike,
        eps_r: complex | float | str | None = None,
        *,
        name: str = "face",
        frequency_hz: float | None = None,
        convention: str = "itu",
        dtype: Any = None,
        sheet: bool = False,
    ):
        if not isinstance(name, str) or not name:
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        check_bool("sheet", sheet)
        fdt = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
        cdt = jnp.result_type(fdt, jnp.complex64)
        n = check_polygon(f"vertices of face {name!r}", vertices)
        if eps_r is None:
            eps, pec = 1.0 + 0.0j, True
        else:
            eps, pec = resolve_material(eps_r, f"eps_r of face {name!r}", frequency_hz, convention)
        object.__setattr__(self, "vertices", jnp.asarray(vertices, fdt))
        object.__setattr__(self, "normal", jnp.asarray(n, fdt))
        object.__setattr__(self, "eps_r", jnp.asarray(eps, cdt))
        object.__setattr__(self, "perfect_conductor", bool(pec))
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "sheet", bool(sheet))

    @property
    def num_vertices(self) -> int:
        """The number of the face's vertices."""
        return int(self.vertices.shape[0])

    def with_permittivity(self, eps_r: ArrayLike) -> Face:
        """The same face with another (possibly traced) permittivity, a dielectric.

        Raises:
            ValueError: a concrete permittivity that is not a passive medium.
        """
        check_permittivity("eps_r", eps_r)
        return self._replace(eps_r=jnp.asarray(eps_r, self.eps_r.dtype), perfect_conductor=False)

    def flipped(self) -> Face:
        """The same face with its vertex order, hence its normal (the air side), reversed."""
        return self._replace(vertices=self.vertices[::-1], normal=-self.normal)

    def _replace(self, **changes: Any) -> Face:
        out = object.__new__(Face)
        for field in ("vertices", "normal", "eps_r", "perfect_conductor", "name", "sheet"):
            object.__setattr__(out, field, changes.get(field, getattr(self, field)))
        return out

    def __repr__(self) -> str:
        mat = "PEC" if self.perfect_conductor else f"eps_r={complex(self.eps_r):.4g}"
        sheet = ", sheet" if self.sheet else ""
        return f"Face({self.name!r}, K={self.num_vertices}, {mat}{sheet})"


def cuboid_faces(
    low: ArrayLike,
    high: ArrayLike,
    eps_r: complex | float | str | None,
    *,
    name: str,
    inward: bool = False,
    frequency_hz: float | None = None,
    convention: str = "itu",
    dtype: Any = None,
    skip: Sequence[str] = (),
) -> tuple[Face, ...]:
    """The six faces of the axis-aligned box ``[low, high]``, one material.

    Args:
        low: (3,) opposite corners, ``low < high`` on every axis.
        high: see ``low``.
        eps_r: the material, as :class:`Face` takes it.
        name: the material name every face gets.
        inward: normals into the box (a room's enclosure) instead of out of it (a solid).
        frequency_hz: as :class:`Face`.
        convention: see ``frequency_hz``.
        dtype: see ``frequency_hz``.
        skip: sides to leave out, among ``"x0", "x1", "y0", "y1", "z0", "z1"`` (e.g. the
            ``"z0"`` face of a pillar standing on the floor).

    Returns:
        The faces in the order x0, x1, y0, y1, z0, z1 (minus ``skip``).
    """
    lo, hi = np.asarray(low, float), np.asarray(high, float)
    if lo.shape != (3,) or hi.shape != (3,) or not np.all(np.isfinite(lo) & np.isfinite(hi)):
        raise ValueError(f"low and high must be finite (3,) corners, got {lo} and {hi}")
    if not np.all(hi > lo):
        raise ValueError(f"high must exceed low on every axis, got low={lo}, high={hi}")
    sides = ("x0", "x1", "y0", "y1", "z0", "z1")
    unknown = set(skip) - set(sides)
    if unknown:
        raise ValueError(f"skip must be among {sides}, got {sorted(unknown)}")
    out = []
    for axis in range(3):
        a, b = (axis + 1) % 3, (axis + 2) % 3
        for side, value in ((0, lo[axis]), (1, hi[axis])):
            if f"{'xyz'[axis]}{side}" in skip:
                continue
            corners = []
            for ua, ub in ((0, 0), (1, 0), (1, 1), (0, 1)):
                p = np.empty(3)
                p[axis] = value
                p[a] = (lo, hi)[ua][a]
                p[b] = (lo, hi)[ub][b]
                corners.append(p)
            corners = np.array(corners)  # counter-clockwise about +axis
            outward_positive = side == 1
            if outward_positive == inward:
                corners = corners[::-1]
            out.append(
                Face(
                    corners,
                    eps_r,
                    name=name,
                    frequency_hz=frequency_hz,
                    convention=convention,
                    dtype=dtype,
                )
            )
    return tuple(out)


def box_faces(
    size: ArrayLike,
    *,
    floor: Any,
    ceiling: Any = "absent",
    walls: Any = "absent",
    frequency_hz: float | None = None,
    convention: str = "itu",
    dtype: Any = None,
) -> tuple[Face, ...]:
    """The box room ``[0, W] x [0, D] x [0, H]`` as faces (normals into the room), the twin of
    :func:`~dmimo_jax.physics.box_room`: names ``"floor"``, ``"ceiling"``, ``"wall_x0"``, ...
    Each of ``floor``, ``ceiling``, ``walls`` is a material as :class:`Face` takes it
    (``None``: a perfect conductor) or ``"absent"`` to leave the surface out."""
    if np.shape(size) != (3,):
        raise ValueError(f"size must have shape (3,) (W, D, H in metres), got {np.shape(size)}")
    w, d, h = (float(s) for s in np.asarray(size, float))
    if not all(np.isfinite(s) and s > 0 for s in (w, d, h)):
        raise ValueError(f"size must be positive and finite (metres), got {(w, d, h)}")
    faces = cuboid_faces((0, 0, 0), (w, d, h), 1.0 + 0j, name="box", inward=True, dtype=dtype)
    names = ("wall_x0", "wall_x1", "wall_y0", "wall_y1", "floor", "ceiling")
    specs = (walls, walls, walls, walls, floor, ceiling)
    out = {}
    for face, name, spec in zip(faces, names, specs, strict=True):
        if isinstance(spec, str) and spec == "absent":
            continue
        out[name] = Face(
            face.vertices,
            spec,
            name=name,
            frequency_hz=frequency_hz,
            convention=convention,
            dtype=dtype,
        )
    order = ("floor", "ceiling", "wall_x0", "wall_x1", "wall_y0", "wall_y1")
    return tuple(out[n] for n in order if n in out)
