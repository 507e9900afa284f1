"""Boundary validation shared by the public entry points.

Checks run only on concrete values: under ``jit``/``vmap``/``grad`` the inputs are
tracers and the (branch-free, NaN-safe) internals take over. Every failure is a
``ValueError`` naming the argument and what was expected.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def is_concrete(*values: Any) -> bool:
    """True when no leaf of ``values`` is a JAX tracer."""
    return not any(isinstance(v, jax.core.Tracer) for v in jax.tree.leaves(values))


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


def check_phases(name: str, r: Any, num_aps: int, *, batched: bool | None = None) -> None:
    """Check wrapped phase snapshot(s): shape (M,) or (B, M) with M = ``num_aps``, finite.

    Args:
        name: argument name used in the error message.
        r: phases in radians.
        num_aps: M.
        batched: ``False`` requires (M,), ``True`` requires (B, M), ``None`` accepts both.
    """
    shape = tuple(np.shape(r))
    single, batch = shape == (num_aps,), len(shape) == 2 and shape[1] == num_aps
    if not ((single and batched is not True) or (batch and batched is not False)):
        want = {
            False: f"({num_aps},)",
            True: f"(B, {num_aps})",
            None: f"({num_aps},) or (B, {num_aps})",
        }
        raise ValueError(f"{name} must have shape {want[batched]} (one phase per AP), got {shape}")
    check_finite(name, r)
