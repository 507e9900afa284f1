r"""ITU-R P.2040 building materials: complex relative permittivity at a carrier frequency.

Recommendation ITU-R P.2040 (Table 3) models each material by four numbers
:math:`(a, b, c, d)`:

.. math::

    \varepsilon' = a f^b, \qquad \sigma = c f^d \;[\mathrm{S/m}], \qquad
    \varepsilon'' = 17.98\,\sigma / f, \qquad \varepsilon_r = \varepsilon' - j\varepsilon''

with :math:`f` in **GHz**. Two conventions are offered:

* ``convention="itu"`` (default): the formula as written, f in GHz. Concrete at
  0.8 GHz gives :math:`5.24 - j0.872`.
* ``convention="paper"``: the value the POPT paper used, which is what the same
  formula returns when f is put in **Hz** in both :math:`\sigma = c f^d` and
  :math:`\varepsilon'' = 17.98\sigma/f`. Concrete at 800 MHz then gives
  :math:`5.24 - j0.0096` (the paper's Sec. VI value). Use it only to reproduce the
  paper's numbers.

Most of the table is fitted for f >= 1 GHz; at the paper's 800 MHz the formula is an
extrapolation (``valid_range_ghz`` says where ITU-R fitted each material).

Metal is a perfect electric conductor here (:math:`\Gamma = -1` at every angle, in
either convention): ITU-R's own metal entry (:math:`\sigma = 10^7` S/m) gives
:math:`|\Gamma| > 0.9999` at 800 MHz, and the paper's Hz convention would turn it into
a weak dielectric (:math:`1 - j0.22`), contradicting the paper's description of metal
as the strongest reflector.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, NamedTuple

import numpy as np

__all__ = [
    "ItuMaterial",
    "is_perfect_conductor",
    "material_names",
]

Convention = Literal["itu", "paper"]


class ItuMaterial(NamedTuple):
    """One row of ITU-R P.2040 Table 3 (f in GHz)."""

    a: float
    b: float
    c: float
    d: float
    valid_range_ghz: tuple[float, float]
    perfect_conductor: bool = False


# ITU-R P.2040, Table 3 (the 1-100 GHz rows where a material has several).
ITU_MATERIALS: Mapping[str, ItuMaterial] = MappingProxyType(
    {
        "vacuum": ItuMaterial(1.0, 0.0, 0.0, 0.0, (0.001, 100.0)),
        "concrete": ItuMaterial(5.24, 0.0, 0.0462, 0.7822, (1.0, 100.0)),
        "brick": ItuMaterial(3.91, 0.0, 0.0238, 0.16, (1.0, 40.0)),
        "plasterboard": ItuMaterial(2.73, 0.0, 0.0085, 0.9395, (1.0, 100.0)),
        "wood": ItuMaterial(1.99, 0.0, 0.0047, 1.0718, (0.001, 100.0)),
        "glass": ItuMaterial(6.31, 0.0, 0.0036, 1.3394, (0.1, 100.0)),
        "ceiling_board": ItuMaterial(1.48, 0.0, 0.0011, 1.0750, (1.0, 100.0)),
        "chipboard": ItuMaterial(2.58, 0.0, 0.0217, 0.7800, (1.0, 100.0)),
        "plywood": ItuMaterial(2.71, 0.0, 0.33, 0.0, (1.0, 40.0)),
        "marble": ItuMaterial(7.074, 0.0, 0.0055, 0.9262, (1.0, 60.0)),
        "floorboard": ItuMaterial(3.66, 0.0, 0.0044, 1.3515, (50.0, 100.0)),
        "metal": ItuMaterial(1.0, 0.0, 1e7, 0.0, (1.0, 100.0), perfect_conductor=True),
        "very_dry_ground": ItuMaterial(3.0, 0.0, 0.00015, 2.52, (1.0, 10.0)),
        "medium_dry_ground": ItuMaterial(15.0, -0.1, 0.035, 1.63, (1.0, 10.0)),
        "wet_ground": ItuMaterial(30.0, -0.4, 0.15, 1.30, (1.0, 10.0)),
    }
)
"""Name -> :class:`ItuMaterial` (read-only): ITU-R P.2040 Table 3's materials (the 1-100 GHz
rows where a material has several), ``"metal"`` a perfect conductor."""


def material_names() -> tuple[str, ...]:
    """Names accepted by :func:`relative_permittivity`."""
    return tuple(ITU_MATERIALS)


def _lookup(material: str) -> ItuMaterial:
    try:
        return ITU_MATERIALS[material.lower()]
    except (KeyError, AttributeError):
        raise ValueError(
            f"material must be one of {sorted(ITU_MATERIALS)}, got {material!r}"
        ) from None


def is_perfect_conductor(material: str) -> bool:
    """True for materials modelled as a perfect electric conductor (:math:`\\Gamma=-1`)."""
    return _lookup(material).perfect_conductor


def relative_permittivity(
    material: str, frequency_hz: float, *, convention: Convention = "itu"
) -> complex:
    r"""Complex relative permittivity :math:`\varepsilon_r = a f^b - j\,17.98\,c f^d / f`.

    Args:
        material: a key of :data:`ITU_MATERIALS` (case-insensitive).
        frequency_hz: carrier frequency in Hz, > 0.
        convention: ``"itu"`` (f in GHz, correct) or ``"paper"`` (f in Hz, reproduces
            the paper's :math:`5.24 - j0.0096` for concrete at 800 MHz).

    Returns:
        :math:`\varepsilon_r` as a Python complex with non-positive imaginary part.
        For ``metal`` this is ITU-R's formula value; scenes model metal as a perfect
        conductor instead (see :func:`is_perfect_conductor`).

    Examples:
        >>> relative_permittivity("concrete", 800e6)
        (5.24-0.87...j)
        >>> relative_permittivity("concrete", 800e6, convention="paper")
        (5.24-0.0095...j)
    """
    row = _lookup(material)
    if isinstance(frequency_hz, bool) or not isinstance(frequency_hz, (int, float, np.number)):
        raise ValueError(f"frequency_hz must be a real number (Hz), got {frequency_hz!r}")
    frequency_hz = float(frequency_hz)
    if not (np.isfinite(frequency_hz) and frequency_hz > 0):
        raise ValueError(f"frequency_hz must be a positive finite number, got {frequency_hz!r}")
    if convention == "itu":
        f = frequency_hz / 1e9
    elif convention == "paper":
        f = float(frequency_hz)
    else:
        raise ValueError(f"convention must be 'itu' or 'paper', got {convention!r}")
    eps_real = row.a * f**row.b
    sigma = row.c * f**row.d
    return complex(eps_real, -17.98 * sigma / f)
