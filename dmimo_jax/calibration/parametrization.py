r"""How a calibration's unknowns sit on a model: the permittivities' physical
parametrization (:func:`permittivities_of`), the starts of the surfaces' multi-start
(:func:`permittivity_starts`), the directions an AP's phase centre may move
(:func:`position_basis`) and a model with some surfaces' permittivities replaced
(:func:`with_permittivities`). The groups of :mod:`~dmimo_jax.calibration.groups` build
on these.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax.materials import is_perfect_conductor, relative_permittivity
from dmimo_jax.physics import CalibratableModel, PhaseModel

MIN_EXPONENT_START = 0.1
"""The smallest antenna exponent :class:`~dmimo_jax.calibration.groups.Antenna` starts from (a smaller start starts here)."""

CALIBRATION_STARTS = ("concrete", "brick", "plasterboard", "wood", "glass")
"""ITU-R P.2040 materials :class:`~dmimo_jax.calibration.groups.Surfaces` starts from by default (Table I of the paper,
metal excepted)."""


def permittivities_of(u: Array) -> Array:
    r"""Complex permittivities from the surfaces' unconstrained ``u`` = [a, b] (2K,):
    :math:`\varepsilon' = 1 + |a|`, :math:`\varepsilon'' = |b|` (physical for every a, b)."""
    k = u.shape[0] // 2
    return (1.0 + jnp.abs(u[:k])) - 1j * jnp.abs(u[k:])


def permittivity_starts(frequency_hz: float, starts: Sequence[complex | str] | None) -> np.ndarray:
    """``starts`` (materials or permittivities; default :data:`CALIBRATION_STARTS`) as
    complex relative permittivities at ``frequency_hz``.

    Raises:
        ValueError: none, a perfect conductor, or a permittivity outside the fit's
            parametrization (eps' > 1, eps'' > 0).
    """
    starts = CALIBRATION_STARTS if starts is None else tuple(starts)
    if not starts:
        raise ValueError("starts must name at least one material or permittivity")
    values = []
    for s in starts:
        if isinstance(s, str):
            if is_perfect_conductor(s):
                raise ValueError(f"starts: {s!r} is a perfect conductor, not a permittivity")
            s = relative_permittivity(s, frequency_hz)
        e = complex(s)
        if not (np.isfinite(e.real) and np.isfinite(e.imag) and e.real > 1.0 and e.imag < 0.0):
            raise ValueError(
                f"starts must be physical permittivities eps' - j eps'' with eps' > 1 and "
                f"eps'' > 0 (inside the fit's parametrization), got {s!r}"
            )
        values.append(e)
    return np.asarray(values)


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
