r"""How :func:`~dmimo_jax.calibration.calibrating` stages a fit: the closed-form starts, the
multi-start of the surfaces, the joint rounds, and the extra round of a piecewise model.

* :func:`offsets_closed_form` and :func:`receivers_closed_form`: the starts that need no basin
  (uniformly random offsets or gain phases are no start for a local method).
* :func:`fit_staged`: the staged fit of the requested groups under one polarization, for
  one deployment or many of the same shapes. Its LM runs are
  :func:`~dmimo_jax.calibration.solver.fit_lm_many`: a single deployment runs the fitting
  core itself; many run it once, ``jax.vmap``-ed over them (the same answers, one program).
* :func:`fit_across_boundaries`: one more try for a scene of faces whose fit ends outside its
  chi-square band (:data:`BOUNDARY_OUTLIER_Z`).

Everything here takes a model that :func:`check_calibratable` accepts: a physical model that
knows its surfaces, mounts and scene (:class:`~dmimo_jax.physics.CalibratableModel`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_finite, check_int, check_phases, check_positions
from dmimo_jax.calibration.groups import (
    Group,
    OffsetsGroup,
    antenna_group,
    positions_group,
    receiver_groups,
    surfaces_group,
)
from dmimo_jax.calibration.solver import apply_groups, fit_lm, fit_lm_many, split, whitened
from dmimo_jax.calibration.specs import GROUPS, FitGroup
from dmimo_jax.calibration.status import chi2_band
from dmimo_jax.phase import wrap
from dmimo_jax.physics import CalibratableModel
from dmimo_jax.pytree import jit_or_eager
from dmimo_jax.receivers import ReceiverModel, Receivers, channel, ideal_receivers

BOUNDARY_OUTLIER_Z = 10.0
"""Standard deviations: the smallest residual of a piecewise model's fit (a scene of faces)
set aside for one round when the fit ends outside its chi-square band (a labeled UE on the
wrong side of a shadow boundary; :func:`fit_across_boundaries`)."""


def check_calibratable(model: Any) -> None:
    """``ValueError`` unless ``model`` is a physical model calibration can fit (a
    :class:`~dmimo_jax.physics.CalibratableModel` that is not a
    :class:`~dmimo_jax.receivers.ReceiverModel`: the receivers are calibrate's own argument,
    and a ReceiverModel would carry them twice)."""
    if isinstance(model, ReceiverModel) or not isinstance(model, CalibratableModel):
        raise ValueError(
            "model must be a TwoRayModel, an ImageSourceModel, a MeshModel or another "
            "CalibratableModel (a physical model that knows its surfaces, mounts and scene: "
            f"dmimo_jax.physics.CalibratableModel), got {type(model).__name__}"
        )


def offsets_closed_form(
    model: Any, x: ArrayLike, r: ArrayLike, *, num_iterations: int = 10
) -> Array:
    r"""Per-AP phase offsets from the residuals of ``model`` at L labeled snapshots, (M,).

    Start: :math:`\delta_m = \delta^{\rm model}_m + \arg\sum_l e^{j(e_{lm}-e_{l0})}` with
    :math:`e_{lm} = \mathrm{wrap}(r_{lm} - \mu_m(\mathbf x_l))`: the circular mean of each
    AP's residual relative to AP 0's, which removes the snapshots' CPOs. Then
    ``num_iterations`` rounds of coordinate ascent of :math:`\sum_{lm}\cos(e_{lm} - \delta_m
    - \phi_l)`: each snapshot's CPO :math:`\phi_l` is the circular mean over the APs (eq. 15),
    each offset the circular mean over the snapshots; so AP 0's own residual no longer enters
    every offset (on measured data with ~1 rad model error that halves the offsets' error).
    AP 0 keeps its offset (the gauge). Valid whatever the offsets (no local basin), the start
    of :func:`calibrate`.

    Raises:
        ValueError: a model :func:`calibrate` does not take, x not (L, 3) with L >= 2, r not
            (L, M) or not finite, ``num_iterations`` not an int >= 0.
    """
    check_calibratable(model)
    check_int("num_iterations", num_iterations)
    check_positions("x", x, batched=True)
    num_l = np.shape(x)[0]
    if num_l < 2:
        raise ValueError(f"x must hold at least L = 2 labeled positions, got shape {np.shape(x)}")
    check_phases("r", r, model.num_aps, batched=True)
    if np.shape(r)[0] != num_l:
        raise ValueError(f"r must have shape ({num_l}, {model.num_aps}) (L, M), got {np.shape(r)}")
    dtype = model.scene.ap_positions.dtype
    return _offsets(num_iterations, model, jnp.asarray(x, dtype), jnp.asarray(r, dtype))


def _offsets_closed_form(num_iterations: int, model: Any, x: Array, r: Array) -> Array:
    mean = jax.vmap(model.mean)(x)
    e = wrap(r - mean)
    rel = jnp.angle(jnp.sum(jnp.exp(1j * (e - e[:, :1])), axis=0))
    for _ in range(num_iterations):
        cpo = jnp.angle(jnp.sum(jnp.exp(1j * (e - rel[None, :])), axis=1, keepdims=True))
        rel = jnp.angle(jnp.sum(jnp.exp(1j * (e - cpo)), axis=0))
        rel = wrap(rel - rel[0])
    return model.scene.ap_phase_offsets + rel


# one compiled program per model and shape (not an eager dispatch per operation)
_offsets = jit_or_eager(_offsets_closed_form, static_argnums=(0,))


def receivers_closed_form(
    model: Any,
    x: ArrayLike,
    h: ArrayLike,
    receivers: Receivers | None = None,
    *,
    fit: Sequence[str] = ("receiver_gains", "receiver_constants"),
    num_iterations: int = 50,
) -> Receivers:
    r"""Receivers' gains and constants from complex labeled snapshots under ``model``'s
    geometry: :math:`h_{lm} = s_l G_m c_m(\mathbf x_l) + b_m` is linear in :math:`(G_m, b_m)`
    given the snapshot factors :math:`s_l` and in :math:`s_l` given them, so alternating least
    squares (``num_iterations`` rounds) from the gains' phases of the closed form of
    :func:`offsets_closed_form` applied to :math:`\arg h` (uniform random phases are no
    start for a local method). Groups not in ``fit`` keep ``receivers``' values (default
    ideal). Gauge: :math:`G_0` = 1 (the snapshot factors take the common complex scale).
    The start of :func:`calibrate` on complex snapshots.

    Raises:
        ValueError: a model :func:`calibrate` does not take, x not (L, 3) with L >= 2, h not
            (L, M) finite complex, an unknown group, ``num_iterations`` < 1.
    """
    check_calibratable(model)
    check_int("num_iterations", num_iterations, minimum=1)
    check_positions("x", x, batched=True)
    num_l = np.shape(x)[0]
    if num_l < 2 or np.shape(h) != (num_l, model.num_aps) or not np.iscomplexobj(h):
        raise ValueError(
            f"x must be (L, 3) with L >= 2 and h complex of shape (L, {model.num_aps}), got "
            f"{np.shape(x)} and {np.asarray(h).dtype} {np.shape(h)}"
        )
    check_finite("h", h)
    bad = [f for f in fit if f not in ("receiver_gains", "receiver_constants")]
    if bad:
        raise ValueError(f"fit: receivers_closed_form fits receiver groups only, got {bad}")
    rx = ideal_receivers(model.num_aps) if receivers is None else receivers
    dtype = model.scene.ap_positions.dtype
    g, b = _receivers_als(
        num_iterations,
        "receiver_gains" in fit,
        "receiver_constants" in fit,
        model,
        jnp.asarray(x, dtype),
        jnp.asarray(h),
        rx.gains,
        rx.constants,
    )
    return Receivers(g, b)


@partial(jax.jit, static_argnums=(0, 1, 2))
def _receivers_als(num_iterations, fit_g, fit_b, model, x, h, g0, b0):
    c = jax.vmap(partial(channel, model))(x)  # (L, M)
    num_l = h.shape[0]
    if fit_g:
        # phases: offsets_closed_form on arg h (relative to the model's own offsets), moduli:
        # the median ratio of |h| to |c|, so the first snapshot factors are right
        rel = _offsets_closed_form(10, model, x, jnp.angle(h)) - model.scene.ap_phase_offsets
        ratio = jnp.median(jnp.abs(h) / jnp.abs(c), axis=0)
        g0 = ratio / ratio[0] * jnp.exp(1j * rel)
        b0 = jnp.zeros_like(b0) if fit_b else b0

    def body(_, gb):
        g, b = gb
        v = g[None, :] * c
        s = jnp.sum(jnp.conj(v) * (h - b[None, :]), axis=1) / jnp.sum(jnp.abs(v) ** 2, axis=1)
        z = s[:, None] * c  # (L, M): h[:, m] = G_m z[:, m] + b_m
        a11 = jnp.sum(jnp.abs(z) ** 2, axis=0)
        a12 = jnp.sum(jnp.conj(z), axis=0)
        r1 = jnp.sum(jnp.conj(z) * h, axis=0)
        r2 = jnp.sum(h, axis=0)
        if fit_g and fit_b:
            det = a11 * num_l - a12 * jnp.conj(a12)
            g_new = (num_l * r1 - a12 * r2) / det
            b_new = (a11 * r2 - jnp.conj(a12) * r1) / det
        elif fit_g:
            g_new, b_new = (r1 - a12 * b) / a11, b
        else:
            g_new, b_new = g, (r2 - jnp.sum(z * g[None, :], axis=0)) / num_l
        return g_new, b_new

    g, b = jax.lax.fori_loop(0, num_iterations, body, (g0.astype(h.dtype), b0.astype(h.dtype)))
    if fit_g:
        g = g / g[0]
    return g, b


class Deployment(NamedTuple):
    """One deployment's labeled data under the model it is fitted with (checked arrays of
    the model's dtype; ``r`` phases or complex snapshots)."""

    model: Any
    x: Array  # (L, 3)
    r: Array  # (L, M)
    noise_var: Array  # (L, M)


