"""Boundary validation shared by the public entry points.

Checks run only on concrete values: under ``jit``/``vmap``/``grad`` the inputs are
tracers and the (branch-free, NaN-safe) internals take over. Every failure is a
``ValueError`` naming the argument and what was expected.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(*values: Any) -> bool:
    """True when no leaf of ``values`` is a JAX tracer."""
    return not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))


def dtype_of(value: Any) -> np.dtype:
    """The NumPy dtype of a value, concrete (a list, a string: NumPy's reading) or traced
    (its ``dtype``), for refusing bools, text and complex numbers by name."""
    return np.asarray(value).dtype if is_concrete(value) else np.dtype(value.dtype)


def check_finite(name: str, value: Any) -> None:
    if is_concrete(value):
        arr = np.asarray(value)
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{name} must be finite, got non-finite entries (NaN or inf)")


def check_positions(name: str, x: Any, *, batched: bool | None = None) -> None:
    """Check UE position(s): shape (3,) or (N, 3), finite, strictly above the ground z=0.

    Args:
        name: argument name used in the error message.
        x: positions in metres.
        batched: ``False`` requires (3,), ``True`` requires (N, 3), ``None`` accepts both.
    """
    if not is_concrete(x):
        return
    arr = np.asarray(x)
    ok_single = arr.shape == (3,)
    ok_batch = arr.ndim == 2 and arr.shape[-1] == 3
    if batched is False and not ok_single:
        raise ValueError(f"{name} must have shape (3,), got {arr.shape}")
    if batched is True and not ok_batch:
        raise ValueError(f"{name} must have shape (N, 3), got {arr.shape}")
    if not (ok_single or ok_batch):
        raise ValueError(f"{name} must have shape (3,) or (N, 3), got {arr.shape}")
    check_finite(name, arr)
    if np.any(arr[..., 2] <= 0):
        raise ValueError(
            f"{name} must lie in the half-space above the ground (z > 0 m), "
            f"got min z = {arr[..., 2].min():.6g} m"
        )


def check_phases(name: str, r: Any, num_aps: int, *, batched: bool | None | str = None) -> None:
    """Check wrapped phase snapshot(s): shape (M,) or (B, M) with M = ``num_aps``, finite.

    The one snapshot validator of the package (estimators, pipeline and networks).

    Args:
        name: argument name used in the error message.
        r: phases in radians.
        num_aps: M.
        batched: ``False`` requires (M,), ``True`` requires (B, M), ``None`` accepts both,
            ``"any"`` accepts any leading axes (..., M) (the networks).
    """
    if np.iscomplexobj(r):
        raise ValueError(
            f"{name} must be real wrapped phases (rad), got complex values: complex snapshots "
            "h go to the complex-data functions (dj.estimators.complex_search, "
            "dj.bounds.complex_peb, calibrate_receivers)"
        )
    dtype = dtype_of(r)
    if dtype.kind not in "iuf":  # bool, text, objects
        raise ValueError(f"{name} must be real wrapped phases (rad), got {dtype} values")
    shape = tuple(np.shape(r))
    single, batch = shape == (num_aps,), len(shape) == 2 and shape[1] == num_aps
    if batched == "any":
        single = len(shape) >= 1 and shape[-1] == num_aps
    if not ((single and batched is not True) or (batch and batched is not False)):
        want = {
            False: f"({num_aps},)",
            True: f"(B, {num_aps})",
            None: f"({num_aps},) or (B, {num_aps})",
            "any": f"(..., {num_aps})",
        }
        raise ValueError(f"{name} must have shape {want[batched]} (one phase per AP), got {shape}")
    check_finite(name, r)


def as_snapshot_batch(name: str, r: Any, num_aps: int, dtype: Any = None) -> jax.Array:
    """Check snapshot(s) ``r`` ((M,) or (B, M), finite; :func:`check_phases`) and return
    them as a (B, M) array of ``dtype``: the one place a single snapshot becomes a batch."""
    check_phases(name, r, num_aps)
    r = jnp.asarray(r, dtype)
    return r[None, :] if r.ndim == 1 else r


def check_away_from_aps(name: str, x: Any, ap_positions: Any, *, min_distance: float = 1e-6):
    """``ValueError`` when a concrete position (3,) or (N, 3) lies within ``min_distance``
    metres of an AP: the LoS amplitude lambda / (4 pi d) is infinite there."""
    if not is_concrete(x, ap_positions):
        return
    pts = np.asarray(x, float).reshape(-1, 3)
    ap = np.asarray(ap_positions, float)
    d = np.linalg.norm(pts[:, None, :] - ap[None, :, :], axis=-1)
    i, m = np.unravel_index(np.argmin(d), d.shape)
    if d[i, m] < min_distance:
        where = "" if np.ndim(x) == 1 else f" (row {i})"
        raise ValueError(
            f"{name}{where} coincides with AP {m} at {ap[m].tolist()} (distance "
            f"{d[i, m]:.3g} m < {min_distance:g} m): the channel is singular there"
        )


def check_num_aps(num_aps: int, *, minimum: int = 4) -> None:
    """Position + CPO need ``minimum`` = 4 phases: 3 coordinates and one common offset."""
    if num_aps < minimum:
        raise ValueError(
            f"the model has M = {num_aps} APs; estimating a 3D position and a CPO needs at "
            f"least {minimum} APs"
        )


def check_table_aps(table: Any, model: Any) -> None:
    """``ValueError`` unless a lookup table (phasor or cell table) was built for as many
    APs as ``model`` has."""
    if table.num_aps != model.num_aps:
        raise ValueError(f"table has {table.num_aps} APs, the model {model.num_aps}")


def check_scalar(name: str, value: Any, *, positive: bool = False) -> None:
    """A finite real scalar (strictly positive with ``positive``)."""
    if not is_concrete(value):
        return
    arr = np.asarray(value)
    if arr.shape != ():
        raise ValueError(f"{name} must be a scalar, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == bool) or np.iscomplexobj(arr):
        raise ValueError(f"{name} must be a real number, got {arr.dtype} {arr.item()!r}")
    if not np.isfinite(arr):
        raise ValueError(f"{name} must be finite, got {arr.item()!r}")
    if positive and not arr > 0:
        raise ValueError(f"{name} must be > 0, got {arr.item()!r}")


def check_probability(name: str, value: Any) -> None:
    """A probability strictly between 0 and 1 (a Python or NumPy real scalar)."""
    try:
        ok = np.shape(value) == () and 0.0 < float(value) < 1.0
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a probability in (0, 1), got {value!r}")


def check_covariance(name: str, cov: Any) -> None:
    """A concrete (S, S) covariance must be symmetric and positive definite (``ValueError``
    naming it otherwise); traced values pass."""
    if not is_concrete(cov):
        return
    c = np.asarray(cov, float)
    scale = max(float(np.max(np.abs(c))), np.finfo(float).tiny)
    if not np.allclose(c, c.T, rtol=1e-9, atol=1e-12 * scale):
        raise ValueError(f"{name} must be a symmetric covariance matrix")
    if np.min(np.linalg.eigvalsh((c + c.T) / 2)) <= 0:
        raise ValueError(
            f"{name} must be positive definite (a covariance), got eigenvalues "
            f"{np.round(np.linalg.eigvalsh((c + c.T) / 2), 12).tolist()}"
        )


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool (NumPy's included), else ``ValueError`` naming ``name``."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def is_int(value: Any, *, minimum: int = 0, maximum: int | None = None) -> bool:
    """Whether ``value`` is a Python or NumPy integer >= ``minimum`` (and <= ``maximum`` if
    given); bools are not."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return False
    return bool(value >= minimum and (maximum is None or value <= maximum))


def check_int(name: str, value: Any, *, minimum: int = 0, maximum: int | None = None) -> None:
    """A Python or NumPy integer >= ``minimum`` (and <= ``maximum`` if given; bools refused)."""
    if not is_int(value, minimum=minimum, maximum=maximum):
        want = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name} must be an int {want}, got {value!r}")


