r"""Scenes of finite faces, each with its own material: a mesh PhaseModel (beyond the paper).

The paper's future work asks for "spatially heterogeneous reflecting surfaces" and "more
general multipath propagation beyond the two-ray model". Here the environment is a set of
planar convex :class:`Face` s (triangles, quads, any convex polygon), each with its own
complex permittivity, and :class:`MeshModel` sums the LoS and the specular bounces of the
image method on them (geometric optics), exactly as :class:`~dmimo_jax.physics.ImageSourceModel`
does for infinite planes, with two differences that make a scene of a room with pillars,
cabinets and floors of several materials:

* **Finite faces.** A bounce on face :math:`k` exists only when its specular point

  .. math::

      \mathbf r_{mk} = \mathbf x + \frac{h_k(\mathbf x)}{h_k(\mathbf x) + h_{mk}}
      (\tilde{\mathbf p}_{mk} - \mathbf x)

  (the crossing of the UE -> image segment with the face's plane; :math:`h` the distances
  to the plane) lies on the face (a closed polygon: a point on an edge counts).
* **Occlusion.** A path (the LoS too) is kept only when none of its legs crosses the
  interior of another face (an open polygon: a leg through an edge or a vertex is not
  blocked). There is **no transmission and no diffraction**: a UE in the shadow of a pillar
  loses that AP's LoS, and its phase is the phase of whatever bounces reach it; a UE that no
  path reaches has amplitude 0 and infinite variance (the AP carries no information there).

Everything else follows :mod:`~dmimo_jax.physics.image_source`: the images
:math:`\tilde{\mathbf p}_{mk} = \mathbf p_m - 2h_{mk}\mathbf n_k`, the path difference
:math:`4h_{mk}h_k(\mathbf x)/(d_{mk}+d^{(1)}_m)`, the Fresnel coefficient of eq. (3) for the
scene's polarization label at the incidence angle from the face's normal (``eps_r=None``: a
perfect conductor, :math:`\Gamma=-1`), the phasor sum of eq. (7) over the visible paths,
:math:`s_m = v_m F_m + \sum_k F_{mk}\rho_{mk}` (:math:`v_m` the LoS visibility), the mean
:math:`2\pi d^{(1)}_m/\lambda - \arg s_m + \delta_m`, the amplitude
:math:`\frac{\lambda}{4\pi d^{(1)}_m}|s_m|`, eq. (9) for the variance, the AP patterns applied
along each path's departure direction, and an AP within ``MOUNT_TOLERANCE`` of a face's plane
gets no bounce from it. Faces reflect on both sides. So a box of faces is
:func:`~dmimo_jax.physics.box_room` (a convex room: every specular point lies on its face and
nothing blocks).

**Orientation.** A face's normal follows its vertex order (right-hand rule) and points to the
air: out of a solid (a pillar, a cabinet), into the room for a room's walls. It matters for
one thing only, the check that a position is not inside a solid (:meth:`MeshModel.check_domain`:
the first face a fixed ray from the position meets must be met from its front). A **sheet**
(``Face(..., sheet=True)``: a screen, a ground plane, any open surface) has air on both sides:
it bounds no solid and the check looks through it. Scenes loaded from files get their
orientation and their sheets from the meshes' connectivity, not from the files' normals
(:func:`~dmimo_jax.datasets.orient_polygons`).

**Boundaries.** Across a shadow boundary or a face's edge a path appears or disappears, so
the phase jumps there; the gradient is that of the paths present (finite everywhere, no NaN),
and it equals finite differences away from those boundaries. ``order=2`` adds the double
bounces AP -> face k -> face l -> UE with both specular points on their faces and the three
legs unblocked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.typing import ArrayLike

from dmimo_jax._checks import check_bool, check_int, check_permittivity, is_concrete
from dmimo_jax.antenna import is_isotropic
from dmimo_jax.physics.fresnel import surface_reflections
from dmimo_jax.physics.image_source import MOUNT_TOLERANCE, mirror, resolve_material
from dmimo_jax.physics.model import PhasorSumModel
from dmimo_jax.physics.two_ray import safe_norm
from dmimo_jax.pytree import pytree_dataclass, static_field
from dmimo_jax.scene import Scene

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


class _Stacked(NamedTuple):
    """Faces as arrays: points q (F, 3), normals n (F, 3), permittivities (F,), PEC and sheet
    flags (F,) (NumPy), and per edge the in-plane inward unit normal w (F, K, 3) and offset c (F, K)
    (a point p of the plane is inside when p.w - c >= 0 on every edge; padded edges pass)."""

    q: Array
    n: Array
    eps: Array
    pec: np.ndarray
    w: Array
    c: Array
    sheet: np.ndarray


def _stack_faces(faces: Sequence[Face]) -> _Stacked:
    kmax = max(f.num_vertices for f in faces)
    ws, cs = [], []
    for f in faces:
        v = f.vertices
        e = jnp.roll(v, -1, axis=0) - v
        w = jnp.cross(f.normal[None, :], e)
        w = w / jnp.linalg.norm(w, axis=-1, keepdims=True)
        c = jnp.sum(w * v, axis=-1)
        pad = kmax - f.num_vertices
        ws.append(jnp.concatenate([w, jnp.zeros((pad, 3), w.dtype)]))
        cs.append(jnp.concatenate([c, jnp.full((pad,), -1.0, c.dtype)]))
    return _Stacked(
        jnp.stack([f.vertices[0] for f in faces]),
        jnp.stack([f.normal for f in faces]),
        jnp.stack([f.eps_r for f in faces]),
        np.array([f.perfect_conductor for f in faces]),
        jnp.stack(ws),
        jnp.stack(cs),
        np.array([f.sheet for f in faces]),
    )


def _edge_margin(p: Array, st: _Stacked) -> Array:
    """Smallest signed in-plane distance of points ``p`` (..., 3) inside each face's edges,
    (..., F) (negative outside)."""
    return jnp.min(_seen(p, st).margin, axis=-1)


class _Seen(NamedTuple):
    """Points (..., 3) as every face sees them: heights over the planes (..., F) and
    margins inside the edges (..., F, K), computed once and shared by the legs that start or
    end at the points (both are affine along a segment)."""

    h: Array
    margin: Array


def _seen(p: Array, st: _Stacked) -> _Seen:
    lead = (1,) * (p.ndim - 1)
    h = jnp.einsum("...d,fd->...f", p, st.n) - jnp.sum(st.q * st.n, axis=-1).reshape(lead + (-1,))
    return _Seen(h, jnp.einsum("...d,fkd->...fk", p, st.w) - st.c.reshape(lead + st.c.shape))


def _blocked(a: _Seen, b: _Seen) -> Array:
    """Whether the segment between points seen as ``a`` and ``b`` crosses the interior of
    some face, (...): its ends strictly on opposite sides of the face's plane (beyond
    ``MOUNT_TOLERANCE``, so an end on the face never counts) and the crossing point inside
    the face's edges by more than ``EDGE_TOLERANCE``."""
    nd = max(a.h.ndim, b.h.ndim)
    a, b = (_Seen(*(v.reshape((1,) * (nd - s.h.ndim) + v.shape) for v in s)) for s in (a, b))
    ha, hb = a.h, b.h
    crosses = ((ha > MOUNT_TOLERANCE) & (hb < -MOUNT_TOLERANCE)) | (
        (ha < -MOUNT_TOLERANCE) & (hb > MOUNT_TOLERANCE)
    )
    t = (ha / jnp.where(crosses, ha - hb, 1.0))[..., None]
    inside = jnp.min((1.0 - t) * a.margin + t * b.margin, axis=-1) > EDGE_TOLERANCE
    return jnp.any(crosses & inside, axis=-1)


