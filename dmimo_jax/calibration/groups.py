r"""What :func:`~dmimo_jax.calibration.calibrate` fits: one class per group of unknowns,
which is both the user's request and the parameter block the fit runs on.

``fit=(Positions(prior=0.01), Offsets(), Surfaces(names=("floor",)))`` fits the APs' phase
centres under a 1 cm survey prior, their phase offsets and the floor's permittivity. A
string is the shorthand for a group with its defaults (:data:`GROUPS`: ``"ap_positions"``
is ``Positions()``, ``"ap_phase_offsets"`` ``Offsets()``, ``"surfaces"`` ``Surfaces()``,
``"antenna"`` ``Antenna()``, ``"polarization"`` ``Polarization()``, ``"receiver_gains"``
``ReceiverGains()``, ``"receiver_constants"`` ``ReceiverConstants()``); the two mix freely.

A request (the options a user sets) builds itself on a :class:`Deployment`
(:meth:`FitGroup.build`): the same class with its arrays and its start ``u0`` filled in.
Built, it is a small pytree whose arrays are leaves and whose layout is static, so one
compiled solver serves every calibration of the same shapes. A group knows

* what it refuses before any work (:meth:`FitGroup.check`), how it starts
  (:meth:`FitGroup.build`, :meth:`FitGroup.build_starts`; the flags
  :attr:`FitGroup.closed_form` and :attr:`FitGroup.multistart` place it in the stages of
  :func:`~dmimo_jax.calibration.staging.fit_staged`),
* how it sets its unknowns on a model (:meth:`FitGroup.apply`, traceable),
* its natural values (m, rad, :math:`\mathrm{Re}/\mathrm{Im}\,\varepsilon_r`, exponents;
  :meth:`FitGroup.natural`), the parametrization of the standard errors, and how
  :class:`~dmimo_jax.calibration.Calibration` reports them (:meth:`FitGroup.report`),
* its Gaussian prior, if any (:meth:`FitGroup.prior_residuals`),
* and, for the column-compressed Jacobian of complex snapshots, which AP each of its
  unknowns moves (:meth:`FitGroup.per_ap_layout`; ``None``: it moves every AP).

A new kind of unknown is one new subclass: :func:`~dmimo_jax.calibration.calibrate` takes
any :class:`FitGroup` object, and nothing else names the groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar, NamedTuple

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_positions, check_scalar
from dmimo_jax.antenna import CosinePattern
from dmimo_jax.calibration.closed_form import offsets_closed_form
from dmimo_jax.calibration.parametrization import (
    MIN_EXPONENT_START,
    permittivities_of,
    permittivity_starts,
    position_basis,
    with_permittivities,
)
from dmimo_jax.pytree import pytree_dataclass, static_field
from dmimo_jax.receivers import ReceiverModel, Receivers


class Deployment(NamedTuple):
    """One deployment's labeled data under the model it is fitted with (checked arrays of
    the model's dtype; ``r`` phases or complex snapshots, the model then a
    :class:`~dmimo_jax.receivers.ReceiverModel`). A pytree: the solver's argument."""

    model: Any
    x: Array
    """(L, 3)."""
    r: Array
    """(L, M)."""
    noise_var: Array
    """(L, M)."""


