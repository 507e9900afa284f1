"""The PhaseModel protocol: what every propagation model offers the rest of the package.

A PhaseModel maps **one** UE position ``x`` (3,) to the per-AP mean carrier phase without
the CPO, ``mean(x)`` (M,) (unwrapped, radians), and the phase-noise variance
``variance(x)`` (M,) (rad^2), and carries the :class:`~dmimo_jax.scene.Scene` whose
geometry it describes (``.scene``: AP positions, wavelength, UE region, powers). The
analytic two-ray model, the GP models of Sec. III and the image-source room model all
implement it, so simulation, bounds, estimators and metrics are written once.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_away_from_aps, check_positions, is_concrete
from dmimo_jax.phase import safe_abs, safe_arg
from dmimo_jax.physics.two_ray import TwoRayModel, noise_var_from_amplitude
from dmimo_jax.scene import Scene


@runtime_checkable
class PhaseModel(Protocol):
    """Anything mapping one UE position (3,) to per-AP mean phase (M,) and variance (M,).

    Attributes:
        scene: the deployment the model describes (geometry, wavelength, UE region).
        num_aps: M.
    """

    @property
    def scene(self) -> Scene: ...

    @property
    def num_aps(self) -> int: ...

    def mean(self, x: ArrayLike) -> Array:
        """Mean carrier phase without CPO, (M,) radians, unwrapped."""
        ...

    def variance(self, x: ArrayLike) -> Array:
        """Phase-noise variance, (M,) rad^2."""
        ...


@runtime_checkable
class CalibratableModel(PhaseModel, Protocol):
    """A PhaseModel whose deployment unknowns :func:`~dmimo_jax.calibration.calibrate` can
    set: it knows its own surfaces, mounts and scene, so calibration needs no case per model
    kind (:class:`~dmimo_jax.TwoRayModel`, :class:`~dmimo_jax.ImageSourceModel`,
    :class:`~dmimo_jax.physics.MeshModel` and the receivers'
    :class:`~dmimo_jax.receivers.ReceiverModel` around any of them implement it; a new
    model kind that does is calibrated as it is).

    Attributes:
        surface_names: the names of its permittivities (a surface, a reflector, a material).
        piecewise: whether its phases jump across shadow boundaries (a scene of faces: the
            fit sets a boundary's outliers aside for a round).
    """

    @property
    def surface_names(self) -> tuple[str, ...]: ...

    piecewise: bool

    def with_scene(self, scene: Scene) -> Any:
        """The same model of ``scene`` (its APs, offsets, antenna; traceable)."""
        ...

    def with_permittivities(self, eps_r: Array, indices: tuple[int, ...]) -> Any:
        """The model with the permittivities of ``surface_names[k]`` for k in ``indices``
        set to ``eps_r`` (checked by the caller; traceable)."""
        ...

    def mounted(self) -> list[list[np.ndarray]]:
        """Per AP, the unit normals of the surfaces it is mounted on (it moves within them)."""
        ...

    def calibration_surfaces(self, surfaces: Any) -> tuple[list[int], list[str]]:
        """The indices and names of the surfaces a fit can calibrate: ``surfaces`` (names)
        checked, or by default every dielectric surface a path bounces off.

        Raises:
            ValueError: a name it does not have, a perfect conductor, a surface no path
                meets, or none at all."""
        ...


def as_phase_model(model_or_scene: PhaseModel | Scene | Any) -> PhaseModel:
    """A :class:`~dmimo_jax.scene.Scene` becomes its two-ray model; a PhaseModel passes.

    Raises:
        ValueError: anything else (the message names what is missing).
    """
    if isinstance(model_or_scene, Scene):
        return TwoRayModel(model_or_scene)
    missing = [
        a for a in ("mean", "variance", "scene", "num_aps") if not hasattr(model_or_scene, a)
    ]
    if missing:
        raise ValueError(
            "model must be a Scene or a PhaseModel with mean(x), variance(x), .scene and "
            f".num_aps, got {type(model_or_scene).__name__} (missing {', '.join(missing)})"
        )
    return model_or_scene


def check_in_domain(name: str, x: Any, model: PhaseModel) -> None:
    """``ValueError`` when concrete position(s) ``x`` (3,) or (N, 3) lie where ``model`` is
    not defined: on an AP (the LoS amplitude of eq. 9 is infinite there), or, for a model
    with ``reflectors`` (a room, :class:`~dmimo_jax.physics.ImageSourceModel`), on or behind
    one of them (its image paths assume a UE inside the room), or where the model's own
    ``check_domain(name, x)`` refuses it (a :class:`~dmimo_jax.physics.MeshModel`: on a face
    or inside a solid). Traced input passes.

    The one rule of simulation, bounds and calibration for positions (shapes and
    finiteness are :func:`~dmimo_jax._checks.check_positions`'s).
    """
    check_away_from_aps(name, x, model.scene.ap_positions)
    check_domain = getattr(model, "check_domain", None)
    if check_domain is not None:  # a model with rules of its own (a scene of faces)
        check_domain(name, x)
    for refl in getattr(model, "reflectors", ()):
        if not is_concrete(x, refl.point, refl.normal):
            continue
        pts = np.asarray(x, float).reshape(-1, 3)
        h = (pts - np.asarray(refl.point, float)) @ np.asarray(refl.normal, float)
        i = int(np.argmin(h))
        if not h[i] > 0:
            where = "" if np.ndim(x) == 1 else f" (row {i})"
            raise ValueError(
                f"{name}{where} = {pts[i].tolist()} is {'on' if h[i] == 0 else 'behind'} "
                f"reflector {refl.name!r} (signed distance {h[i]:.3g} m): positions must lie "
                "strictly inside the room, in front of every reflector"
            )


class PhasorSumModel:
    r"""The PhaseModel methods of a model that sums path phasors (rooms, scenes of faces).

    A subclass has ``scene`` and ``_ratio(x) -> (d1, s)``: the LoS lengths (M,) and the
    total channel relative to the isotropic LoS phasor (M,) (phase offset excluded). Then
    eq. (7) and eq. (9) give ``mean`` :math:`2\pi d^{(1)}_m/\lambda - \arg s_m + \delta_m`,
    ``amplitude`` :math:`\frac{\lambda}{4\pi d^{(1)}_m}|s_m|` (0 where no path reaches) and
    ``variance`` (inf there). Positions are checked once per public call
    (:func:`check_in_domain`).
    """

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.scene.num_aps

    def _check_x(self, x: ArrayLike) -> None:
        check_positions("x", x, batched=False)
        check_in_domain("x", x, self)

    def mean(self, x: ArrayLike) -> Array:
        r""":math:`2\pi d^{(1)}_m/\lambda - \arg s_m + \delta_m`, unwrapped by the LoS, (M,)."""
        self._check_x(x)
        return self._mean(x)

    # compiled as one program per model and shape when called outside jit (a script, an
    # eager vmap), instead of an eager dispatch per operation; inlined inside a jitted caller
    @jax.jit
    def _mean(self, x: ArrayLike) -> Array:
        d1, s = self._ratio(x)
        return 2 * jnp.pi / self.scene.wavelength * d1 - safe_arg(s) + self.scene.ap_phase_offsets

    def amplitude(self, x: ArrayLike) -> Array:
        r"""Effective amplitude :math:`\frac{\lambda}{4\pi d^{(1)}_m}|s_m|`, (M,)."""
        self._check_x(x)
        return self._amplitude(x)

    @jax.jit
    def _amplitude(self, x: ArrayLike) -> Array:
        d1, s = self._ratio(x)
        return self.scene.wavelength / (4 * jnp.pi * d1) * safe_abs(s)

    def variance(self, x: ArrayLike) -> Array:
        """Eq. (9) with the effective amplitude of all paths, rad^2, (M,)."""
        self._check_x(x)
        return self._variance(x)

    @jax.jit
    def _variance(self, x: ArrayLike) -> Array:
        return noise_var_from_amplitude(self._amplitude(x), self.scene)
