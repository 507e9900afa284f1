"""What :func:`~dmimo_jax.calibration.calibrating` fits: one small object per group of
unknowns, carrying its own options.

``fit=(Positions(prior=0.01), Offsets(), Surfaces(names=("floor",)))`` fits the APs' phase
centres under a 1 cm survey prior, their phase offsets and the floor's permittivity. A
string is the shorthand for a group with its defaults: ``"ap_positions"`` is ``Positions()``,
``"ap_phase_offsets"`` ``Offsets()``, ``"surfaces"`` ``Surfaces()``, ``"antenna"``
``Antenna()``, ``"polarization"`` ``Polarization()``, ``"receiver_gains"``
``ReceiverGains()``, ``"receiver_constants"`` ``ReceiverConstants()``; the two mix freely.

These are the user's requests (plain options, checked when :func:`calibrate` runs); the
parameter blocks the fit then builds from them and the model are
:mod:`dmimo_jax.calibration.groups`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from jax.typing import ArrayLike


@dataclasses.dataclass(frozen=True, eq=False)
class FitGroup:
    """A group of unknowns to fit; ``name`` is its shorthand and its key in
    ``Calibration.values`` / ``stderr``."""

    name: ClassVar[str] = ""


@dataclasses.dataclass(frozen=True, eq=False)
class Positions(FitGroup):
    """The APs' phase centres (``"ap_positions"``).

    Attributes:
        free_axes: (M, 3) bool, the coordinates fitted (default: all three, or the two
            within the surface for an AP mounted on one).
        prior: the survey's standard deviation per coordinate, m: a Gaussian prior on the
            fitted centres around the model's (MAP; its terms count as observations in the
            chi-square). Default none (maximum likelihood).
        start: (M, 3) where the fit starts (e.g. an earlier fit's, to refit under other
            variances); the model's positions stay the prior's centre. Default the model's.
    """

    free_axes: ArrayLike | None = None
    prior: float | None = None
    start: ArrayLike | None = None
    name: ClassVar[str] = "ap_positions"

    def __post_init__(self) -> None:
        # a number (its value is checked where the fit runs); not text, a bool or an array
        p = self.prior
        if p is not None and (
            isinstance(p, bool | str) or np.ndim(p) != 0 or np.asarray(p).dtype.kind not in "iuf"
        ):
            raise ValueError(f"Positions.prior must be a number of metres or None, got {p!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class Offsets(FitGroup):
    """The APs' phase offsets (``"ap_phase_offsets"``; AP 0's is the gauge), started in
    closed form (:func:`~dmimo_jax.calibration.offsets_closed_form`)."""

    name: ClassVar[str] = "ap_phase_offsets"


@dataclasses.dataclass(frozen=True, eq=False)
class Surfaces(FitGroup):
    """The reflectors' complex permittivities (``"surfaces"``).

    Attributes:
        names: the reflectors to fit (default: every dielectric surface some path bounces
            off; the model's ``calibration_surfaces``).
        starts: materials or permittivities the fit starts from, each a staged start
            (default :data:`~dmimo_jax.calibration.CALIBRATION_STARTS`).
    """

    names: Sequence[str] | None = None
    starts: Sequence[complex | str] | None = None
    name: ClassVar[str] = "surfaces"

    def __post_init__(self) -> None:
        # one name is one surface (not its letters)
        for field in ("names", "starts"):
            value = getattr(self, field)
            if isinstance(value, str):
                object.__setattr__(self, field, (value,))
            elif value is not None and not isinstance(value, Sequence):
                raise ValueError(f"Surfaces: {field} must be a sequence or None, got {value!r}")
        if self.names is not None and not all(isinstance(n, str) for n in self.names):
            raise ValueError(f"Surfaces: names must be surface names, got {self.names!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class Antenna(FitGroup):
    """The APs' pattern exponent (``"antenna"``)."""

    name: ClassVar[str] = "antenna"


@dataclasses.dataclass(frozen=True, eq=False)
class Polarization(FitGroup):
    """TE or TM, chosen by likelihood (``"polarization"``: the fit runs under each)."""

    name: ClassVar[str] = "polarization"


@dataclasses.dataclass(frozen=True, eq=False)
class ReceiverGains(FitGroup):
    """Each receiver's complex gain (``"receiver_gains"``; complex snapshots; G_0 = 1)."""

    name: ClassVar[str] = "receiver_gains"


@dataclasses.dataclass(frozen=True, eq=False)
class ReceiverConstants(FitGroup):
    """Each receiver's additive constant b (``"receiver_constants"``; complex snapshots)."""

    name: ClassVar[str] = "receiver_constants"


FIT_GROUPS: tuple[type[FitGroup], ...] = (
    Positions, Offsets, Surfaces, Antenna, Polarization, ReceiverGains, ReceiverConstants,
)  # fmt: skip
"""The groups :func:`~dmimo_jax.calibration.calibrating` can fit, in the fit's order."""

GROUPS = tuple(g.name for g in FIT_GROUPS)
"""Their shorthands."""


def as_fit_groups(fit: Any) -> tuple[FitGroup, ...]:
    """``fit`` (a group, its shorthand, or a sequence of them) as group objects.

    Raises:
        ValueError: an unknown name or object, none, a repeated group, or
            ``"polarization"`` alone.
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
        elif isinstance(f, FitGroup) and type(f) in FIT_GROUPS:
            out.append(f)
        else:
            raise ValueError(
                f"fit must name groups among {GROUPS} or be their objects "
                f"({', '.join(g.__name__ for g in FIT_GROUPS)}), got {list(items)}"
            )
    names = [g.name for g in out]
    if not out:
        raise ValueError(f"fit must name groups among {GROUPS}, got {list(items)}")
    if len(set(names)) != len(names):
        raise ValueError(f"fit must not repeat a group, got {names}")
    if names == ["polarization"]:
        raise ValueError("fit: 'polarization' needs at least one continuous group beside it")
    return tuple(out)