@pytree_dataclass
class FitGroup:
    """A group of unknowns: the request (its options, set by the user) and, once built on a
    deployment (:meth:`build`), its arrays and start (leaves) and layout (static).

    Subclasses set :attr:`name` (the ``fit=`` shorthand and the key in
    ``Calibration.values`` / ``stderr``) and override :meth:`build`, :meth:`apply` and, when
    their values are not ``u`` itself, :meth:`natural` and :meth:`report`. ``u`` is the
    group's slice of the solver's unconstrained vector.

    Attributes:
        u0: (n,) the start in the unconstrained parametrization (``None`` until built).
        linear: ``u`` holds the natural values themselves (Re/Im eps, the exponent): the
            parametrization of the standard errors (regular at the physical bounds, where
            the fit's parametrization has no derivative).
    """

    name: ClassVar[str] = ""
    closed_form: ClassVar[bool] = False
    """Started from the data in closed form: fitted first, beside the multi-start groups."""
    multistart: ClassVar[bool] = False
    """Started from each of :meth:`build_starts`, the best kept, before the joint fit."""
    continuous: ClassVar[bool] = True
    """Has unknowns of its own (:class:`Polarization` has none: it runs the fit twice)."""

    u0: Array | None = dataclasses.field(default=None, kw_only=True)
    linear: bool = static_field(default=False, kw_only=True)

    # -------------------------------------------------------------- the request

    def check(self, model: Any, complex_data: bool) -> None:
        """``ValueError`` for a request the model or the data cannot take, before any work."""

    def build(self, deployment: Deployment) -> FitGroup | None:
        """This group built on ``deployment``: its arrays and start (``None``: no unknowns)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how it builds itself")

    def build_starts(self, deployment: Deployment) -> tuple[FitGroup, ...]:
        """The group built at each of its starts (a :attr:`multistart` group has several)."""
        built = self.build(deployment)
        return () if built is None else (built,)

    def polarizations(self) -> tuple[str, ...]:
        """The polarizations the fit must run under, each in turn (none: the model's own)."""
        return ()

    # -------------------------------------------------------------- the fit

    @property
    def size(self) -> int:
        """The number of unknowns n (the length of ``u0``)."""
        return self.u0.shape[0]

    def apply(self, model: Any, u: Array) -> Any:
        """The model with this group's unknowns set from ``u`` (traceable)."""
        raise NotImplementedError(f"{type(self).__name__} does not say how it applies itself")

    def natural(self, u: Array) -> Array:
        """Flat real natural values (m, rad, Re/Im eps, exponent) of ``u``."""
        return u

    def report(self, v: Array) -> Array:
        """Flat natural values (or their errors) in the shape
        :class:`~dmimo_jax.calibration.Calibration` reports."""
        return v

    @property
    def prior_size(self) -> int:
        """How many prior pseudo-observations the group adds to the residuals."""
        return 0

    def prior_residuals(self, u: Array) -> Array:
        """Whitened residuals of the group's Gaussian prior, (:attr:`prior_size`,)."""
        return u[:0]

    def linearized(self, u: Array) -> tuple[FitGroup, Array]:
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
class Positions(FitGroup):
    """The APs' phase centres (``"ap_positions"``): ``u`` the displacement from
    :attr:`origin` in the orthonormal :attr:`basis` of the free coordinates.

    Attributes:
        free_axes: (M, 3) bool, the coordinates fitted (default: all three, or the two
            within the surface for an AP mounted on one).
        prior: the survey's standard deviation per coordinate, m: a Gaussian prior on the
            fitted centres around the model's (MAP; its terms count as observations in the
            chi-square). Default none (maximum likelihood).
        start: (M, 3) where the fit starts (e.g. an earlier fit's, to refit under other
            variances); the model's positions stay the prior's centre. Default the model's.
        origin: built: (M, 3) the positions at ``u = 0`` (``start`` or the model's).
        basis: built: (3M, n) the free coordinates' directions.
        prior_offset: built with ``prior`` and ``start``: (n,) ``start``'s displacement
            from the model's positions in the basis (the prior's centre is at ``-offset``).
    """

    free_axes: ArrayLike | None = None
    prior: float | None = static_field(default=None)
    start: ArrayLike | None = None
    origin: Array | None = None
    basis: Array | None = None
    prior_offset: Array | None = None
    name: ClassVar[str] = "ap_positions"

    def __post_init__(self) -> None:
        # a number (its value is checked where the fit runs); not text, a bool or an array
        p = self.prior
        if p is not None and (
            isinstance(p, bool | str) or np.ndim(p) != 0 or np.asarray(p).dtype.kind not in "iuf"
        ):
            raise ValueError(f"Positions.prior must be a number of metres or None, got {p!r}")
        if p is not None:
            object.__setattr__(self, "prior", float(p))  # static: hashable

    def check(self, model: Any, complex_data: bool) -> None:
        num_aps = model.num_aps
        if self.start is not None:
            check_positions("Positions.start", self.start, batched=True)
            if np.shape(self.start) != (num_aps, 3):
                raise ValueError(
                    f"Positions.start must have shape ({num_aps}, 3) (one per AP), got "
                    f"{np.shape(self.start)}"
                )
        if self.prior is not None:
            check_scalar("Positions.prior", self.prior, positive=True)

    def build(self, deployment: Deployment) -> Positions:
        model = deployment.model
        nominal = jnp.asarray(model.scene.ap_positions)
        basis_np = position_basis(model, self.free_axes)
        basis = jnp.asarray(basis_np, nominal.dtype)
        origin, offset = nominal, None
        if self.start is not None:
            delta = (np.asarray(self.start, float) - np.asarray(nominal)).reshape(-1)
            shift = basis_np.T @ delta  # the basis is orthonormal
            if np.max(np.abs(basis_np @ shift - delta), initial=0.0) > 1e-9:
                raise ValueError(
                    "Positions.start moves an AP along a coordinate the fit keeps fixed "
                    "(free_axes or its mounting surface): start within the free coordinates"
                )
            origin = jnp.asarray(self.start, nominal.dtype)
            offset = jnp.asarray(shift, nominal.dtype) if self.prior is not None else None
        u0 = jnp.zeros(basis.shape[1], nominal.dtype)
        return dataclasses.replace(self, origin=origin, basis=basis, prior_offset=offset, u0=u0)

    def positions(self, u: Array) -> Array:
        return self.origin + (self.basis @ u).reshape(self.origin.shape)

    def apply(self, model: Any, u: Array) -> Any:
        return model.with_scene(model.scene.replace(ap_positions=self.positions(u)))

    def natural(self, u: Array) -> Array:
        return self.positions(u).reshape(-1)

    def report(self, v: Array) -> Array:
        return v.reshape(-1, 3)

    @property
    def prior_size(self) -> int:
        return 0 if self.prior is None else self.size

    def prior_residuals(self, u: Array) -> Array:
        if self.prior is None:
            return u[:0]
        scale = jnp.asarray(1.0 / self.prior, u.dtype)
        return (u if self.prior_offset is None else u + self.prior_offset) * scale

    def per_ap_layout(self, num_aps: int) -> tuple[list[int], list[int]] | None:
        ap_of, colour_of, seen = [], [], np.zeros(num_aps, int)
        for col in np.asarray(self.basis).T:
            aps = np.unique(np.flatnonzero(np.abs(col) > 0) // 3)
            if len(aps) != 1:
                return None
            ap_of.append(int(aps[0]))
            colour_of.append(4 + seen[aps[0]])
            seen[aps[0]] += 1
        return ap_of, colour_of


@pytree_dataclass
class Offsets(FitGroup):
    """The APs' phase offsets (``"ap_phase_offsets"``; wrapped phases only), started in
    closed form (:func:`~dmimo_jax.calibration.offsets_closed_form`); AP 0's is the gauge
    (only differences are observable).

    Attributes:
        first: built: (1,) AP 0's offset, held fixed.
    """

    first: Array | None = None
    name: ClassVar[str] = "ap_phase_offsets"
    closed_form: ClassVar[bool] = True

    def check(self, model: Any, complex_data: bool) -> None:
        if complex_data:
            raise ValueError(
                "fit: complex snapshots carry the APs' phase offsets in 'receiver_gains' (the "
                "gains' phases); fit that instead of 'ap_phase_offsets'"
            )

    def build(self, deployment: Deployment) -> Offsets:
        return self.at(offsets_closed_form(deployment.model, deployment.x, deployment.r))

    def at(self, offsets: Array) -> Offsets:
        """The group starting at the offsets ``offsets`` (M,): AP 0's is the gauge."""
        return dataclasses.replace(self, first=offsets[:1], u0=offsets[1:])

    def offsets(self, u: Array) -> Array:
        return jnp.concatenate([self.first, u])

    def apply(self, model: Any, u: Array) -> Any:
        return model.with_scene(model.scene.replace(ap_phase_offsets=self.offsets(u)))

    def natural(self, u: Array) -> Array:
        return self.offsets(u)


@pytree_dataclass
class Surfaces(FitGroup):
    r"""The reflectors' complex permittivities (``"surfaces"``): ``u`` = [a, b] with
    :math:`\varepsilon' = 1 + |a|`, :math:`\varepsilon'' = |b|` (:func:`permittivities_of`),
    or [Re, Im] themselves when ``linear``. Fitted from every start of ``starts`` (all
    surfaces alike), the best kept.

    Attributes:
        names: the reflectors to fit (default: every dielectric surface some path bounces
            off; the model's ``calibration_surfaces``); built: the names resolved.
        starts: materials or permittivities the fit starts from, each a staged start
            (default :data:`~dmimo_jax.calibration.parametrization.CALIBRATION_STARTS`).
        indices: built: the surfaces' indices in the model.
    """

    names: Sequence[str] | None = static_field(default=None)
    starts: Sequence[complex | str] | None = static_field(default=None)
    indices: tuple[int, ...] = static_field(default=())
    name: ClassVar[str] = "surfaces"
    multistart: ClassVar[bool] = True

    def __post_init__(self) -> None:
        # one name is one surface (not its letters); tuples, so that the layout is hashable
        for field in ("names", "starts"):
            value = getattr(self, field)
            if isinstance(value, str):
                object.__setattr__(self, field, (value,))
            elif value is not None and not isinstance(value, Sequence | np.ndarray):
                raise ValueError(f"Surfaces: {field} must be a sequence or None, got {value!r}")
            elif value is not None:
                object.__setattr__(self, field, tuple(value))
        if self.names is not None and not all(isinstance(n, str) for n in self.names):
            raise ValueError(f"Surfaces: names must be surface names, got {self.names!r}")

    def check(self, model: Any, complex_data: bool) -> None:
        model.calibration_surfaces(self.names)
        permittivity_starts(float(model.scene.frequency), self.starts)

    def build_starts(self, deployment: Deployment) -> tuple[Surfaces, ...]:
        model = deployment.model
        idx, names = model.calibration_surfaces(self.names)
        out = []
        for e in permittivity_starts(float(model.scene.frequency), self.starts):
            eps0 = np.full(len(idx), e)
            u0 = np.concatenate([np.maximum(eps0.real - 1.0, 0.0), np.maximum(-eps0.imag, 0.0)])
            out.append(
                dataclasses.replace(
                    self, names=tuple(names), indices=tuple(idx), u0=jnp.asarray(u0)
                )
            )
        return tuple(out)

    def build(self, deployment: Deployment) -> Surfaces:
        return self.build_starts(deployment)[0]

    def eps(self, u: Array) -> Array:
        return _as_complex(u) if self.linear else permittivities_of(u)

    def apply(self, model: Any, u: Array) -> Any:
        return with_permittivities(model, self.eps(u), self.indices)

    def natural(self, u: Array) -> Array:
        return _re_im(self.eps(u))

    def report(self, v: Array) -> Array:
        return _as_complex(v)

    def linearized(self, u: Array) -> tuple[FitGroup, Array]:
        return dataclasses.replace(self, linear=True), self.natural(u)


@pytree_dataclass
class Antenna(FitGroup):
    """The APs' pattern exponent (``"antenna"``): a :class:`~dmimo_jax.CosinePattern`'s
    :math:`q = |u|` (or ``u`` itself when ``linear``), shared or one per AP as the model's.

    Attributes:
        boresight: built: the pattern's boresight.
        shape: built: the exponent's shape (() or (M,)).
    """

    boresight: Array | None = None
    shape: tuple[int, ...] = static_field(default=())
    name: ClassVar[str] = "antenna"

    def check(self, model: Any, complex_data: bool) -> None:
        pattern = model.scene.antenna
        if not isinstance(pattern, CosinePattern):
            raise ValueError(
                f"fit: 'antenna' fits a CosinePattern's exponent; the model's antenna is a "
                f"{type(pattern).__name__}"
            )

    def build(self, deployment: Deployment) -> Antenna:
        model = deployment.model
        self.check(model, False)
        pattern = model.scene.antenna
        q0 = np.atleast_1d(np.asarray(pattern.exponent, float))
        u0 = jnp.asarray(np.maximum(q0, MIN_EXPONENT_START))
        shape = tuple(pattern.exponent.shape)
        return dataclasses.replace(self, boresight=pattern.boresight, shape=shape, u0=u0)

    def apply(self, model: Any, u: Array) -> Any:
        q = self.natural(u)
        pattern = CosinePattern(exponent=q.reshape(self.shape), boresight=self.boresight)
        return model.with_scene(model.scene.replace(antenna=pattern))

    def natural(self, u: Array) -> Array:
        return u if self.linear else jnp.abs(u)

    def report(self, v: Array) -> Array:
        return v.reshape(self.shape)

    def linearized(self, u: Array) -> tuple[FitGroup, Array]:
        return dataclasses.replace(self, linear=True), self.natural(u)


@pytree_dataclass
class Polarization(FitGroup):
    """TE or TM, chosen by likelihood (``"polarization"``: the fit runs under each; no
    unknowns of its own, so it needs a continuous group beside it)."""

    name: ClassVar[str] = "polarization"
    continuous: ClassVar[bool] = False

    def build(self, deployment: Deployment) -> None:
        return None

    def polarizations(self) -> tuple[str, ...]:
        return ("TE", "TM")


def _check_complex(group: FitGroup, complex_data: bool) -> None:
    if not complex_data:
        raise ValueError(
            f"fit {group.name!r}: the receivers' groups need complex snapshots r (got phases)"
        )


@pytree_dataclass
class ReceiverGains(FitGroup):
    """Each receiver's complex gain (``"receiver_gains"``; complex snapshots): ``u`` = [Re,
    Im] of the gains after AP 0's (the gauge, :math:`G_0 = 1`), started in closed form
    (:func:`~dmimo_jax.calibration.receivers_closed_form`).

    Attributes:
        first: built: (1,) AP 0's gain, held fixed.
    """

    first: Array | None = None
    name: ClassVar[str] = "receiver_gains"
    closed_form: ClassVar[bool] = True

    def check(self, model: Any, complex_data: bool) -> None:
        _check_complex(self, complex_data)

    def build(self, deployment: Deployment) -> ReceiverGains:
        g = deployment.model.receivers.gains
        u0 = jnp.concatenate([jnp.real(g[1:]), jnp.imag(g[1:])])
        return dataclasses.replace(self, first=g[:1], u0=u0)

    def apply(self, model: Any, u: Array) -> Any:
        rx = Receivers(_complex(u, self.first), model.receivers.constants)
        return ReceiverModel(model.model, rx)

    def natural(self, u: Array) -> Array:
        return _re_im(_complex(u, self.first))

    def report(self, v: Array) -> Array:
        return _as_complex(v)

    def per_ap_layout(self, num_aps: int) -> tuple[list[int], list[int]] | None:
        # [Re G_1.., Im G_1..]: G_0 is the gauge
        return [*range(1, num_aps), *range(1, num_aps)], [0] * (num_aps - 1) + [1] * (num_aps - 1)


@pytree_dataclass
class ReceiverConstants(FitGroup):
    """Each receiver's additive constant b (``"receiver_constants"``; complex snapshots):
    ``u`` = [Re b, Im b], started in closed form
    (:func:`~dmimo_jax.calibration.receivers_closed_form`)."""

    name: ClassVar[str] = "receiver_constants"
    closed_form: ClassVar[bool] = True

    def check(self, model: Any, complex_data: bool) -> None:
        _check_complex(self, complex_data)

    def build(self, deployment: Deployment) -> ReceiverConstants:
        b = deployment.model.receivers.constants
        return dataclasses.replace(self, u0=jnp.concatenate([jnp.real(b), jnp.imag(b)]))

    def apply(self, model: Any, u: Array) -> Any:
        return ReceiverModel(model.model, Receivers(model.receivers.gains, _complex(u, None)))

    def report(self, v: Array) -> Array:
        return _as_complex(v)

    def per_ap_layout(self, num_aps: int) -> tuple[list[int], list[int]] | None:
        return [*range(num_aps), *range(num_aps)], [2] * num_aps + [3] * num_aps


FIT_GROUPS: tuple[type[FitGroup], ...] = (
    Positions, Offsets, Surfaces, Antenna, Polarization, ReceiverGains, ReceiverConstants,
)  # fmt: skip
"""The package's groups, in the fit's order (a group of another class follows them, in the
order given)."""

GROUPS = tuple(g.name for g in FIT_GROUPS)
"""Their shorthands."""


def as_fit_groups(fit: Any) -> tuple[FitGroup, ...]:
    """``fit`` (a group, its shorthand, or a sequence of them) as group objects, in the
    fit's order (:data:`FIT_GROUPS`' first, then any other class's in the order given).

    Raises:
        ValueError: an unknown name or object, none, a repeated group, or only groups
            without unknowns (``"polarization"`` alone).
    """
    if isinstance(fit, type) and issubclass(fit, FitGroup):
        raise ValueError(f"fit: pass a group object, {fit.__name__}(), not the class")
    if not isinstance(fit, str | FitGroup | Sequence):
        raise ValueError(f"fit must name groups among {GROUPS} or be their objects, got {fit!r}")
    items = (fit,) if isinstance(fit, str | FitGroup) else tuple(fit)
    by_name = {g.name: g for g in FIT_GROUPS}
    out = []
    for f in items:
        if isinstance(f, str) and f in by_name:
            out.append(by_name[f]())
        elif isinstance(f, FitGroup) and f.name:
            out.append(f)
        else:
            raise ValueError(
                f"fit must name groups among {GROUPS} or be FitGroup objects "
                f"({', '.join(g.__name__ for g in FIT_GROUPS)}, or a subclass with a name), "
                f"got {list(items)}"
            )
    names = [g.name for g in out]
    if not out:
        raise ValueError(f"fit must name groups among {GROUPS}, got {list(items)}")
    if len(set(names)) != len(names):
        raise ValueError(f"fit must not repeat a group, got {names}")
    if not any(g.continuous for g in out):
        raise ValueError(f"fit: {names} needs at least one continuous group beside it")
    order = {cls: i for i, cls in enumerate(FIT_GROUPS)}
    return tuple(sorted(out, key=lambda g: order.get(type(g), len(order))))
