r"""Rooms with a ceiling and walls: an image-source PhaseModel (beyond the paper).

The paper's channel (eqs. 1-7) is the LoS path plus one specular bounce on the ground.
Here the environment is a set of infinite planar :class:`Reflector` s and each contributes
the specular bounce of the image method: the image of AP :math:`\mathbf p_m` across plane
:math:`k` (point :math:`\mathbf q_k`, unit normal :math:`\mathbf n_k` into the room) is

.. math::

    \tilde{\mathbf p}_{mk} = \mathbf p_m - 2 h_{mk}\mathbf n_k,\qquad
    h_{mk} = (\mathbf p_m-\mathbf q_k)\cdot\mathbf n_k,

the path length is :math:`d_{mk} = \|\tilde{\mathbf p}_{mk}-\mathbf x\|`, the incidence
angle (from the normal) has :math:`\cos\gamma_{mk} = (h_{mk}+h_k(\mathbf x))/d_{mk}`, and
the bounce is :math:`h^{(k)}_m = |\Gamma_{mk}|\frac{\lambda}{4\pi d_{mk}}
e^{-j(2\pi d_{mk}/\lambda - \angle\Gamma_{mk})}` with the Fresnel coefficient of eq. (3)
(or its TM form). All paths are summed as phasors exactly like eq. (7):

.. math::

    \sum_j h^{(j)}_m = h^{(1)}_m\Big(1 + \sum_k \rho_{mk}\Big),\quad
    \rho_{mk} = \Gamma_{mk}\frac{d^{(1)}_m}{d_{mk}} e^{-j 2\pi (d_{mk}-d^{(1)}_m)/\lambda},

:math:`\theta_m = 2\pi d^{(1)}_m/\lambda - \arg(1+\sum_k\rho_{mk})`,
:math:`\alpha_m = \frac{\lambda}{4\pi d^{(1)}_m}|1+\sum_k\rho_{mk}|` and the phase-noise
variance is eq. (9) with that amplitude. The first-order path difference is
:math:`d_{mk}-d^{(1)}_m = 4h_{mk}h_k(\mathbf x)/(d_{mk}+d^{(1)}_m)` (no cancellation), the
same identity the two-ray model uses, so a floor-only room reproduces
:class:`~dmimo_jax.physics.TwoRayModel` to rounding.

Conventions.

* **Polarization.** The scene's ``"TE"``/``"TM"`` label applies to every bounce relative to
  *that bounce's own* plane of incidence: ``"TE"`` means the field is perpendicular to the
  plane of incidence at the floor, the ceiling and each wall alike. A real antenna's field
  splits differently into TE and TM parts at a vertical wall than at the floor; the label is
  a modelling choice, not a dipole orientation.
* **Infinite planes.** Reflectors have no extent: a wall reflects for every AP/UE pair in
  front of it, and the edges of finite surfaces (diffraction, corners) are ignored.
* **Mounted APs.** An AP on a surface (within 1 um of the plane) gets no bounce from it
  (its image coincides with it, and the grazing bounce would cancel the LoS).
* **Deployment.** Each path's amplitude is multiplied by the AP antenna's field pattern in
  the direction the ray leaves the AP (:mod:`dmimo_jax.antenna`: toward the specular point,
  the unfolded direction mirrored back across each plane it crossed), and the AP's static
  phase offset (``scene.ap_phase_offsets``) is added to the mean; with the defaults
  (isotropic, zero offsets) nothing changes.
* **Second order** (``order=2``) adds AP -> plane k -> plane l -> UE for every ordered pair
  of distinct planes whose reflection points exist on the infinite planes (checked by
  unfolding the path), with amplitude :math:`|\Gamma_k\Gamma_l|\lambda/(4\pi d)`.

Everything is written for one UE position and batched with ``jax.vmap``; it is
differentiable in the position, the AP positions and every reflector's permittivity, with
finite gradients at normal incidence (straight below an AP) and at grazing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_finite,
    check_int,
    check_permittivity,
    is_concrete,
)
from dmimo_jax.antenna import is_isotropic
from dmimo_jax.phase import safe_arg
from dmimo_jax.physics.fresnel import surface_reflections
from dmimo_jax.physics.model import PhasorSumModel
from dmimo_jax.physics.two_ray import safe_norm
from dmimo_jax.pytree import pytree_dataclass, static_field
from dmimo_jax.scene import Scene

MOUNT_TOLERANCE = 1e-6
"""Metres: an AP closer than this to a plane is mounted on it and gets no bounce from it."""


@pytree_dataclass(init=False)
class Reflector:
    r"""An infinite planar reflector (a pytree; ``point``, ``normal``, ``eps_r`` are leaves).

    Attributes:
        point: (3,) a point on the plane, metres.
        normal: (3,) unit normal pointing into the room (the side of the APs and UEs).
        eps_r: () complex relative permittivity :math:`\varepsilon'-j\varepsilon''`
            (ignored for a perfect conductor).
        perfect_conductor: :math:`\Gamma=-1` at every angle (static).
        name: a label (static), e.g. ``"ceiling"``.

    Args:
        point: as above; ``normal`` is normalized.
        normal: see ``point``.
        eps_r: see ``point``.
        perfect_conductor: see ``point``.
        name: see ``point``.
        dtype: float dtype of the leaves (default JAX's).

    Raises:
        ValueError: a zero or non-finite normal, a non-finite point, or a permittivity that
            is not a passive medium.
    """

    point: Array
    normal: Array
    eps_r: Array
    perfect_conductor: bool = static_field()
    name: str = static_field()

    def __init__(
        self,
        point: ArrayLike,
        normal: ArrayLike,
        eps_r: ArrayLike = 1.0 + 0.0j,
        *,
        perfect_conductor: bool = False,
        name: str = "reflector",
        dtype: Any = None,
    ):
        fdt = jnp.result_type(float) if dtype is None else jnp.dtype(dtype)
        cdt = jnp.result_type(fdt, jnp.complex64)
        for arg, value in (("point", point), ("normal", normal)):
            if np.shape(value) != (3,):
                raise ValueError(f"{arg} must have shape (3,), got {np.shape(value)}")
            check_finite(arg, value)
        n = jnp.asarray(normal, fdt)
        if is_concrete(n):
            norm = float(np.linalg.norm(np.asarray(n, float)))
            if not norm > 0:
                raise ValueError(f"normal must be a non-zero vector, got {np.asarray(normal)}")
        if isinstance(eps_r, str):
            raise ValueError(
                f"eps_r must be a complex permittivity, got the material name {eps_r!r}: a "
                "name needs a frequency, use dmimo_jax.materials.relative_permittivity(name, "
                "frequency_hz) or box_room(..., frequency_hz=...)"
            )
        if np.shape(eps_r) != ():
            raise ValueError(f"eps_r must be a scalar, got shape {np.shape(eps_r)}")
        if not perfect_conductor:
            check_permittivity("eps_r", eps_r)
        object.__setattr__(self, "point", jnp.asarray(point, fdt))
        object.__setattr__(self, "normal", n / jnp.linalg.norm(n))
        object.__setattr__(self, "eps_r", jnp.asarray(eps_r, cdt))
        object.__setattr__(self, "perfect_conductor", bool(perfect_conductor))
        object.__setattr__(self, "name", str(name))

    def with_permittivity(self, eps_r: ArrayLike) -> Reflector:
        """The same plane with another (possibly traced) permittivity, a dielectric.

        Raises:
            ValueError: a concrete permittivity that is not finite or not a passive medium
                (a traced one passes unchecked).
        """
        check_permittivity("eps_r", eps_r)
        out = object.__new__(Reflector)
        for name, value in (
            ("point", self.point),
            ("normal", self.normal),
            ("eps_r", jnp.asarray(eps_r, self.eps_r.dtype)),
            ("perfect_conductor", False),
            ("name", self.name),
        ):
            object.__setattr__(out, name, value)
        return out

    def height(self, x: ArrayLike) -> Array:
        """Signed distance of point(s) ``x`` (..., 3) from the plane, positive in front."""
        x = jnp.asarray(x)
        shape = (1,) * (x.ndim - 1) + (3,)
        return jnp.sum((x - self.point.reshape(shape)) * self.normal.reshape(shape), axis=-1)

    def __repr__(self) -> str:
        mat = "PEC" if self.perfect_conductor else f"eps_r={complex(self.eps_r):.4g}"
        if not is_concrete(self.point, self.normal):
            return f"Reflector({self.name!r}, traced)"
        p, n = np.asarray(self.point).round(4).tolist(), np.asarray(self.normal).round(4).tolist()
        return f"Reflector({self.name!r}, point={p}, normal={n}, {mat})"


class ImagePaths(NamedTuple):
    """The reflected paths of one UE position, each (M, P) for P image paths."""

    length: Array
    """Unfolded path length d, metres."""
    path_difference: Array
    """d - d1, metres."""
    gamma: Array
    """Complex product of the Fresnel coefficients along the path."""
    valid: Array
    """Bool: the path exists (AP not mounted on the plane, reflection points exist)."""
    departure: Array | None = None
    """(M, P, 3) unit direction leaving the AP (directions=True)."""


def _stack(reflectors: Sequence[Reflector]):
    q = jnp.stack([r.point for r in reflectors])
    n = jnp.stack([r.normal for r in reflectors])
    eps = jnp.stack([r.eps_r for r in reflectors])
    pec = np.array([r.perfect_conductor for r in reflectors])
    return q, n, eps, pec


def check_reflectors(
    reflectors: Sequence[Reflector], order: int, *, allow_empty: bool = False
) -> None:
    """``ValueError`` unless ``order`` is 1 or 2 with enough reflectors and no plane repeats
    (a plane listed twice would count its bounce twice). Concrete planes only."""
    check_int("order", order, minimum=1)
    if order > 2:
        raise ValueError(f"order must be 1 or 2, got {order}")
    if not reflectors and not allow_empty:
        raise ValueError("reflectors must hold at least one Reflector (none: a LoS model)")
    if order == 2 and len(reflectors) < 2:
        raise ValueError(f"order=2 needs at least two reflectors, got {len(reflectors)}")
    planes = []
    for r in reflectors:
        if not is_concrete(r.point, r.normal):
            return
        n = np.asarray(r.normal, float)
        planes.append((r.name, n, float(n @ np.asarray(r.point, float))))
    for i, (a, na, ca) in enumerate(planes):
        for b, nb, cb in planes[i + 1 :]:
            if np.allclose(na, nb, atol=1e-9) and abs(ca - cb) <= MOUNT_TOLERANCE:
                raise ValueError(
                    f"reflectors {a!r} and {b!r} are the same plane: list each surface once"
                )


def mirror(v: Array, n: Array) -> Array:
    """Directions ``v`` (..., 3) mirrored across planes of unit normals ``n`` (..., 3)."""
    return v - 2.0 * jnp.sum(v * n, axis=-1, keepdims=True) * n


def image_paths(
    x: ArrayLike,
    scene: Scene,
    reflectors: Sequence[Reflector],
    order: int = 1,
    *,
    directions: bool = False,
) -> ImagePaths:
    r"""First-order (and with ``order=2`` second-order) image paths to UE ``x`` (3,).

    Columns: the K first-order bounces in reflector order, then (order 2) the K(K-1) ordered
    pairs (k, l), AP -> k -> l -> UE, k-major. See the module docstring for the formulas.
    With ``directions=True`` the paths' departure directions at the APs are returned too
    (``.departure``, for the antenna patterns).
    """
    reflectors = tuple(reflectors)
    check_reflectors(reflectors, order)
    x = jnp.asarray(x, scene.ap_positions.dtype)
    ap = scene.ap_positions  # (M, 3)
    q, n, eps, pec = _stack(reflectors)  # (K, 3), (K, 3), (K,), (K,)
    d1 = safe_norm(ap - x[None, :])  # (M,)
    hx = jnp.sum((x[None, :] - q) * n, axis=-1)  # (K,)
    hp = jnp.sum((ap[:, None, :] - q[None]) * n[None], axis=-1)  # (M, K)
    image = ap[:, None, :] - 2.0 * hp[..., None] * n[None]  # (M, K, 3)
    to_image = image - x[None, None, :]
    # d >= hp + hx > 0 for a UE in front of the plane, so the plain norm is safe to differentiate
    d = jnp.sqrt(jnp.sum(to_image * to_image, axis=-1))  # (M, K)
    diff = 4.0 * hp * hx[None, :] / (d + d1[:, None])
    cos_g = (hx[None, :] + hp) * (1.0 / d)
    gamma = surface_reflections(cos_g, eps[None, :], pec, scene.polarization)
    # a path exists when the AP is not mounted on the plane and the UE is in front of it
    valid = (hp > MOUNT_TOLERANCE) & (hx[None, :] > 0.0)
    # the ray leaves the AP along the unfolded direction mirrored back across the plane
    departure = mirror(-to_image / d[..., None], n[None]) if directions else None
    if order == 1:
        return ImagePaths(d, diff, gamma, valid, departure)
    num = len(reflectors)
    pairs = [(a, b) for a in range(num) for b in range(num) if a != b]
    k_idx, l_idx = np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    ql, nl, nk = q[l_idx], n[l_idx], n[k_idx]  # (P2, 3)
    img1 = image[:, k_idx, :]  # (M, P2, 3): the AP's image across k
    h1l = jnp.sum((img1 - ql[None]) * nl[None], axis=-1)  # image1 in front of l
    img2 = img1 - 2.0 * h1l[..., None] * nl[None]
    to_img2 = img2 - x[None, None, :]
    d2 = safe_norm(to_img2)
    u = to_img2 / d2[..., None]  # unfolded direction from the UE
    cos_l = jnp.abs(jnp.sum(u * nl[None], axis=-1))
    nk_unf = nk - 2.0 * jnp.sum(nk * nl, axis=-1, keepdims=True) * nl  # plane k seen across l
    cos_k = jnp.abs(jnp.sum(u * nk_unf[None], axis=-1))
    g2 = surface_reflections(
        cos_k, eps[k_idx][None], pec[k_idx], scene.polarization
    ) * surface_reflections(cos_l, eps[l_idx][None], pec[l_idx], scene.polarization)
    # reflection point on l: where the UE -> image2 line crosses plane l
    hxl = hx[l_idx][None, :]
    r_l = x[None, None, :] + (hxl / (hxl + h1l))[..., None] * to_img2  # (M, P2, 3)
    # that point must be in front of k, and the segment to image1 must cross k in front of l
    s = jnp.sum((r_l - q[k_idx][None]) * nk[None], axis=-1)
    hpk = hp[:, k_idx]
    r_k = r_l + (s / (s + hpk))[..., None] * (img1 - r_l)
    in_front_l = jnp.sum((r_k - ql[None]) * nl[None], axis=-1) >= 0.0
    valid2 = (hpk > MOUNT_TOLERANCE) & (h1l > MOUNT_TOLERANCE) & (s > 0.0) & in_front_l
    valid2 = valid2 & (hxl > 0.0)
    diff2 = (d2 * d2 - d1[:, None] ** 2) / (d2 + d1[:, None])
    if directions:  # mirrored back across l, then across k
        dep2 = mirror(mirror(-u, nl[None]), nk[None])
        departure = jnp.concatenate([departure, dep2], axis=1)
    return ImagePaths(
        jnp.concatenate([d, d2], axis=1),
        jnp.concatenate([diff, diff2], axis=1),
        jnp.concatenate([gamma, g2], axis=1),
        jnp.concatenate([valid, valid2], axis=1),
        departure,
    )


@pytree_dataclass(init=False)
class ImageSourceModel(PhasorSumModel):
    r"""LoS plus specular bounces on planar reflectors, as a **PhaseModel** (beyond the paper).

    ``mean(x)`` is the effective phase of the summed phasors (the room's eq. 7b, unwrapped by
    the LoS term), ``variance(x)`` is eq. (9) with the effective amplitude. The scene supplies
    the APs, wavelength, powers, UE region and polarization; its ``eps_r`` is **not** used (the
    ground is whatever reflector the list holds; see :func:`~dmimo_jax.physics.rooms.room_model`).

    Args:
        scene: the deployment.
        reflectors: a sequence of :class:`Reflector` (may be empty: LoS only).
        order: 1 (one bounce per path) or 2 (also every valid double bounce).

    Raises:
        ValueError: an AP behind a reflector, or ``order`` not 1 or 2.

    Examples:
        >>> import jax.numpy as jnp
        >>> from dmimo_jax import paper_scene, room_model
        >>> scene = paper_scene()
        >>> model = room_model(scene, ceiling="plasterboard", walls="concrete")
        >>> model.mean(jnp.array([6.5, 5.0, 2.0])).shape
        (17,)
    """

    scene: Scene
    reflectors: tuple[Reflector, ...]
    order: int = static_field()

    def __init__(self, scene: Scene, reflectors: Sequence[Reflector], order: int = 1):
        if not isinstance(scene, Scene):
            raise ValueError(f"scene must be a Scene, got {type(scene).__name__}")
        reflectors = tuple(reflectors)
        for i, r in enumerate(reflectors):
            if not isinstance(r, Reflector):
                raise ValueError(f"reflectors[{i}] must be a Reflector, got {type(r).__name__}")
        check_reflectors(reflectors, order, allow_empty=True)
        for r in reflectors:
            if is_concrete(r.point, r.normal, scene.ap_positions):
                # in NumPy: under jit even operations on constants are traced
                ap, point, normal = (np.asarray(v) for v in (scene.ap_positions, r.point, r.normal))
                h = (ap - point) @ normal
                if np.any(h < -MOUNT_TOLERANCE):
                    m = int(np.argmin(h))
                    raise ValueError(
                        f"AP {m} lies {-h[m]:.3g} m behind reflector {r.name!r}: APs must be "
                        "in front of (or on) every reflector"
                    )
        object.__setattr__(self, "scene", scene)
        object.__setattr__(self, "reflectors", reflectors)
        object.__setattr__(self, "order", order)

    # ------------------------------------------------ CalibratableModel (calibration's view)

    piecewise = False  # smooth phases (no shadows)

    @property
    def surface_names(self) -> tuple[str, ...]:
        """The reflectors' names, in order."""
        return tuple(r.name for r in self.reflectors)

    def with_scene(self, scene: Scene) -> ImageSourceModel:
        """The same reflectors in ``scene``."""
        return ImageSourceModel(scene, self.reflectors, self.order)

    def with_permittivities(self, eps_r: Array, indices: tuple[int, ...]) -> ImageSourceModel:
        """Reflector ``indices[j]`` given permittivity ``eps_r[j]``."""
        refl = list(self.reflectors)
        for j, k in enumerate(indices):
            refl[k] = refl[k].with_permittivity(eps_r[j])
        return ImageSourceModel(self.scene, refl, self.order)

    def mounted(self) -> list[list[np.ndarray]]:
        """Per AP, the unit normals of the reflectors within ``MOUNT_TOLERANCE`` of it."""
        ap = np.asarray(self.scene.ap_positions, float)
        out: list[list[np.ndarray]] = [[] for _ in range(ap.shape[0])]
        for r in self.reflectors:
            h = (ap - np.asarray(r.point)) @ np.asarray(r.normal)
            for m in np.flatnonzero(np.abs(h) <= MOUNT_TOLERANCE):
                out[m].append(np.asarray(r.normal, float))
        return out

    def calibration_surfaces(self, surfaces: Any = None) -> tuple[list[int], list[str]]:
        """Named reflectors (distinct, dielectric, met by a path), by default every one."""
        names = [r.name for r in self.reflectors]
        ap = np.asarray(self.scene.ap_positions)
        seen = [
            bool(np.any(np.asarray(r.height(ap)) > MOUNT_TOLERANCE)) or self.order >= 2
            for r in self.reflectors
        ]
        if surfaces is None:
            surfaces = [
                r.name
                for r, ok in zip(self.reflectors, seen, strict=True)
                if ok and not r.perfect_conductor
            ]
        if len(set(surfaces)) != len(list(surfaces)):
            raise ValueError(f"surfaces must not repeat a name, got {list(surfaces)}")
        idx = []
        for s in surfaces:
            if s not in names:
                raise ValueError(f"surfaces: no reflector named {s!r} (the model has {names})")
            if names.count(s) > 1:
                raise ValueError(
                    f"surfaces: {names.count(s)} reflectors are named {s!r}; rename them"
                )
            k = names.index(s)
            if self.reflectors[k].perfect_conductor:
                raise ValueError(f"surfaces: {s!r} is a perfect conductor, it has no eps_r to fit")
            if not seen[k]:
                raise ValueError(
                    f"surfaces: every AP is mounted on {s!r}, so no path bounces off it and its "
                    "eps_r does not enter the phases"
                )
            idx.append(k)
        if not idx:
            raise ValueError(
                "fit: 'surfaces' asked, but the model has no dielectric surface to fit"
            )
        return idx, list(surfaces)

    def relative_reflections(self, x: ArrayLike) -> tuple[Array, Array]:
        r"""``(d1, rho)``: LoS lengths (M,) and :math:`\rho_{mk}` (M, P) (zero for absent paths),
        each bounce weighted by its antenna gain relative to the LoS one (isotropic: 1)."""
        return self._relative(x)[:2]

    def _relative(self, x: ArrayLike) -> tuple[Array, Array, Array | None]:
        """``(d1, rho, los_gain)``: rho of isotropic APs times the bounce's gain F_mk, and
        the LoS gain F_m (None for isotropic APs, where both gains are 1)."""
        x = jnp.asarray(x, self.scene.ap_positions.dtype)
        ap = self.scene.ap_positions
        d1 = safe_norm(ap - x[None, :])
        isotropic = is_isotropic(self.scene.antenna)
        los_gain = None
        if not isotropic:
            u1 = (x[None, :] - ap) / d1[:, None]
            los_gain = self.scene.antenna.field(u1[:, None, :])[:, 0]
        if not self.reflectors:
            return d1, jnp.zeros((self.num_aps, 0), jnp.result_type(x, jnp.complex64)), los_gain
        paths = image_paths(x, self.scene, self.reflectors, self.order, directions=not isotropic)
        k = 2 * jnp.pi / self.scene.wavelength
        phase = k * paths.path_difference
        ratio = d1[:, None] / paths.length  # real: folded into the phasor, one complex product
        if not isotropic:
            ratio = ratio * self.scene.antenna.field(paths.departure)
        rho = paths.gamma * lax.complex(ratio * jnp.cos(phase), -ratio * jnp.sin(phase))
        return d1, jnp.where(paths.valid, rho, 0.0), los_gain

    def phasor_ratio(self, x: ArrayLike) -> tuple[Array, Array]:
        r"""``(d1, s)``: the total channel relative to the isotropic LoS phasor (phase offset
        excluded), :math:`s_m = F_m + \sum_k F_{mk}\rho_{mk}` (:math:`1+\sum_k\rho_{mk}` for
        isotropic APs), (M,) each."""
        self._check_x(x)
        return self._ratio(x)

    def _ratio(self, x: ArrayLike) -> tuple[Array, Array]:
        d1, rho, los_gain = self._relative(x)
        total = jnp.sum(rho, axis=-1)
        return d1, (1.0 if los_gain is None else los_gain) + total

    def perturbation(self, x: ArrayLike) -> Array:
        r"""Phase moved by all bounces, :math:`-\arg(1+\sum_k\rho_{mk})`, (M,) radians (the
        AP's phase offset excluded)."""
        return -safe_arg(self.phasor_ratio(x)[1])

    def __repr__(self) -> str:
        names = ", ".join(r.name for r in self.reflectors)
        return f"ImageSourceModel(M={self.num_aps}, reflectors=[{names}], order={self.order})"