def _own_margin(p: Array, st: _Stacked, face: np.ndarray) -> Array:
    """The margin (M, P) of points ``p`` (M, P, 3) inside the edges of their own faces
    ``face`` (P,) (negative outside)."""
    m = jnp.einsum("mpd,pkd->mpk", p, st.w[face]) - st.c[face][None]
    return jnp.min(m, axis=-1)


def _subset(st: _Stacked, idx: np.ndarray) -> _Stacked:
    return _Stacked(*(v[idx] for v in st))


def occluders(faces: Sequence[Face], scene: Scene) -> tuple[int, ...]:
    """Indices of the faces that can block a path: all but those whose plane has every face's
    vertices, every AP and the whole UE region (``scene.ue_low``/``ue_high``) on one side
    (a room's enclosure, a ground plane under everything: no segment between such points
    crosses it). Every face when anything is traced."""
    if not is_concrete([f.vertices for f in faces], scene.ap_positions, scene.ue_low):
        return tuple(range(len(faces)))
    lo, hi = np.asarray(scene.ue_low, float), np.asarray(scene.ue_high, float)
    corners = np.array([[(lo, hi)[(i >> a) & 1][a] for a in range(3)] for i in range(8)])
    pts = np.concatenate(
        [np.asarray(f.vertices, float) for f in faces]
        + [np.asarray(scene.ap_positions, float), corners]
    )
    q = np.stack([np.asarray(f.vertices[0], float) for f in faces])
    n = np.stack([np.asarray(f.normal, float) for f in faces])
    offset = np.sum(q * n, axis=1)
    below, above = np.zeros(len(faces), bool), np.zeros(len(faces), bool)
    step = max(1, 2**24 // max(len(pts), 1))  # (points x faces) in blocks of 16 M heights
    for k in range(0, len(faces), step):
        h = pts @ n[k : k + step].T - offset[None, k : k + step]
        below[k : k + step] = np.any(h < -MOUNT_TOLERANCE, axis=0)
        above[k : k + step] = np.any(h > MOUNT_TOLERANCE, axis=0)
    return tuple(int(k) for k in np.flatnonzero(below & above))


class MeshPaths(NamedTuple):
    """The paths of one UE position: LoS visibility (M,) and the reflected paths, each
    (M, P) for P = F first-order bounces (then F(F-1) double bounces with ``order=2``)."""

    los_visible: Array  # bool (M,)
    length: Array  # unfolded path length d, metres
    path_difference: Array  # d - d1, metres
    gamma: Array  # complex product of the Fresnel coefficients along the path
    valid: Array  # bool: the path exists (on its faces, unblocked, AP not mounted)
    departure: Array | None = None  # (M, P, 3) unit direction leaving the AP


def mesh_paths(
    x: ArrayLike,
    scene: Scene,
    faces: Sequence[Face],
    order: int = 1,
    *,
    directions: bool = False,
    blockers: Sequence[int] | None = None,
) -> MeshPaths:
    r"""The LoS visibility and the specular paths on ``faces`` to UE ``x`` (3,).

    Columns: the F first-order bounces in face order, then (``order=2``) the F(F-1) ordered
    pairs (k, l), AP -> k -> l -> UE, k-major. See the module docstring for the rules.
    ``blockers``: the faces tested for occlusion (default :func:`occluders`; the others are
    known never to block, which saves their cost).
    """
    faces = tuple(faces)
    st = _stack_faces(faces)
    if blockers is None:
        blockers = occluders(faces, scene)
    occ = _subset(st, np.asarray(blockers, int).reshape(-1))
    x = jnp.asarray(x, scene.ap_positions.dtype)
    ap = scene.ap_positions  # (M, 3)
    d1 = safe_norm(ap - x[None, :])
    seen_ap = _seen(ap[:, None, :], occ)  # (M, 1, F_occ)
    seen_x = _seen(x, occ)
    los = ~_blocked(_Seen(seen_ap.h[:, 0], seen_ap.margin[:, 0]), seen_x)
    offset = jnp.sum(st.q * st.n, axis=-1)  # (F,)
    hx = x @ st.n.T - offset  # (F,)
    hp_signed = ap @ st.n.T - offset[None, :]  # (M, F)
    side = jnp.where(hp_signed >= 0.0, 1.0, -1.0)  # the AP's side of each plane
    hp = jnp.abs(hp_signed)
    hxs = side * hx[None, :]  # the UE's height on the AP's side
    front = (hp > MOUNT_TOLERANCE) & (hxs > 0.0)
    image = ap[:, None, :] - 2.0 * hp_signed[..., None] * st.n[None]  # (M, F, 3)
    to_image = image - x[None, None, :]
    d = safe_norm(to_image)
    diff = 4.0 * hp * hxs / (d + d1[:, None])
    safe_d = jnp.where(front, d, 1.0)
    cos_g = jnp.where(front, (hxs + hp) / safe_d, 1.0)
    gamma = surface_reflections(cos_g, st.eps[None, :], st.pec, scene.polarization)
    frac = jnp.where(front, hxs / jnp.where(front, hxs + hp, 1.0), 0.5)
    spec = x[None, None, :] + frac[..., None] * to_image  # (M, F, 3) specular points
    seen_spec = _seen(spec, occ)  # (M, F, F_occ)
    on_face = _own_margin(spec, st, np.arange(len(faces))) >= -EDGE_TOLERANCE
    open_legs = ~_blocked(seen_ap, seen_spec) & ~_blocked(seen_spec, seen_x)
    valid = front & on_face & open_legs
    departure = mirror(-to_image / safe_d[..., None], st.n[None]) if directions else None
    if order == 1:
        return MeshPaths(los, d, diff, gamma, valid, departure)
    num = len(faces)
    pairs = [(a, b) for a in range(num) for b in range(num) if a != b]
    k_idx, l_idx = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    nk, nl = st.n[k_idx], st.n[l_idx]  # (P2, 3)
    img1 = image[:, k_idx, :]  # (M, P2, 3)
    h1l = jnp.sum(img1 * nl[None], axis=-1) - offset[l_idx][None]  # image1's height over l
    hxl = hx[l_idx][None, :]
    same_l = (h1l * hxl > 0.0) & (jnp.abs(h1l) > MOUNT_TOLERANCE)
    img2 = img1 - 2.0 * h1l[..., None] * nl[None]
    to_img2 = img2 - x[None, None, :]
    d2 = safe_norm(to_img2)
    safe_d2 = jnp.where(same_l, d2, 1.0)
    u = to_img2 / safe_d2[..., None]
    cos_l = jnp.abs(jnp.sum(u * nl[None], axis=-1))
    nk_unf = mirror(nk, nl)
    cos_k = jnp.abs(jnp.sum(u * nk_unf[None], axis=-1))
    g2 = surface_reflections(
        jnp.where(same_l, cos_k, 1.0), st.eps[k_idx][None], st.pec[k_idx], scene.polarization
    ) * surface_reflections(
        jnp.where(same_l, cos_l, 1.0), st.eps[l_idx][None], st.pec[l_idx], scene.polarization
    )
    ahx, ah1 = jnp.abs(hxl), jnp.abs(h1l)
    r_l = x[None, None, :] + (ahx / jnp.where(same_l, ahx + ah1, 1.0))[..., None] * to_img2
    hpk = hp_signed[:, k_idx]  # the AP's height over k
    s = jnp.sum(r_l * nk[None], axis=-1) - offset[k_idx][None]  # r_l's height over k
    same_k = (s * hpk > 0.0) & (jnp.abs(hpk) > MOUNT_TOLERANCE)
    a_s, a_hp = jnp.abs(s), jnp.abs(hpk)
    r_k = r_l + (a_s / jnp.where(same_k, a_s + a_hp, 1.0))[..., None] * (img1 - r_l)
    hkl = jnp.sum(r_k * nl[None], axis=-1) - offset[l_idx][None]  # r_k on x's side of l
    seen_k, seen_l = _seen(r_k, occ), _seen(r_l, occ)  # (M, P2, F_occ)
    on_faces = (_own_margin(r_l, st, l_idx) >= -EDGE_TOLERANCE) & (
        _own_margin(r_k, st, k_idx) >= -EDGE_TOLERANCE
    )
    open2 = ~_blocked(seen_ap, seen_k) & ~_blocked(seen_k, seen_l) & ~_blocked(seen_l, seen_x)
    valid2 = same_l & same_k & (hkl * hxl > 0.0) & on_faces & open2
    diff2 = (d2 * d2 - d1[:, None] ** 2) / (d2 + d1[:, None])
    if directions:
        departure = jnp.concatenate([departure, mirror(mirror(-u, nl[None]), nk[None])], axis=1)
    return MeshPaths(
        los,
        jnp.concatenate([d, d2], axis=1),
        jnp.concatenate([diff, diff2], axis=1),
        jnp.concatenate([gamma, g2], axis=1),
        jnp.concatenate([valid, valid2], axis=1),
        departure,
    )


def _first_hit(point: np.ndarray, st: _Stacked, direction: np.ndarray) -> tuple[int, float]:
    """(face index, direction . normal) of the first face that is not a sheet a ray from
    ``point`` meets (its interior or edges), or (-1, 0) when it meets none. NumPy, concrete
    faces."""
    q, n = np.asarray(st.q), np.asarray(st.n)
    w, c = np.asarray(st.w), np.asarray(st.c)
    h = np.sum((point[None, :] - q) * n, axis=-1)
    dn = n @ direction
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(np.abs(dn) > 1e-12, -h / dn, np.inf)
    hit = point[None, :] + t[:, None] * direction[None, :]
    # a ray through an edge meets both faces there (a lenient margin: no slipping between)
    inside = np.min(np.einsum("fd,fkd->fk", hit, w) - c, axis=-1) >= -MOUNT_TOLERANCE
    t = np.where((t > MOUNT_TOLERANCE) & inside & ~st.sheet, t, np.inf)
    k = int(np.argmin(t))
    return (k, float(dn[k])) if np.isfinite(t[k]) else (-1, 0.0)


_PROBES = np.array([[1.0, 2.0, 3.0], [-3.0, 1.0, 2.0], [2.0, -3.0, -1.0]]) / np.sqrt(14.0)
"""The fixed ray directions of the inside-a-solid check: none along a coordinate axis or in a
coordinate plane, so they do not run along the faces of axis-aligned boxes."""


def _solid_around(point: np.ndarray, st: _Stacked) -> int:
    """The index of a face met from behind when ``point`` is inside a solid (at least two of
    the three probe rays meet a face from behind first: one ray grazing an edge or a vertex
    cannot decide alone), else -1."""
    behind = [k for k, dn in (_first_hit(point, st, d) for d in _PROBES) if k >= 0 and dn > 0]
    return behind[0] if len(behind) >= 2 else -1


MAX_PATH_BYTES = 4 * 2**30
"""The most memory one position's paths may ask for (:func:`check_path_memory`), bytes."""


def check_distinct_faces(faces: Sequence[Face]) -> None:
    """``ValueError`` naming two faces that are the same polygon (the same vertices in any
    cyclic order or direction): its bounce would be counted twice."""
    seen: dict[tuple, int] = {}
    for i, f in enumerate(faces):
        key = tuple(sorted(map(tuple, np.round(np.asarray(f.vertices, float), 9).tolist())))
        if key in seen:
            raise ValueError(
                f"faces[{seen[key]}] and faces[{i}] ({f.name!r}) are the same polygon: its "
                "bounce would count twice; drop one"
            )
        seen[key] = i


def check_path_memory(
    num_aps: int, num_faces: int, num_blockers: int, faces: Sequence[Face], order: int
) -> None:
    """``ValueError`` when evaluating one position would ask for more than
    :data:`MAX_PATH_BYTES`: every path (M F first-order, M F (F - 1) second-order) is tested
    against every blocker's K edges, a few float64 arrays of M x paths x blockers x K."""
    k = max(int(f.vertices.shape[0]) for f in faces)
    paths = num_faces + (num_faces * (num_faces - 1) if order == 2 else 0)
    need = 8 * 4 * num_aps * paths * max(num_blockers, 1) * (k + 1)
    if need > MAX_PATH_BYTES:
        raise ValueError(
            f"a scene of {num_faces} faces ({num_blockers} that can block, up to {k} vertices "
            f"each, order {order}) for {num_aps} APs needs about {need / 2**30:.1f} GiB for "
            f"one position (at most {MAX_PATH_BYTES / 2**30:.0f} GiB): keep the faces near "
            "the UE region, merge coplanar triangles, or pass fewer blockers"
        )


@pytree_dataclass(init=False)
class MeshModel(PhasorSumModel):
    r"""LoS plus specular bounces on finite faces, as a **PhaseModel** (beyond the paper).

    ``mean(x)`` is the effective phase of the visible paths' phasors, unwrapped by the LoS
    length, ``amplitude(x)`` their effective amplitude and ``variance(x)`` eq. (9) with it
    (module docstring). The scene supplies the APs, wavelength, powers, UE region,
    polarization, antenna pattern and phase offsets; its ``eps_r`` is **not** used (the
    ground is whatever faces the list holds).

    Args:
        scene: the deployment.
        faces: a non-empty sequence of :class:`Face`.
        order: 1 (one bounce per path) or 2 (also every valid double bounce).
        blockers: indices of the faces that can block a path (default :func:`occluders`
            of the concrete geometry: a room's enclosure never blocks, and skipping it saves
            most of the cost; a model rebuilt from traced APs passes its nominal's).

    Raises:
        ValueError: no faces or not :class:`Face` s, two faces that are the same polygon,
            ``order`` not 1 or 2, ``blockers`` not face indices, a scene whose paths need
            more than :data:`MAX_PATH_BYTES` for one position (:func:`check_path_memory`),
            or an AP inside a solid (see the module docstring's orientation rule).

    Examples:
        >>> import jax.numpy as jnp
        >>> from dmimo_jax import paper_scene
        >>> scene = paper_scene()
        >>> room = box_faces(scene.room_size, floor=complex(scene.eps_r), walls="concrete",
        ...                  frequency_hz=float(scene.frequency))
        >>> pillar = cuboid_faces((5.7, 4.2, 0.0), (6.3, 4.8, 3.0), "concrete", name="pillar",
        ...                       frequency_hz=float(scene.frequency), skip=("z0",))
        >>> model = MeshModel(scene, room + pillar)
        >>> model.mean(jnp.array([3.0, 3.0, 1.0])).shape
        (17,)
    """

    scene: Scene
    faces: tuple[Face, ...]
    order: int = static_field()
    blockers: tuple[int, ...] = static_field()

    def __init__(
        self,
        scene: Scene,
        faces: Sequence[Face],
        order: int = 1,
        *,
        blockers: Sequence[int] | None = None,
    ):
        if not isinstance(scene, Scene):
            raise ValueError(f"scene must be a Scene, got {type(scene).__name__}")
        faces = tuple(faces)
        if not faces:
            raise ValueError("faces must hold at least one Face (none: use TwoRayModel or LoS)")
        for i, f in enumerate(faces):
            if not isinstance(f, Face):
                raise ValueError(f"faces[{i}] must be a Face, got {type(f).__name__}")
        check_int("order", order, minimum=1)
        if order > 2:
            raise ValueError(f"order must be 1 or 2, got {order}")
        if order == 2 and len(faces) < 2:
            raise ValueError(f"order=2 needs at least two faces, got {len(faces)}")
        if blockers is None:
            blockers = occluders(faces, scene)
        blockers = tuple(int(k) for k in blockers)
        if any(not 0 <= k < len(faces) for k in blockers) or len(set(blockers)) < len(blockers):
            raise ValueError(
                f"blockers must be distinct face indices in [0, {len(faces)}), got {blockers}"
            )
        check_path_memory(scene.num_aps, len(faces), len(blockers), faces, order)
        if is_concrete([f.vertices for f in faces]):
            check_distinct_faces(faces)
        object.__setattr__(self, "scene", scene)
        object.__setattr__(self, "faces", faces)
        object.__setattr__(self, "order", order)
        object.__setattr__(self, "blockers", blockers)
        if is_concrete(scene.ap_positions, faces):
            self.check_domain("scene.ap_positions", scene.ap_positions, what="AP")

    @property
    def surface_names(self) -> tuple[str, ...]:
        """The distinct face names (materials), in order of first appearance."""
        return tuple(dict.fromkeys(f.name for f in self.faces))

    def with_surface_permittivities(self, eps_r: ArrayLike, names: Sequence[str]) -> MeshModel:
        """The model with every face named ``names[j]`` given permittivity ``eps_r[j]`` (a
        dielectric; works on tracers).

        Raises:
            ValueError: an unknown or repeated name, or not one permittivity per name.
        """
        eps_r = jnp.atleast_1d(jnp.asarray(eps_r))
        names = list(names)
        unknown = [n for n in names if n not in self.surface_names]
        if unknown or len(set(names)) != len(names) or eps_r.shape != (len(names),):
            raise ValueError(
                f"names must be distinct face names among {self.surface_names} with one "
                f"permittivity each, got names {names} and eps_r of shape {eps_r.shape}"
            )
        where = {n: j for j, n in enumerate(names)}
        faces = tuple(
            f.with_permittivity(eps_r[where[f.name]]) if f.name in where else f for f in self.faces
        )
        return MeshModel(self.scene, faces, self.order, blockers=self.blockers)

    # ------------------------------------------------ CalibratableModel (calibration's view)

    piecewise = True  # phases jump across shadow boundaries

    def with_scene(self, scene: Scene) -> MeshModel:
        """The same faces in ``scene``."""
        return MeshModel(scene, self.faces, self.order, blockers=self.blockers)

    def with_permittivities(self, eps_r: Array, indices: tuple[int, ...]) -> MeshModel:
        """The materials ``surface_names[k]`` for k in ``indices`` given ``eps_r``."""
        names = self.surface_names
        return self.with_surface_permittivities(eps_r, [names[k] for k in indices])

    def calibration_surfaces(self, surfaces: Any = None) -> tuple[list[int], list[str]]:
        """Indices into ``surface_names`` (one material per face name) and the names: named
        materials (distinct, dielectric, met by a path), by default every one."""
        names = list(self.surface_names)
        ap = np.asarray(self.scene.ap_positions, float)
        dielectric, seen = {}, {}
        for f in self.faces:
            h = (ap - np.asarray(f.vertices[0])) @ np.asarray(f.normal)
            dielectric.setdefault(f.name, set()).add(not f.perfect_conductor)
            seen[f.name] = seen.get(f.name, False) or bool(np.any(np.abs(h) > MOUNT_TOLERANCE))
        if surfaces is None:
            surfaces = [n for n in names if dielectric[n] == {True} and seen[n]]
        surfaces = list(surfaces)
        if len(set(surfaces)) != len(surfaces):
            raise ValueError(f"surfaces must not repeat a name, got {surfaces}")
        for s in surfaces:
            if s not in names:
                raise ValueError(f"surfaces: no face named {s!r} (the model's materials: {names})")
            if dielectric[s] != {True}:
                raise ValueError(
                    f"surfaces: faces named {s!r} include a perfect conductor, it has no eps_r to fit"
                )
            if not seen[s]:
                raise ValueError(
                    f"surfaces: every AP is mounted on the faces named {s!r}, so no path bounces "
                    "off them and their eps_r does not enter the phases"
                )
        if not surfaces:
            raise ValueError("fit: 'surfaces' asked, but the model has no dielectric face to fit")
        return [names.index(s) for s in surfaces], surfaces

    def mounted(self) -> list[list[np.ndarray]]:
        """Per AP, the unit normals of the faces it is mounted on (within ``MOUNT_TOLERANCE``
        of the plane, on the face)."""
        ap = np.asarray(self.scene.ap_positions, float)
        st = _stack_faces(self.faces)
        q, n = np.asarray(st.q), np.asarray(st.n)
        h = np.sum((ap[:, None, :] - q[None]) * n[None], axis=-1)
        margin = np.asarray(_edge_margin(jnp.asarray(ap), st))
        out: list[list[np.ndarray]] = [[] for _ in range(ap.shape[0])]
        for m, k in zip(
            *np.nonzero((np.abs(h) <= MOUNT_TOLERANCE) & (margin >= -1e-9)), strict=True
        ):
            out[m].append(n[k])
        return out

    def in_air(self, xs: ArrayLike, *, clearance: float = 0.0) -> np.ndarray:
        """(N,) bool for concrete positions (N, 3): not inside a solid and more than
        ``clearance`` metres from every face (measured along its normal, over the face and
        ``clearance`` around it). NumPy; for sampling test positions."""
        st = _stack_faces(self.faces)
        pts = np.asarray(xs, float).reshape(-1, 3)
        q, n = np.asarray(st.q), np.asarray(st.n)
        h = np.abs(np.sum((pts[:, None, :] - q[None]) * n[None], axis=-1))
        margin = np.asarray(_edge_margin(jnp.asarray(pts), st))
        near = np.any((h <= clearance) & (margin >= -clearance), axis=1)
        inside = np.array([_solid_around(p, st) >= 0 for p in pts], bool)
        return ~near & ~inside

    def check_domain(self, name: str, x: Any, *, what: str = "position") -> None:
        """``ValueError`` when a concrete position (3,) or (N, 3) lies on a face or inside a
        solid (the first face that rays along two of three fixed directions meet is met from
        behind). APs may lie on
        a face (mounted); UEs may not. Traced input passes."""
        if not is_concrete(x, self.faces):
            return
        st = _stack_faces(self.faces)
        pts = np.asarray(x, float).reshape(-1, 3)
        q, n = np.asarray(st.q), np.asarray(st.n)
        for i, p in enumerate(pts):
            h = np.sum((p[None] - q) * n, axis=-1)
            margin = np.asarray(_edge_margin(jnp.asarray(p), st))
            on = (np.abs(h) <= (MOUNT_TOLERANCE if what == "AP" else 0.0)) & (margin >= 0.0)
            row = "" if np.ndim(x) == 1 else f" (row {i})"
            if what != "AP" and np.any(on):
                k = int(np.flatnonzero(on)[0])
                raise ValueError(
                    f"{name}{row} = {p.tolist()} lies on face {self.faces[k].name!r}: "
                    "positions must lie in the air, off every face"
                )
            k = _solid_around(p, st)
            if k >= 0:
                raise ValueError(
                    f"{name}{row} = {p.tolist()} is inside a solid: the first face a ray from "
                    f"it meets ({self.faces[k].name!r}) is met from behind (faces' normals "
                    f"point to the air); {what}s must lie in the air"
                )

    def paths(self, x: ArrayLike) -> MeshPaths:
        """The LoS visibility and the reflected paths at ``x`` (:func:`mesh_paths`)."""
        self._check_x(x)
        isotropic = is_isotropic(self.scene.antenna)
        return mesh_paths(
            x, self.scene, self.faces, self.order, directions=not isotropic, blockers=self.blockers
        )

    def _ratio(self, x: ArrayLike) -> tuple[Array, Array]:
        x = jnp.asarray(x, self.scene.ap_positions.dtype)
        ap = self.scene.ap_positions
        d1 = safe_norm(ap - x[None, :])
        isotropic = is_isotropic(self.scene.antenna)
        paths = mesh_paths(
            x, self.scene, self.faces, self.order, directions=not isotropic, blockers=self.blockers
        )
        k = 2 * jnp.pi / self.scene.wavelength
        phase = k * paths.path_difference
        ratio = d1[:, None] / paths.length
        los = paths.los_visible.astype(d1.dtype)
        if not isotropic:
            ratio = ratio * self.scene.antenna.field(paths.departure)
            u1 = (x[None, :] - ap) / d1[:, None]
            los = los * self.scene.antenna.field(u1[:, None, :])[:, 0]
        rho = paths.gamma * lax.complex(ratio * jnp.cos(phase), -ratio * jnp.sin(phase))
        return d1, los + jnp.sum(jnp.where(paths.valid, rho, 0.0), axis=-1)

    def phasor_ratio(self, x: ArrayLike) -> tuple[Array, Array]:
        r"""``(d1, s)``: LoS lengths (M,) and the total channel relative to the isotropic LoS
        phasor, :math:`s_m = v_m F_m + \sum_k F_{mk}\rho_{mk}` (M,) (phase offset excluded)."""
        self._check_x(x)
        return self._ratio(x)

    def __repr__(self) -> str:
        return (
            f"MeshModel(M={self.num_aps}, faces={len(self.faces)}, "
            f"materials={list(self.surface_names)}, order={self.order})"
        )
