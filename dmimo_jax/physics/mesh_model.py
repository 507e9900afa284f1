r"""Scenes of finite faces, each with its own material: a mesh PhaseModel (beyond the paper).

The paper's future work asks for "spatially heterogeneous reflecting surfaces" and "more
general multipath propagation beyond the two-ray model". Here the environment is a set of
planar convex :class:`~dmimo_jax.physics.Face` s (triangles, quads, any convex polygon), each with its own
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
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.typing import ArrayLike

from dmimo_jax._checks import check_int, is_concrete
from dmimo_jax.antenna import is_isotropic
from dmimo_jax.physics.faces import Face
from dmimo_jax.physics.image_source import MOUNT_TOLERANCE
from dmimo_jax.physics.model import PhasorSumModel
from dmimo_jax.physics.occlusion import (
    MeshPaths,
    check_distinct_faces,
    check_path_memory,
    edge_margin,
    mesh_paths,
    occluders,
    solid_around,
    stack_faces,
)
from dmimo_jax.physics.two_ray import safe_norm
from dmimo_jax.pytree import pytree_dataclass, static_field
from dmimo_jax.scene import Scene


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
        faces: a non-empty sequence of :class:`~dmimo_jax.physics.Face`.
        order: 1 (one bounce per path) or 2 (also every valid double bounce).
        blockers: indices of the faces that can block a path (default :func:`~dmimo_jax.physics.occlusion.occluders`
            of the concrete geometry: a room's enclosure never blocks, and skipping it saves
            most of the cost; a model rebuilt from traced APs passes its nominal's).

    Raises:
        ValueError: no faces or not :class:`~dmimo_jax.physics.Face` s, two faces that are the same polygon,
            ``order`` not 1 or 2, ``blockers`` not face indices, a scene whose paths need
            more than :data:`~dmimo_jax.physics.occlusion.MAX_PATH_BYTES` for one position
            (:func:`~dmimo_jax.physics.occlusion.check_path_memory`), or an AP inside a solid
            (the orientation rule of :mod:`~dmimo_jax.physics.faces`).

    Examples:
        >>> import jax.numpy as jnp
        >>> from dmimo_jax import MeshModel, box_faces, cuboid_faces, paper_scene
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
        st = stack_faces(self.faces)
        q, n = np.asarray(st.q), np.asarray(st.n)
        h = np.sum((ap[:, None, :] - q[None]) * n[None], axis=-1)
        margin = np.asarray(edge_margin(jnp.asarray(ap), st))
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
        st = stack_faces(self.faces)
        pts = np.asarray(xs, float).reshape(-1, 3)
        q, n = np.asarray(st.q), np.asarray(st.n)
        h = np.abs(np.sum((pts[:, None, :] - q[None]) * n[None], axis=-1))
        margin = np.asarray(edge_margin(jnp.asarray(pts), st))
        near = np.any((h <= clearance) & (margin >= -clearance), axis=1)
        inside = np.array([solid_around(p, st) >= 0 for p in pts], bool)
        return ~near & ~inside

    def check_domain(self, name: str, x: Any, *, what: str = "position") -> None:
        """``ValueError`` when a concrete position (3,) or (N, 3) lies on a face or inside a
        solid (the first face that rays along two of three fixed directions meet is met from
        behind). APs may lie on
        a face (mounted); UEs may not. Traced input passes."""
        if not is_concrete(x, self.faces):
            return
        st = stack_faces(self.faces)
        pts = np.asarray(x, float).reshape(-1, 3)
        q, n = np.asarray(st.q), np.asarray(st.n)
        for i, p in enumerate(pts):
            h = np.sum((p[None] - q) * n, axis=-1)
            margin = np.asarray(edge_margin(jnp.asarray(p), st))
            on = (np.abs(h) <= (MOUNT_TOLERANCE if what == "AP" else 0.0)) & (margin >= 0.0)
            row = "" if np.ndim(x) == 1 else f" (row {i})"
            if what != "AP" and np.any(on):
                k = int(np.flatnonzero(on)[0])
                raise ValueError(
                    f"{name}{row} = {p.tolist()} lies on face {self.faces[k].name!r}: "
                    "positions must lie in the air, off every face"
                )
            k = solid_around(p, st)
            if k >= 0:
                raise ValueError(
                    f"{name}{row} = {p.tolist()} is inside a solid: the first face a ray from "
                    f"it meets ({self.faces[k].name!r}) is met from behind (faces' normals "
                    f"point to the air); {what}s must lie in the air"
                )

    def paths(self, x: ArrayLike) -> MeshPaths:
        """The LoS visibility and the reflected paths at ``x`` (:func:`~dmimo_jax.physics.occlusion.mesh_paths`)."""
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