def warn_if_float32(where: str) -> None:
    """A ``UserWarning`` when JAX computes in float32: phases of ~170 rad at micrometre
    targets need float64 (Python shows it once per call site)."""
    if not jax.config.jax_enable_x64:
        warnings.warn(
            f"{where}: jax_enable_x64 is off, so this computes in float32; carrier phases of "
            "~170 rad at micrometre accuracy need float64: call "
            'jax.config.update("jax_enable_x64", True) in your entry point',
            UserWarning,
            stacklevel=3,
        )


def check_permittivity(name: str, eps_r: Any) -> None:
    r"""``ValueError`` unless a concrete :math:`\varepsilon_r = \varepsilon' - j\varepsilon''`
    describes a passive medium where eq. (3) is continuous: finite, :math:`\varepsilon''
    \ge 0` (imaginary part <= 0 in this sign convention), and either lossy
    (:math:`\varepsilon'' > 0`) or :math:`\varepsilon' \ge 1`. A lossless
    :math:`\varepsilon_r < 1` puts a branch point of :math:`\zeta` inside the incidence
    range, where Gamma jumps (e.g. from 0 to -1 for :math:`\varepsilon_r = 0`). Metals
    are perfect conductors (``perfect_conductor=True``), not a permittivity."""
    if not is_concrete(eps_r):
        return
    e = np.asarray(eps_r, complex)
    if not np.all(np.isfinite(e)):
        raise ValueError(f"{name} must be finite, got {eps_r!r}")
    if np.any(e.imag > 0.0):
        raise ValueError(
            f"{name} must have imaginary part <= 0 (eps' - j eps'', a passive medium), "
            f"got {eps_r!r}"
        )
    if np.any((e.imag == 0.0) & (e.real < 1.0)):
        raise ValueError(
            f"{name} must be lossy or have real part >= 1 (a lossless eps_r < 1 makes eq. (3) "
            f"discontinuous), got {eps_r!r}"
        )