class StagedFit(NamedTuple):
    """A finished staged fit of one deployment: its groups, unknowns, cost, convergence."""

    groups: tuple[Group, ...]
    u: np.ndarray
    cost: float
    converged: bool


def fit_staged(
    deployments: Sequence[Deployment],
    fit: Mapping[str, FitGroup],
    surfaces: Sequence[int],
    eps_starts: np.ndarray,
    num_steps: int,
    max_steps: int,
    jacobian: str = "auto",
) -> list[StagedFit]:
    """The staged fit under each deployment's model (its polarization), one
    :class:`StagedFit` each. ``fit``: the requested groups by name
    (:mod:`~dmimo_jax.calibration.specs`); ``surfaces``: the indices of the surfaces fitted;
    ``eps_starts``: their permittivity starts.

    Stage 1: offsets (or receivers) from their closed forms. Stage 2, when surfaces are
    fitted: surfaces and those groups from every start of ``eps_starts`` (all surfaces
    alike), the best kept. Stage 3: every group jointly, in rounds until converged (also
    for groups stage 2 fitted already: one round of a multi-start is no proof of
    convergence). A piecewise model's fit then gets :func:`fit_across_boundaries`.

    The deployments' LM runs of a stage run at once (:func:`~dmimo_jax.calibration.solver.fit_lm_many`):
    they must share their shapes and their models' structure.
    """
    built: list[dict[str, Group]] = [{} for _ in deployments]
    for groups, d in zip(built, deployments, strict=True):
        if "ap_phase_offsets" in fit:
            groups["ap_phase_offsets"] = OffsetsGroup.from_start(
                offsets_closed_form(d.model, d.x, d.r)
            )
        if isinstance(d.model, ReceiverModel):
            groups.update({g.name: g for g in receiver_groups(d.model, list(fit))})
    if "surfaces" in fit:
        closed = ("ap_phase_offsets", "receiver_gains", "receiver_constants")
        stages, starts = [], []
        for groups, d in zip(built, deployments, strict=True):
            first = [groups[g] for g in closed if g in groups]
            rows = []
            for e in eps_starts:
                s = surfaces_group(d.model, surfaces, np.full(len(surfaces), e))
                rows.append(np.concatenate([np.asarray(g.u0) for g in first] + [np.asarray(s.u0)]))
            stages.append((*first, s))
            starts.append(np.stack(rows))
        runs = fit_lm_many(deployments, stages, starts, num_steps, None, jacobian)
        for groups, stage, (u, _, _) in zip(built, stages, runs, strict=True):
            for g, part in zip(stage, split(stage, jnp.asarray(u)), strict=True):
                groups[g.name] = dataclasses.replace(g, u0=part)
    for groups, d in zip(built, deployments, strict=True):
        if "ap_positions" in fit:
            pos = fit["ap_positions"]
            groups["ap_positions"] = positions_group(d.model, pos.free_axes, pos.prior, pos.start)
        if "antenna" in fit:
            groups["antenna"] = antenna_group(d.model)
    finals = [tuple(groups[g] for g in GROUPS if g in groups) for groups in built]
    u0s = [np.concatenate([np.asarray(g.u0) for g in final])[None] for final in finals]
    runs = fit_lm_many(deployments, finals, u0s, num_steps, max_steps, jacobian)
    out = []
    for d, final, (u, cost, converged) in zip(deployments, finals, runs, strict=True):
        if d.model.piecewise:
            u, cost, converged = fit_across_boundaries(
                d, final, u, cost, converged, num_steps, max_steps, jacobian
            )
        out.append(StagedFit(final, u, cost, converged))
    return out


