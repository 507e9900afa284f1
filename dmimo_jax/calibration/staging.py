r"""How :func:`~dmimo_jax.calibration.calibrating` stages a fit: the closed-form starts, the
multi-start, the joint rounds, and the extra round of a piecewise model.

* :func:`fit_staged`: the staged fit of the requested groups under one polarization, for
  one deployment or many of the same shapes. Each group says where it enters
  (:class:`~dmimo_jax.calibration.groups.FitGroup`'s ``closed_form`` and ``multistart``):
  the staging names none of them. Its LM runs are
  :func:`~dmimo_jax.calibration.solver.fit_lm_many`: a single deployment runs the fitting
  core itself; many run it once, ``jax.vmap``-ed over them (the same answers, one program).
* :func:`fit_across_boundaries`: one more try for a scene of faces whose fit ends outside its
  chi-square band (:data:`BOUNDARY_OUTLIER_Z`).

Everything here takes a model that
:func:`~dmimo_jax.calibration.closed_form.check_calibratable` accepts.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from dmimo_jax.calibration.groups import Deployment, FitGroup
from dmimo_jax.calibration.solver import apply_groups, fit_lm, fit_lm_many, split, whitened
from dmimo_jax.calibration.status import chi2_band

BOUNDARY_OUTLIER_Z = 10.0
"""Standard deviations: the smallest residual of a piecewise model's fit (a scene of faces)
set aside for one round when the fit ends outside its chi-square band (a labeled UE on the
wrong side of a shadow boundary; :func:`fit_across_boundaries`)."""


class StagedFit(NamedTuple):
    """A finished staged fit of one deployment: its groups, unknowns, cost, convergence."""

    groups: tuple[FitGroup, ...]
    u: np.ndarray
    cost: float
    converged: bool


def fit_staged(
    deployments: Sequence[Deployment],
    requests: Sequence[FitGroup],
    num_steps: int,
    max_steps: int,
    jacobian: str = "auto",
) -> list[StagedFit]:
    """The staged fit under each deployment's model (its polarization), one
    :class:`StagedFit` each. ``requests``: the groups to fit, in the fit's order
    (:func:`~dmimo_jax.calibration.groups.as_fit_groups`), each built on each deployment.

    Stage 1: the ``closed_form`` groups at their closed-form starts. Stage 2, when a group is
    ``multistart``: those and the closed-form groups from every start (every combination of
    the multi-start groups' starts), the best kept. Stage 3: every group jointly, in rounds
    until converged (also for groups stage 2 fitted already: one round of a multi-start is
    no proof of convergence). A piecewise model's fit then gets
    :func:`fit_across_boundaries`.

    The deployments' LM runs of a stage run at once (:func:`~dmimo_jax.calibration.solver.fit_lm_many`):
    they must share their shapes and their models' structure.
    """
    closed = [i for i, g in enumerate(requests) if g.closed_form]
    multi = [i for i, g in enumerate(requests) if g.multistart]
    built: list[dict[int, FitGroup]] = [
        {i: requests[i].build(d) for i in closed} for d in deployments
    ]
    if multi:
        stages, starts = [], []
        for groups, d in zip(built, deployments, strict=True):
            first = [groups[i] for i in closed]
            options = [requests[i].build_starts(d) for i in multi]
            rows = [
                np.concatenate([np.asarray(g.u0) for g in (*first, *combo)])
                for combo in itertools.product(*options)
            ]
            stages.append((*first, *(o[0] for o in options)))
            starts.append(np.stack(rows))
        runs = fit_lm_many(deployments, stages, starts, num_steps, None, jacobian)
        for groups, stage, (u, _, _) in zip(built, stages, runs, strict=True):
            parts = split(stage, jnp.asarray(u))
            for i, g, part in zip(closed + multi, stage, parts, strict=True):
                groups[i] = dataclasses.replace(g, u0=part)
    for groups, d in zip(built, deployments, strict=True):
        for i, g in enumerate(requests):
            if i not in groups:
                groups[i] = g.build(d)
    finals = [
        tuple(groups[i] for i in range(len(requests)) if groups[i] is not None) for groups in built
    ]
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
    groups: Sequence[FitGroup],
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
    aside = deployment._replace(
        noise_var=jnp.where(jnp.asarray(outliers), noise_var * 1e12, noise_var)
    )
    u1, _, _ = fit_lm(aside, groups, u[None], num_steps, None, max_steps, jacobian)
    u2, c2, conv2 = fit_lm(deployment, groups, u1[None], num_steps, None, max_steps, jacobian)
    return (u2, c2, conv2) if c2 < cost else (u, cost, converged)
