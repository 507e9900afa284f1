"""Unlabeled snapshots for :func:`~dmimo_jax.calibration.calibrate` (``unlabeled=``): the
:class:`Unlabeled` request, its arrays checked (:func:`unlabeled_arrays`), and the screen
that keeps only those that fit a calibration (:func:`screen_unlabeled`; the module
docstring of :mod:`~dmimo_jax.calibration.calibrating` says how they enter the fit)."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_finite, check_positions
from dmimo_jax.calibration.solver import locate_labeled, whitened
from dmimo_jax.physics import check_in_domain


class Unlabeled(NamedTuple):
    """Snapshots at unknown positions for :func:`calibrate` to learn from as well.

    Typically the deployment's own traffic, located by the online stage under a calibration
    from the labeled snapshots alone; ``x0`` must be in the right basin (a wrong lobe's
    snapshot is screened out by its cost, module docstring).
    """

    r: ArrayLike
    """(N, M) wrapped phases, rad; or complex snapshots, as calibrate's r."""
    noise_var: ArrayLike
    """(N, M) phase-noise variances, rad^2 (complex: as calibrate's)."""
    x0: ArrayLike
    """(N, 3) start positions, m."""


def unlabeled_arrays(
    unlabeled: Any, model: Any, dtype: Any, complex_data: bool = False
) -> tuple[Array, Array, Array]:
    """``unlabeled``'s (x0, r, noise_var) as arrays, checked (``ValueError`` naming each);
    ``r`` complex snapshots when the labeled ones are (``complex_data``), else phases."""
    if not isinstance(unlabeled, Unlabeled):
        raise ValueError(
            f"unlabeled must be an Unlabeled(r, noise_var, x0), got {type(unlabeled).__name__}"
        )
    check_positions("unlabeled.x0", unlabeled.x0, batched=True)
    x0 = np.asarray(unlabeled.x0, float)
    if x0.shape[0] == 0:
        raise ValueError(
            "unlabeled must hold at least one snapshot (unlabeled.x0 has shape (0, 3)); "
            "pass unlabeled=None to calibrate from the labeled snapshots alone"
        )
    check_in_domain("unlabeled.x0", x0, model)
    for name in ("r", "noise_var"):
        v = np.asarray(getattr(unlabeled, name))
        if v.shape != (x0.shape[0], model.num_aps):
            raise ValueError(
                f"unlabeled.{name} must have shape {(x0.shape[0], model.num_aps)} (N, M) to "
                f"match unlabeled.x0, got {v.shape}"
            )
        check_finite(f"unlabeled.{name}", v)
    if np.any(np.asarray(unlabeled.noise_var) <= 0):
        raise ValueError("unlabeled.noise_var must be positive (rad^2)")
    if np.iscomplexobj(unlabeled.r) != complex_data:
        raise ValueError(
            "unlabeled.r must be of the labeled snapshots' kind: "
            + ("complex snapshots" if complex_data else "wrapped phases (real)")
            + f", got {np.asarray(unlabeled.r).dtype}"
        )
    r_dtype = jnp.result_type(dtype, complex) if complex_data else dtype
    x0, noise_var = jnp.asarray(x0, dtype), jnp.asarray(unlabeled.noise_var, dtype)
    return x0, jnp.asarray(unlabeled.r, r_dtype), noise_var


locate_jit = jax.jit(locate_labeled)
"""Each snapshot's position under a model by the package's LM from a start (one compiled
program per model and shape; :func:`~dmimo_jax.calibration.solver.locate_labeled`)."""


def screen_unlabeled(
    model: Any, unlabeled: tuple, chi2: float, complex_data: bool = False
) -> tuple[np.ndarray, Array]:
    """The unlabeled snapshots re-located under ``model`` (N, 3), and which of them (N,) bool
    have a cost there within 5 standard deviations of its chi-square (M - 4 degrees of
    freedom; 2M - 5 for complex snapshots), scaled by the labeled fit's reduced chi-square
    when above 1: a snapshot in a wrong lobe fails it."""
    x0, r, nv = unlabeled
    xs = locate_jit(model, x0, r, nv)
    e = whitened(model, xs, r, nv).reshape(r.shape[0], -1)
    k = 2 * r.shape[1] - 5 if complex_data else r.shape[1] - 4
    bound = max(1.0, chi2) * (k + 5.0 * np.sqrt(2.0 * k))
    return np.asarray(jnp.sum(e * e, axis=1)) < bound, xs
