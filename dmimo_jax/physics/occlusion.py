r"""Which faces a path crosses: the occlusion test of the mesh model (beyond the paper).

A path (the LoS too) is kept only when none of its legs crosses the interior of another
face (an open polygon: a leg through an edge or a vertex is not blocked); a bounce on a face
exists only when its specular point lies on that face (a closed polygon: a point on an edge
counts). :func:`stack_faces` packs the faces into arrays once, :func:`occluders` names the
faces that can block a scene's paths, :func:`mesh_paths` gives every path's geometry and
visibility for one position, and :func:`solid_around` finds the solid a position is inside
(the first face a fixed ray meets, met from behind). Across a shadow boundary a path appears
or disappears, so the phase jumps there; the gradient is that of the paths present (finite
everywhere, no NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import is_concrete
from dmimo_jax.physics.faces import EDGE_TOLERANCE, Face
from dmimo_jax.physics.fresnel import surface_reflections
from dmimo_jax.physics.image_source import MOUNT_TOLERANCE, mirror
from dmimo_jax.physics.two_ray import safe_norm
from dmimo_jax.scene import Scene


class StackedFaces(NamedTuple):
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


def stack_faces(faces: Sequence[Face]) -> StackedFaces:
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
    return StackedFaces(
        jnp.stack([f.vertices[0] for f in faces]),
        jnp.stack([f.normal for f in faces]),
        jnp.stack([f.eps_r for f in faces]),
        np.array([f.perfect_conductor for f in faces]),
        jnp.stack(ws),
        jnp.stack(cs),
        np.array([f.sheet for f in faces]),
    )


def edge_margin(p: Array, st: StackedFaces) -> Array:
    """Smallest signed in-plane distance of points ``p`` (..., 3) inside each face's edges,
    (..., F) (negative outside)."""
    return jnp.min(_seen(p, st).margin, axis=-1)


class _Seen(NamedTuple):
    """Points (..., 3) as every face sees them: heights over the planes (..., F) and
    margins inside the edges (..., F, K), computed once and shared by the legs that start or
    end at the points (both are affine along a segment)."""

    h: Array
    margin: Array


@jax.jit  # one program per shape outside jit; inlined inside a jitted caller
def _seen(p: Array, st: StackedFaces) -> _Seen:
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


def _own_margin(p: Array, st: StackedFaces, face: np.ndarray) -> Array:
    """The margin (M, P) of points ``p`` (M, P, 3) inside the edges of their own faces
    ``face`` (P,) (negative outside)."""
    m = jnp.einsum("mpd,pkd->mpk", p, st.w[face]) - st.c[face][None]
    return jnp.min(m, axis=-1)


def _subset(st: StackedFaces, idx: np.ndarray) -> StackedFaces:
    return StackedFaces(*(v[idx] for v in st))


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

    los_visible: Array
    """(M,) bool."""
    length: Array
    """Unfolded path length d, metres."""
    path_difference: Array
    """d - d1, metres."""
    gamma: Array
    """Complex product of the Fresnel coefficients along the path."""
    valid: Array
    """Bool: the path exists (on its faces, unblocked, AP not mounted)."""
    departure: Array | None = None
    """(M, P, 3) unit direction leaving the AP."""


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
    st = stack_faces(faces)
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


def _first_hit(point: np.ndarray, st: StackedFaces, direction: np.ndarray) -> tuple[int, float]:
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


def solid_around(point: np.ndarray, st: StackedFaces) -> int:
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