def fit_across_boundaries(
    deployment: Deployment,
    groups: Sequence[Group],
    u: np.ndarray,
    cost: float,
    converged: bool,
    num_steps: int,
    max_steps: int,
    jacobian: str = "auto",
) -> tuple[np.ndarray, float, bool]:
    """One more try when a fit of a piecewise model ends outside the chi-square band.

    A labeled UE near a shadow boundary of a displaced AP can sit on the wrong side of it at
    the start: its residual for that AP is radians, and no continuous step crosses the
    boundary (the Jacobian does not see it), and pulling the AP toward it displaces the AP
    for every other snapshot. The worst residuals (beyond :data:`BOUNDARY_OUTLIER_Z` and a
    quarter of the largest, in standard deviations; at most 5% of them) are set aside (their
    variance multiplied by 1e12), the fit continues from where it stopped, then runs again on
    every residual from there; the result is kept only if its full cost is lower.
    """
    model, x, r, noise_var = deployment
    dof = max(r.size - len(u), 1)
    if cost / dof <= chi2_band(dof)[1]:
        return u, cost, converged
    m = apply_groups(model, groups, jnp.asarray(u))
    z = np.abs(np.asarray(whitened(m, x, r, noise_var))).reshape(r.shape + (-1,))
    # the worst residuals: a displaced AP drags every residual of its own up with it, so a
    # fixed threshold would also set aside the many moderate ones that show the displacement
    outliers = np.any(z > max(BOUNDARY_OUTLIER_Z, 0.25 * float(z.max())), axis=-1)
    if not outliers.any() or outliers.mean() > 0.05:
        return u, cost, converged
    aside = jnp.where(jnp.asarray(outliers), noise_var * 1e12, noise_var)
    u1, _, _ = fit_lm(model, groups, x, r, aside, u[None], num_steps, None, max_steps, jacobian)
    u2, c2, conv2 = fit_lm(
        model, groups, x, r, noise_var, u1[None], num_steps, None, max_steps, jacobian
    )
    return (u2, c2, conv2) if c2 < cost else (u, cost, converged)
