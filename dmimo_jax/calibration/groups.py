r"""The groups of unknowns :func:`~dmimo_jax.calibration.calibrating` fits, as objects.

Each group is a small pytree (:class:`Group`): its arrays (``data``: what its
parametrization needs, a position basis, a gauge entry, a boresight) and its start ``u0``
are leaves, its layout is static, so one compiled solver serves every calibration of the
same shapes. A group knows

* how it sets its unknowns on a model (:meth:`Group.apply`, traceable),
* its natural values (m, rad, :math:`\mathrm{Re}/\mathrm{Im}\,\varepsilon_r`, exponents;
  :meth:`Group.natural`), the parametrization of the standard errors, and how
  :class:`~dmimo_jax.calibration.Calibration` reports them (:meth:`Group.report`),
* its Gaussian prior, if any (:meth:`Group.prior_residuals`),
* and, for the column-compressed Jacobian of complex snapshots, which AP each of its
  unknowns moves (:meth:`Group.per_ap_layout`; ``None``: it moves every AP).

The builders (:func:`positions_group`, :func:`surfaces_group`, :func:`antenna_group`,
:func:`receiver_groups`) make a group's start from a model.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax.antenna import CosinePattern
from dmimo_jax.physics import CalibratableModel, PhaseModel
from dmimo_jax.pytree import pytree_dataclass, static_field
from dmimo_jax.receivers import ReceiverModel, Receivers

MIN_EXPONENT_START = 0.1
"""The smallest antenna exponent ``"antenna"`` starts from (a smaller start starts here)."""


@pytree_dataclass
class Group:
    """One group of unknowns: its arrays and start (leaves), its layout (static).

    Subclasses set :attr:`name` (the ``fit=`` shorthand) and say how they apply, show and
    report themselves. ``u`` is the group's slice of the solver's unconstrained vector."""

    name: ClassVar[str] = ""

    data: Any
    u0: Array  # (n,) start in the unconstrained parametrization
    meta: Any = static_field(default=None)  # hashable: surface indices, the exponent's shape
    # True: ``u`` holds the natural values themselves (Re/Im eps, the exponent), the
    # parametrization of the standard errors (regular at the physical bounds, where the
    # parametrization's derivative is not defined)
    linear: bool = static_field(default=False)

    @property
    def size(self) -> int:
        return self.u0.shape[0]

    def apply(self, model: Any, u: Array) -> Any:
        """The model with this group's unknowns set from ``u`` (traceable)."""
        raise NotImplementedError

    def natural(self, u: Array) -> Array:
        """Flat real natural values (m, rad, Re/Im eps, exponent) of ``u``."""
        return u

    def report(self, v: Array) -> Array:
        """Flat natural values (or their errors) in the shape :class:`~dmimo_jax.calibration.calibrating.Calibration` reports."""
        return v

    def prior_residuals(self, u: Array) -> Array:
        """Whitened residuals of the group's Gaussian prior, (n,) or (0,)."""
        scale = self.data.get("prior_scale")
        if scale is None:
            return u[:0]
        return (u + self.data.get("prior_offset", 0.0)) * scale

    def linearized(self, u: Array) -> tuple[Group, Array]:
        """The same group at the same point with ``u`` the natural values: (group, u)."""
        return self, u

    def per_ap_layout(self, num_aps: int) -> tuple[list[int], list[int]] | None:
        """Per unknown, the AP whose channel it moves and its colour (unknowns of one colour
        move different APs: one forward-mode tangent per colour); ``None`` when an unknown
        moves every AP."""
        return None


def _complex(u: Array, first: Array | None) -> Array:
    """(M,) complex from [Re, Im] halves, after the gauge entry ``first`` if any."""
    k = u.shape[0] // 2
    z = u[:k] + 1j * u[k:]
    return z if first is None else jnp.concatenate([first.astype(z.dtype), z])


def _re_im(z: Array) -> Array:
    return jnp.concatenate([jnp.real(z), jnp.imag(z)])


def _as_complex(v: Array) -> Array:
    k = v.shape[0] // 2
    return v[:k] + 1j * v[k:]


@pytree_dataclass
class PositionsGroup(Group):
    """``"ap_positions"``: the phase centres, ``u`` the displacement from ``data["start"]``
    in the basis ``data["basis"]`` (3M, n) of the free coordinates; an optional Gaussian
    prior (``data["prior_scale"]``, 1/std) centred on the model's positions."""

    name: ClassVar[str] = "ap_positions"

    def positions(self, u: Array) -> Array:
        start, basis = self.data["start"], self.data["basis"]
        return start + (basis @ u).reshape(start.shape)

    def apply(self, model: Any, u: Array) -> Any:
        return model.with_scene(model.scene.replace(ap_positions=self.positions(u)))

    def natural(self, u: Array) -> Array:
        return self.positions(u).reshape(-1)

    def report(self, v: Array) -> Array:
        return v.reshape(-1, 3)

    def per_ap_layout(self, num_aps: int) -> tuple[list[int], list[int]] | None:
        ap_of, colour_of, seen = [], [], np.zeros(num_aps, int)
        for col in np.asarray(self.data["basis"]).T:
            aps = np.unique(np.flatnonzero(np.abs(col) > 0) // 3)
            if len(aps) != 1:
                return None
            ap_of.append(int(aps[0]))
            colour_of.append(4 + seen[aps[0]])
            seen[aps[0]] += 1
        return ap_of, colour_of


@pytree_dataclass
class OffsetsGroup(Group):
    """``"ap_phase_offsets"``: the per-AP offsets after AP 0's (``data["first"]``, the
    gauge: only differences are observable)."""

    name: ClassVar[str] = "ap_phase_offsets"

    @classmethod
    def from_start(cls, start: Array) -> OffsetsGroup:
        """The group starting at the offsets ``start`` (M,): AP 0's is the gauge."""
        return cls({"first": start[:1]}, start[1:])

    def offsets(self, u: Array) -> Array:
        return jnp.concatenate([self.data["first"], u])

    def apply(self, model: Any, u: Array) -> Any:
        return model.with_scene(model.scene.replace(ap_phase_offsets=self.offsets(u)))

    def natural(self, u: Array) -> Array:
        return self.offsets(u)


@pytree_dataclass
class SurfacesGroup(Group):
    r"""``"surfaces"``: the permittivities of the surfaces at indices ``meta``,
    ``u`` = [a, b] with :math:`\varepsilon' = 1 + |a|`, :math:`\varepsilon'' = |b|`
    (:func:`permittivities_of`), or [Re, Im] themselves when ``linear``."""

    name: ClassVar[str] = "surfaces"

    def eps(self, u: Array) -> Array:
        return _as_complex(u) if self.linear else permittivities_of(u)

    def apply(self, model: Any, u: Array) -> Any:
        return with_permittivities(model, self.eps(u), self.meta)

    def natural(self, u: Array) -> Array:
        return _re_im(self.eps(u))

    def report(self, v: Array) -> Array:
        return _as_complex(v)

    def linearized(self, u: Array) -> tuple[Group, Array]:
        return dataclasses.replace(self, linear=True), self.natural(u)


@pytree_dataclass
class AntennaGroup(Group):
    """``"antenna"``: a :class:`~dmimo_jax.CosinePattern`'s exponent (shape ``meta``),
    :math:`q = |u|` (or ``u`` itself when ``linear``)."""

    name: ClassVar[str] = "antenna"

    def apply(self, model: Any, u: Array) -> Any:
        q = self.natural(u)
        pattern = CosinePattern(exponent=q.reshape(self.meta), boresight=self.data["boresight"])
        return model.with_scene(model.scene.replace(antenna=pattern))

    def natural(self, u: Array) -> Array:
        return u if self.linear else jnp.abs(u)

    def report(self, v: Array) -> Array:
        return v.reshape(self.meta)

    def linearized(self, u: Array) -> tuple[Group, Array]:
        return dataclasses.replace(self, linear=True), self.natural(u)


@pytree_dataclass
class ReceiverGainsGroup(Group):
    """``"receiver_gains"``: the complex gains of a ReceiverModel's receivers after AP 0's
    (``data["first"]``, the gauge), ``u`` = [Re, Im]."""

    name: ClassVar[str] = "receiver_gains"

    def apply(self, model: Any, u: Array) -> Any:
        rx = Receivers(_complex(u, self.data["first"]), model.receivers.constants)
        return ReceiverModel(model.model, rx)

    def natural(self, u: Array) -> Array:
        return _re_im(_complex(u, self.data["first"]))

    def report(self, v: Array) -> Array:
        return _as_complex(v)

    def per_ap_layout(self, num_aps: int) -> tuple[list[int], list[int]] | None:
        # [Re G_1.., Im G_1..]: G_0 is the gauge
        return [*range(1, num_aps), *range(1, num_aps)], [0] * (num_aps - 1) + [1] * (num_aps - 1)


@pytree_dataclass
class ReceiverConstantsGroup(Group):
    """``"receiver_constants"``: the receivers' additive constants, ``u`` = [Re b, Im b]."""

    name: ClassVar[str] = "receiver_constants"

    def apply(self, model: Any, u: Array) -> Any:
        return ReceiverModel(model.model, Receivers(model.receivers.gains, _complex(u, None)))

    def report(self, v: Array) -> Array:
        return _as_complex(v)

    def per_ap_layout(self, num_aps: int) -> tuple[list[int], list[int]] | None:
        return [*range(num_aps), *range(num_aps)], [2] * num_aps + [3] * num_aps


# ------------------------------------------------------------------ models and their leaves


def permittivities_of(u: Array) -> Array:
    r"""Complex permittivities from the surfaces' unconstrained ``u`` = [a, b] (2K,):
    :math:`\varepsilon' = 1 + |a|`, :math:`\varepsilon'' = |b|` (physical for every a, b)."""
    k = u.shape[0] // 2
    return (1.0 + jnp.abs(u[:k])) - 1j * jnp.abs(u[k:])


def position_basis(model: Any, free_axes: ArrayLike | None) -> np.ndarray:
    """(3M, n) matrix A: positions.ravel() = start.ravel() + A @ u."""
    num = model.num_aps
    mounted = model.mounted()
    columns = []
    if free_axes is None:
        for m in range(num):
            normals = np.array(mounted[m]).reshape(-1, 3)
            # the orthogonal complement of the planes' normals: the directions the AP may move
            _, s, vt = np.linalg.svd(np.vstack([normals, np.zeros((3, 3))]))
            rank = int(np.sum(s > 1e-9))
            for v in vt[rank:]:
                col = np.zeros(3 * num)
                col[3 * m : 3 * m + 3] = v
                columns.append(col)
    else:
        mask = np.asarray(free_axes)
        if mask.shape != (num, 3) or mask.dtype != bool:
            raise ValueError(
                f"Positions.free_axes must be a bool array of shape ({num}, 3) (which coordinates of "
                f"each AP to fit), got {mask.dtype} {mask.shape}"
            )
        for m in range(num):
            for axis in np.flatnonzero(mask[m]):
                for n in mounted[m]:
                    if abs(n[axis]) > 1e-9:
                        raise ValueError(
                            f"free_axes asks AP {m} to move along {'xyz'[axis]}, off the "
                            f"surface it is mounted on (normal {np.round(n, 6).tolist()}): "
                            "mounted APs move only within their surface"
                        )
                col = np.zeros(3 * num)
                col[3 * m + axis] = 1.0
                columns.append(col)
    return np.stack(columns, axis=1) if columns else np.zeros((3 * num, 0))


def positions_group(
    model: Any,
    free_axes: ArrayLike | None,
    prior_std: float | None = None,
    position_start: ArrayLike | None = None,
) -> Group:
    """The phase centres' group: ``u`` the displacement from ``position_start`` (default the
    model's positions) in the basis of the free coordinates; the prior (``prior_std``) stays
    centred on the model's positions."""
    nominal = jnp.asarray(model.scene.ap_positions)
    basis_np = position_basis(model, free_axes)
    basis = jnp.asarray(basis_np, nominal.dtype)
    start, shift = nominal, np.zeros(basis_np.shape[1])
    if position_start is not None:
        delta = (np.asarray(position_start, float) - np.asarray(nominal)).reshape(-1)
        shift = basis_np.T @ delta  # the basis is orthonormal
        if np.max(np.abs(basis_np @ shift - delta), initial=0.0) > 1e-9:
            raise ValueError(
                "Positions.start moves an AP along a coordinate the fit keeps fixed (free_axes "
                "or its mounting surface): start within the free coordinates"
            )
        start = jnp.asarray(position_start, nominal.dtype)
    u0 = jnp.zeros(basis.shape[1], nominal.dtype)
    data = {"start": start, "basis": basis}
    if prior_std is not None:
        data["prior_scale"] = jnp.asarray(1.0 / prior_std, nominal.dtype)
        if position_start is not None:
            data["prior_offset"] = jnp.asarray(shift, nominal.dtype)
    return PositionsGroup(data, u0)


def receiver_groups(model: Any, fit: Sequence[str]) -> list[Group]:
    """The receiver groups of ``fit`` at the receivers of the ReceiverModel ``model``."""
    rx, out = model.receivers, []
    if "receiver_gains" in fit:
        g = rx.gains
        u0 = jnp.concatenate([jnp.real(g[1:]), jnp.imag(g[1:])])
        out.append(ReceiverGainsGroup({"first": g[:1]}, u0))
    if "receiver_constants" in fit:
        b = rx.constants
        out.append(ReceiverConstantsGroup({}, jnp.concatenate([jnp.real(b), jnp.imag(b)])))
    return out


def with_permittivities(model: PhaseModel, eps_r: ArrayLike, surfaces: Sequence[int]) -> Any:
    """``model`` with the permittivity of the surfaces at indices ``surfaces`` replaced.

    For a :class:`TwoRayModel` the only surface is the ground (index 0); for an
    :class:`ImageSourceModel` the indices run over its reflectors; for a
    :class:`~dmimo_jax.physics.MeshModel` over its materials (``surface_names``: faces that
    share a name share the permittivity).
    Works on tracers.

    Raises:
        ValueError: an index out of range or repeated, or not one permittivity per index.
    """
    if not isinstance(model, CalibratableModel):
        raise ValueError(
            "model must be a TwoRayModel, an ImageSourceModel, a MeshModel or another "
            f"CalibratableModel (one that knows its surfaces), got {type(model).__name__}"
        )
    eps_r = jnp.atleast_1d(jnp.asarray(eps_r))
    num = len(model.surface_names)
    surfaces = tuple(surfaces)
    if not all(isinstance(k, int | np.integer) and 0 <= k < num for k in surfaces):
        raise ValueError(
            f"surfaces must be indices of the model's {num} surface(s) (0 ... {num - 1}), "
            f"got {surfaces}"
        )
    if len(set(surfaces)) != len(surfaces) or eps_r.shape != (len(surfaces),):
        raise ValueError(
            f"eps_r must hold one permittivity per distinct index of surfaces "
            f"({len(surfaces)}), got eps_r of shape {eps_r.shape} for surfaces {surfaces}"
        )
    return model.with_permittivities(eps_r, tuple(int(k) for k in surfaces))


def surfaces_group(model: Any, idx: Sequence[int], eps0: np.ndarray) -> Group:
    u0 = np.concatenate(
        [
            np.maximum(eps0.real - 1.0, 0.0),
            np.maximum(-eps0.imag, 0.0),
        ]
    )
    return SurfacesGroup({}, jnp.asarray(u0), tuple(idx))


def antenna_group(model: Any) -> Group:
    pattern = model.scene.antenna
    if not isinstance(pattern, CosinePattern):
        raise ValueError(
            f"fit: 'antenna' fits a CosinePattern's exponent; the model's antenna is a "
            f"{type(pattern).__name__}"
        )
    q0 = np.atleast_1d(np.asarray(pattern.exponent, float))
    u0 = jnp.asarray(np.maximum(q0, MIN_EXPONENT_START))
    return AntennaGroup({"boresight": pattern.boresight}, u0, tuple(pattern.exponent.shape))
