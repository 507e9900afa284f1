r"""Self-calibration of the whole physical model from L labeled snapshots (beyond the paper).

A real deployment knows its AP phase centres to millimetres at best, its APs' oscillators
leave a static phase offset each, its antennas have patterns and its room has walls of
unknown materials. :func:`calibrate` learns any group of those unknowns, jointly, from the
same L labeled snapshots (positions :math:`\mathbf x_l` known, CPOs :math:`\phi_l` unknown)
the paper uses for its GP. It maximizes the CPO-profiled Gaussian likelihood of eq. (8),

.. math::

    \log p(\mathbf r\,|\,\boldsymbol\vartheta) = -\tfrac12\sum_{l,m}\Big[
    \frac{\mathrm{wrap}(r_{lm} - \mu_m(\mathbf x_l;\boldsymbol\vartheta) - \hat\phi_l)^2}
    {\sigma^2_{lm}} + \log 2\pi\sigma^2_{lm}\Big],

with :math:`\hat\phi_l` the CPO of eq. (15) (wrap-corrected, as the MLE compresses it),
by the package's one Levenberg-Marquardt solver on the whitened residuals with the
autodiff Jacobian. The groups (``fit=``; each a class of
:mod:`~dmimo_jax.calibration.groups`, the fitting core in
:mod:`~dmimo_jax.calibration.solver`, how a fit ended in
:mod:`~dmimo_jax.calibration.status`):

* ``"ap_positions"``: the APs' phase centres. An AP mounted on a reflector of an
  :class:`~dmimo_jax.physics.ImageSourceModel` or a face of a
  :class:`~dmimo_jax.physics.MeshModel` (within ``MOUNT_TOLERANCE`` of its plane) moves
  only within that plane; ``Positions(free_axes=...)`` (M, 3) restricts the coordinates
  further (:mod:`~dmimo_jax.calibration.specs`).
* ``"ap_phase_offsets"``: the static per-AP offsets :math:`\delta_m`. Only differences are
  observable (a common part is the CPO), so AP 0 keeps the model's value (the gauge).
  Offsets uniform in :math:`[-\pi,\pi)` are far outside any local basin, so the fit starts
  from the closed form :math:`\hat\delta_m - \hat\delta_0 = \arg\sum_l e^{j(e_{lm}-e_{l0})}`
  of the residuals :math:`e_{lm} = \mathrm{wrap}(r_{lm} - \mu_m(\mathbf x_l))` of the start.
* ``"surfaces"``: :math:`\varepsilon_r` of every reflector of a room (or the ground of the
  two-ray model, or each material of a scene of faces: one per face name),
  :math:`\varepsilon' = 1 + |a|`, :math:`\varepsilon'' = |b|` (physical
  for every :math:`a, b`, with a derivative of modulus 1 everywhere: a softplus saturates
  as a low-loss material's :math:`\varepsilon''` nears 0 and a square has a stationary
  point there, and either is a fixed point of the LM), from several material starts
  (:data:`CALIBRATION_STARTS`), the likeliest winning.
* ``"antenna"``: the exponent :math:`q` of a :class:`~dmimo_jax.CosinePattern` (shared or
  per AP), :math:`q = |c|`; a start below :data:`~dmimo_jax.calibration.groups.MIN_EXPONENT_START` starts there (at
  :math:`q = 0` the derivative vanishes and the fit could not leave it).
* ``"polarization"``: TE or TM, by the likelihood of the whole fit under each.

Staging: offsets from the closed form; then, when surfaces are fitted, surfaces and offsets
from each material start (the best kept); then every group jointly. For a scene of faces
(whose phases jump across shadow boundaries) a fit that ends outside its chi-square band gets
one more round with the residuals beyond :data:`BOUNDARY_OUTLIER_Z` set aside, then all of
them again, kept when it lowers the full cost.

Unlabeled snapshots (``unlabeled=``, beyond the paper). A deployment in operation collects
far more snapshots than anyone labels. Given N of them with start positions in the right
basin (the online stage's estimates under the labeled calibration), a last stage fits every
group to the labeled and the unlabeled snapshots together, each unlabeled position profiled
out: at every iterate it is re-located by the package's LM (:data:`~dmimo_jax.calibration.solver.UNLABELED_STEPS` steps),
and its residuals enter the calibration's Jacobian projected off its own three directions
(variable projection; the Gauss-Newton Schur complement of the joint problem in
:math:`\boldsymbol\vartheta` and the N positions, at the memory of the labeled fit). Each
unlabeled snapshot adds :math:`M - 4` degrees of freedom (a CPO and three coordinates
spent; complex snapshots, with their receivers' groups: :math:`2M - 5`, a complex snapshot
factor and three coordinates). Before that stage a snapshot whose cost at its re-located position exceeds its
chi-square's mean by 5 standard deviations (scaled by the labeled fit's reduced chi-square
when above 1) is left out (``unlabeled_used``): a wrong lobe would pull the fit. Used
snapshots enter the standard errors and the log-likelihood; the polarization is chosen on
the labeled snapshots.

The Jacobian. Each Levenberg-Marquardt step needs the normal equations of the whitened
residuals in every unknown; ``jax.jacfwd`` pushes one tangent per unknown, and the product
:math:`\mathbf J^\top\mathbf J` costs O(L M n^2). For complex snapshots whose groups each
move one AP (the receivers' gains and constants, the phase centres), unknowns of different
APs share a tangent (column compression: 7 tangents for any number of APs), the profiled
snapshot factor's derivative is taken in closed form, and the normal equations are summed
from those factors in O(L n^2); they equal autodiff's (``jacobian="autodiff"`` keeps the
reference; tested to 1e-12).

Honest uncertainty. Standard errors come from the Gauss-Newton information
:math:`\mathbf J^\top\mathbf J` of the whitened residuals, inverted through its eigenvalues
(a direction the data do not constrain gets an infinite or huge error, never a small one,
and a warning names it), in the natural values themselves (phase centres, offsets,
:math:`\varepsilon', \varepsilon''`, exponents: regular at a physical bound, where the
parametrization's kink would report 0), and scaled by :func:`~dmimo_jax.calibration.status.error_scale` of the reduced
chi-square :math:`\chi^2_\nu` (``reduced_chi2``; about 1 when the model explains the data
to the noise, dof = LM - L CPOs - parameters).

A failure cannot pass for a result. The joint fit runs rounds of ``num_steps`` LM steps until
a round lowers the cost by less than :data:`~dmimo_jax.calibration.solver.CONVERGENCE_TOLERANCE` (or ``max_steps`` are
spent), and :attr:`Calibration.status` says which of four ends it reached
(:func:`~dmimo_jax.calibration.status.fit_status`): ``"converged"`` (chi-square in :func:`~dmimo_jax.calibration.status.chi2_band`), ``"misfit"``
(converged above the band; ``chi2_by_ap`` and the warning say whether one AP or all carry
it), ``"noise_overstated"`` (below the band; standard errors scaled down), or
``"not_converged"``. :func:`~dmimo_jax.pipeline.run_offline` refuses a calibration that did
not converge and warns on the others.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_finite,
    check_int,
    check_phases,
    check_positions,
    check_scalar,
    is_concrete,
    warn_if_float32,
)
from dmimo_jax.calibration.groups import (
    Group,
    OffsetsGroup,
    antenna_group,
    positions_group,
    receiver_groups,
    surfaces_group,
)
from dmimo_jax.calibration.solver import (
    apply_groups,
    fit_lm,
    information,
    locate_labeled,
    split,
    standard_errors,
    whitened,
)
from dmimo_jax.calibration.specs import GROUPS, FitGroup, Positions, Surfaces, as_fit_groups
from dmimo_jax.calibration.status import (
    chi2_band,
    error_scale,
    fit_status,
    log_normalizer,
    prior_size,
    warn_status,
    warn_unidentified,
)
from dmimo_jax.gp.kernel import check_training_data
from dmimo_jax.likelihood import cpo_estimate
from dmimo_jax.materials import is_perfect_conductor, relative_permittivity
from dmimo_jax.phase import wrap
from dmimo_jax.physics import (
    CalibratableModel,
    PhaseModel,
    check_in_domain,
)
from dmimo_jax.pytree import jit_or_eager, pytree_dataclass, static_field
from dmimo_jax.receivers import (
    ReceiverModel,
    Receivers,
    channel,
    ideal_receivers,
    profiled_residuals,
)

CALIBRATION_STARTS = ("concrete", "brick", "plasterboard", "wood", "glass")
"""ITU-R P.2040 materials used as starting points (Table I of the paper, metal excepted)."""


BOUNDARY_OUTLIER_Z = 10.0
"""Standard deviations: the smallest residual of a piecewise model's fit (a scene of faces)
set aside for one round when the fit ends outside its chi-square band (a labeled UE on the
wrong side of a shadow boundary; :func:`calibrate`)."""


class Unlabeled(NamedTuple):
    """Snapshots at unknown positions for :func:`calibrate` to learn from as well.

    Typically the deployment's own traffic, located by the online stage under a calibration
    from the labeled snapshots alone; ``x0`` must be in the right basin (a wrong lobe's
    snapshot is screened out by its cost, module docstring).
    """

    r: ArrayLike  # (N, M) wrapped phases, rad; or complex snapshots, as calibrate's r
    noise_var: ArrayLike  # (N, M) phase-noise variances, rad^2 (complex: as calibrate's)
    x0: ArrayLike  # (N, 3) start positions, m


@pytree_dataclass
class Calibration:
    r"""Result of :func:`calibrate`.

    Attributes:
        model: the calibrated PhaseModel (its ``.scene.ap_positions`` are the fitted phase
            centres, ``.scene.ap_phase_offsets`` the offsets, its reflectors the materials).
        values: fitted values by group: ``"ap_positions"`` (M, 3) m, ``"ap_phase_offsets"``
            (M,) rad (wrapped; AP 0 is the gauge), ``"surfaces"`` (K,) complex
            :math:`\varepsilon_r`, ``"antenna"`` the exponent (() or (M,)).
        stderr: standard errors, same keys and shapes (for ``"surfaces"`` a complex number
            whose real part is the error of :math:`\mathrm{Re}\,\varepsilon_r` and imaginary
            part that of :math:`\mathrm{Im}\,\varepsilon_r`; 0 for what the gauge or
            ``Positions.free_axes`` hold fixed; ``inf`` for a direction the data cannot identify).
        log_likelihood: () profiled log-likelihood at the estimate.
        cpo: (L,) CPOs of the labeled snapshots, wrapped, rad.
        reduced_chi2: () sum of squared whitened residuals / dof (about 1 for a model that
            explains the data to the noise); the standard errors are inflated by
            :math:`\sqrt{\max(1, \chi^2_\nu)}`.
        log_likelihood_by_polarization: (2,) best log-likelihood for TE and TM (``-inf`` for
            one not tried).
        dof: degrees of freedom LM - L - number of parameters, plus M - 4 per unlabeled
            snapshot used (static).
        polarization: the model's polarization after the fit (static).
        fit: the groups fitted (static).
        surfaces: names of the calibrated surfaces (static; empty unless ``"surfaces"``).
        unlabeled_x: (N, 3) the unlabeled snapshots' positions under the calibrated model
            (``None`` without ``unlabeled=``).
        unlabeled_used: (N,) bool, the unlabeled snapshots the fit used (the others failed
            the cost screen; ``None`` without ``unlabeled=``).
        status: ``"converged"``, ``"misfit"``, ``"noise_overstated"`` or
            ``"not_converged"`` (:func:`~dmimo_jax.calibration.status.fit_status`; static). Only ``"converged"`` is a fit
            that explains the data to the noise at an optimum.
        chi2_by_ap: (M,) each AP's share of the chi-square on the same scale as
            ``reduced_chi2`` (about 1 each for a good fit; a misfit carried by a few APs
            shows there).
        receivers: complex snapshots: the fitted :class:`~dmimo_jax.receivers.Receivers`
            (``None`` for wrapped phases); ``cpo`` then holds the phases of the snapshot
            factors.
    """

    model: Any
    values: dict[str, Array]
    stderr: dict[str, Array]
    log_likelihood: Array
    cpo: Array
    reduced_chi2: Array
    log_likelihood_by_polarization: Array
    dof: int = static_field()
    polarization: str = static_field()
    fit: tuple[str, ...] = static_field()
    surfaces: tuple[str, ...] = static_field()
    unlabeled_x: Array | None = None
    unlabeled_used: Array | None = None
    status: str = static_field(default="converged")
    chi2_by_ap: Array | None = None
    receivers: Receivers | None = None


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
    _check_model(model)
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
    _check_model(model)
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


def _offsets_group(model: Any, x: Array, r: Array) -> Group:
    start = offsets_closed_form(model, x, r)
    return OffsetsGroup.from_start(start)


def log_likelihood(model: PhaseModel, x: ArrayLike, r: ArrayLike, noise_var: ArrayLike) -> Array:
    """The CPO-profiled Gaussian log-likelihood of L labeled snapshots (module docstring).

    Raises:
        ValueError: x not (L, 3), r or noise_var not (L, M), or (concrete input) values that
            :func:`calibrate` would refuse.
    """
    shapes = (np.shape(x), np.shape(r), np.shape(noise_var))
    num_l = shapes[0][0] if len(shapes[0]) == 2 else -1
    if shapes[0] != (num_l, 3) or not shapes[1] == shapes[2] == (num_l, model.num_aps):
        raise ValueError(
            f"x, r and noise_var must have shapes (L, 3), (L, M), (L, M) with M = "
            f"{model.num_aps}, got {shapes[0]}, {shapes[1]}, {shapes[2]}"
        )
    if is_concrete(x, r, noise_var):
        check_training_data(x, r, noise_var, model.num_aps)
    x, r, noise_var = jnp.asarray(x), jnp.asarray(r), jnp.asarray(noise_var)
    e = whitened(model, x, r, noise_var)
    return -0.5 * (jnp.sum(e * e) + jnp.sum(jnp.log(2 * jnp.pi * noise_var)))


# ------------------------------------------------------------------------------ calibrate


def _check_model(model: Any) -> None:
    # the receivers are calibrate's own argument: a ReceiverModel would carry them twice
    if isinstance(model, ReceiverModel) or not isinstance(model, CalibratableModel):
        raise ValueError(
            "model must be a TwoRayModel, an ImageSourceModel, a MeshModel or another "
            "CalibratableModel (a physical model that knows its surfaces, mounts and scene: "
            f"dmimo_jax.physics.CalibratableModel), got {type(model).__name__}"
        )


def _check_positions_request(request: Positions, num_aps: int) -> None:
    """``ValueError`` for a ``Positions`` request whose options do not hold."""
    if request.start is not None:
        check_positions("Positions.start", request.start, batched=True)
        if np.shape(request.start) != (num_aps, 3):
            raise ValueError(
                f"Positions.start must have shape ({num_aps}, 3) (one per AP), got "
                f"{np.shape(request.start)}"
            )
    if request.prior is not None:
        check_scalar("Positions.prior", request.prior, positive=True)


def _starts(frequency_hz: float, starts: Sequence[complex | str] | None) -> np.ndarray:
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


def _fit_one_polarization(
    model, x, r, noise_var, fit, idx, eps_starts, num_steps, max_steps, jacobian="auto"
):
    """Staged fit under the model's polarization: (final groups, u, cost, converged).
    ``fit``: the requested groups by name (:mod:`~dmimo_jax.calibration.specs`)."""
    groups: dict[str, Group] = {}
    if "ap_phase_offsets" in fit:
        groups["ap_phase_offsets"] = _offsets_group(model, x, r)
    if isinstance(model, ReceiverModel):
        groups.update({g.name: g for g in receiver_groups(model, list(fit))})
    closed = ("ap_phase_offsets", "receiver_gains", "receiver_constants")  # closed-form starts
    if "surfaces" in fit:
        # stage 2: surfaces (and offsets or receivers) from every material start, all alike
        first = [groups[g] for g in closed if g in groups]
        rows = []
        for e in eps_starts:
            s = surfaces_group(model, idx, np.full(len(idx), e))
            rows.append(np.concatenate([np.asarray(g.u0) for g in first] + [np.asarray(s.u0)]))
        stage = first + [s]
        u, _, _ = fit_lm(
            model, stage, x, r, noise_var, np.stack(rows), num_steps, jacobian=jacobian
        )
        parts = split(stage, jnp.asarray(u))
        for g, part in zip(first, parts, strict=False):
            groups[g.name] = dataclasses.replace(g, u0=part)
        groups["surfaces"] = dataclasses.replace(s, u0=parts[-1])
    if "ap_positions" in fit:
        pos = fit["ap_positions"]
        groups["ap_positions"] = positions_group(model, pos.free_axes, pos.prior, pos.start)
    if "antenna" in fit:
        groups["antenna"] = antenna_group(model)
    final = [groups[g] for g in GROUPS if g in groups]
    u0 = np.concatenate([np.asarray(g.u0) for g in final])
    # every fit ends in the converging rounds, also one whose groups stage 2 fitted already
    # (one round of a multi-start is no proof of convergence; a converged start stops
    # after one round)
    u, cost, converged = fit_lm(
        model, final, x, r, noise_var, u0[None], num_steps, None, max_steps, jacobian
    )
    if _piecewise(model):
        u, cost, converged = _across_boundaries(
            model, final, x, r, noise_var, u, cost, converged, num_steps, max_steps, jacobian
        )
    return final, u, cost, converged


def _piecewise(model: Any) -> bool:
    """A model whose paths appear and disappear with the geometry (shadows, finite faces)."""
    return bool(model.piecewise)


def _across_boundaries(
    model, groups, x, r, noise_var, u, cost, converged, num_steps, max_steps, jacobian="auto"
):
    """One more try when a fit of a piecewise model ends outside the chi-square band.

    A labeled UE near a shadow boundary of a displaced AP can sit on the wrong side of it at
    the start: its residual for that AP is radians, and no continuous step crosses the
    boundary (the Jacobian does not see it), and pulling the AP toward it displaces the AP
    for every other snapshot. The worst residuals (beyond :data:`BOUNDARY_OUTLIER_Z` and a
    quarter of the largest, in standard deviations; at most 5% of them) are set aside (their
    variance multiplied by 1e12), the fit continues from where it stopped, then runs again on
    every residual from there; the result is kept only if its full cost is lower.
    """
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


def calibrate(
    model: Any,
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    *,
    fit: Sequence[str | FitGroup] | str | FitGroup = ("ap_positions", "ap_phase_offsets"),
    num_steps: int = 40,
    max_steps: int = 600,
    unlabeled: Unlabeled | None = None,
    receivers: Receivers | None = None,
    jacobian: str = "auto",
    warn: bool = True,
) -> Calibration:
    r"""Maximum-likelihood calibration of a physical model from L labeled snapshots.

    Wrapped phases ``r`` (the paper's receivers), or complex snapshots ``r`` (real receivers,
    :mod:`dmimo_jax.receivers`: :math:`h = s\,G\odot c(x) + b + w`): then ``noise_var`` is
    the complex noise's variance :math:`\sigma_w^2` per entry, the snapshot factors are
    profiled out as the CPOs are, the receivers' gains and constants are the groups
    ``"receiver_gains"`` (:math:`G_0 = 1` the gauge; their phases are the APs' offsets, so
    ``"ap_phase_offsets"`` is refused) and ``"receiver_constants"``, started by
    :func:`receivers_closed_form`, and ``Calibration.receivers`` holds the result.

    Args:
        model: the nominal :class:`~dmimo_jax.TwoRayModel` or
            :class:`~dmimo_jax.ImageSourceModel` (surveyed AP positions, guessed materials,
            zero offsets, a pattern with a guessed exponent): the start of the fit, and the
            values of everything not fitted.
        x: (L, 3) labeled UE positions, m (inside the room for a room model).
        r: (L, M) wrapped phases measured there, or (L, M) complex snapshots.
        noise_var: (L, M) phase-noise variances, rad^2 (complex snapshots: the complex
            noise's variance per entry).
        fit: the groups to fit: objects of :mod:`~dmimo_jax.calibration.specs` with their
            options (``Positions(free_axes=..., prior=..., start=...)``,
            ``Surfaces(names=..., starts=...)``, ``Offsets()``, ...) or their shorthands
            among :data:`GROUPS` (``"ap_positions"`` is ``Positions()``), mixed freely.
        num_steps: Levenberg-Marquardt steps per round (one compiled program): the staged
            starts run one round, the joint fit rounds until converged.
        max_steps: the joint fit's most steps; a fit still lowering its cost then is
            ``status="not_converged"``.
        unlabeled: :class:`Unlabeled` snapshots whose positions are profiled out (module
            docstring): a last stage fits every group to the labeled and the unlabeled
            snapshots together.
        receivers: complex snapshots: the receivers of the groups not fitted, and the start
            of those fitted (default ideal: G = 1, b = 0).
        jacobian: ``"auto"``: for complex snapshots whose groups each move one AP (receivers'
            gains and constants, phase centres) the Levenberg-Marquardt Jacobian by column
            compression (module docstring; equal to autodiff's); otherwise, and with
            ``"autodiff"``, ``jax.jacfwd`` (the reference, for checks and timing).
        warn: warn unless ``status == "converged"`` (the warning says what went wrong and,
            for a misfit, which APs carry it).

    Returns:
        A :class:`Calibration` (calibrated ``model``, ``values``, ``stderr``, goodness of fit).

    Raises:
        ValueError: an unknown group or one the model lacks, a mounted AP asked to leave its
            surface, shapes that do not match (L, M), non-finite input, labeled positions
            outside the room or on an AP, fewer residuals than unknowns.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> jax.config.update("jax_enable_x64", True)
        >>> import dmimo_jax as dj
        >>> truth = dj.paper_scene(-10.0, convention="itu")
        >>> offsets = np.random.default_rng(0).uniform(-np.pi, np.pi, truth.num_aps)
        >>> world = dj.TwoRayModel(truth.replace(ap_phase_offsets=offsets))
        >>> x = dj.sample_positions(jax.random.key(0), 20, truth)
        >>> r = dj.simulate_phases_batch(jax.random.key(1), world, x, jnp.zeros(20))
        >>> var = jax.vmap(world.variance)(x)
        >>> cal = calibrate(dj.TwoRayModel(truth), x, r, var, fit="ap_phase_offsets")
        >>> err = np.angle(np.exp(1j * (cal.values["ap_phase_offsets"] - (offsets - offsets[0]))))
        >>> bool(np.max(np.abs(err)) < 1e-2)
        True
    """
    _check_model(model)
    requests = {g.name: g for g in as_fit_groups(fit)}
    fit = tuple(name for name in GROUPS if name in requests)
    check_int("num_steps", num_steps, minimum=1)
    check_int("max_steps", max_steps, minimum=num_steps)
    if jacobian not in ("auto", "autodiff"):
        raise ValueError(f"jacobian must be 'auto' or 'autodiff', got {jacobian!r}")
    x, r, noise_var = _checked_data(model, x, r, noise_var, requests)
    complex_data = bool(jnp.iscomplexobj(r))
    inner = model
    model = _with_receivers(model, x, r, fit, receivers, complex_data)
    idx, names, eps_starts = [], [], np.zeros(0)
    if "surfaces" in fit:
        request: Surfaces = requests["surfaces"]
        idx, names = inner.calibration_surfaces(request.names)
        eps_starts = _starts(float(model.scene.frequency), request.starts)
    if "antenna" in fit:
        antenna_group(model)  # refuse a pattern with nothing to fit before any work
    unl_all = None
    if unlabeled is not None:
        unl_all = _unlabeled_arrays(unlabeled, model, x.dtype, complex_data)
    pols = ("TE", "TM") if "polarization" in fit else (model.scene.polarization,)
    lls, best = {"TE": -np.inf, "TM": -np.inf}, None
    for pol in pols:
        m = model if model.scene.polarization == pol else model.with_scene(
            model.scene.replace(polarization=pol)
        )  # fmt: skip
        groups, u, cost, converged = _fit_one_polarization(
            m, x, r, noise_var, requests, idx, eps_starts, num_steps, max_steps, jacobian
        )
        lls[pol] = -0.5 * (cost + log_normalizer(noise_var, complex_data))
        if best is None or lls[pol] > best.log_likelihood:
            best = _Fit(m, tuple(groups), u, cost, converged, lls[pol], pol, None, None)
    best = _degrees_of_freedom(best, r, complex_data)
    dof_labeled = best.dof
    if unl_all is not None:
        best, unl_all = _with_unlabeled(best, x, r, noise_var, unl_all, num_steps, max_steps)
    return _report(
        best, x, r, noise_var, unl_all, dof_labeled, fit, tuple(names), lls, warn, max_steps
    )


class _Fit(NamedTuple):
    """A fit under one polarization, as :func:`calibrate` carries it to its report."""

    model: Any  # the model under that polarization (receivers included)
    groups: tuple[Group, ...]
    u: Any
    cost: float
    converged: bool
    log_likelihood: float
    polarization: str
    dof: int | None  # degrees of freedom of the residuals (with the unlabeled ones)
    used: Any  # (N,) bool: the unlabeled snapshots kept, or None


def _checked_data(model, x, r, noise_var, requests) -> tuple[Array, Array, Array]:
    """``(x, r, noise_var)`` as arrays of the model's dtype, checked (``ValueError``)."""
    # one label may do (e.g. offsets alone); the count of residuals is checked against the
    # unknowns later
    check_training_data(x, r, noise_var, model.num_aps, min_labels=1)
    if "ap_positions" in requests:
        _check_positions_request(requests["ap_positions"], model.num_aps)
    warn_if_float32("calibrate")
    dtype = model.scene.ap_positions.dtype
    check_in_domain("x", np.asarray(x, float), model)
    complex_data = np.iscomplexobj(r)
    if complex_data:
        dead = np.flatnonzero(np.all(np.asarray(r) == 0, axis=0))
        if dead.size:
            raise ValueError(
                f"r: the receivers of AP(s) {dead.tolist()} measured exactly 0 in every "
                "snapshot (dead receivers): leave those APs out of the model and the data"
            )
    r = jnp.asarray(r, jnp.result_type(dtype, complex) if complex_data else dtype)
    return jnp.asarray(x, dtype), r, jnp.asarray(noise_var, dtype)


def _with_receivers(model, x, r, fit, receivers, complex_data) -> Any:
    """The model complex snapshots are fitted with: a :class:`ReceiverModel` of the given
    receivers (their fitted groups started in closed form); phases: the model itself."""
    rx_fit = [f for f in fit if f.startswith("receiver_")]
    if not complex_data:
        if rx_fit or receivers is not None:
            raise ValueError(
                f"fit {rx_fit or ''} / receivers=: the receivers' groups need complex snapshots r"
            )
        return model
    if "ap_phase_offsets" in fit:
        raise ValueError(
            "fit: complex snapshots carry the APs' phase offsets in 'receiver_gains' (the "
            "gains' phases); fit that instead of 'ap_phase_offsets'"
        )
    rx = ideal_receivers(model.num_aps, r.dtype) if receivers is None else receivers
    if not isinstance(rx, Receivers) or rx.num_aps != model.num_aps:
        raise ValueError(
            f"receivers must be a Receivers of the model's {model.num_aps} APs, got "
            f"{type(rx).__name__}"
        )
    if rx_fit:
        rx = receivers_closed_form(model, x, r, rx, fit=rx_fit)
    return ReceiverModel(model, rx)


def _degrees_of_freedom(fit: _Fit, r: Array, complex_data: bool) -> _Fit:
    """``fit`` with its degrees of freedom: residuals (2 per complex entry), less one CPO
    (snapshot factor: 2) per snapshot and the unknowns, plus the prior's terms.

    Raises:
        ValueError: fewer residuals than unknowns.
    """
    num_params = sum(g.size for g in fit.groups)
    num_l, num_m = r.shape
    per = 2 if complex_data else 1
    dof = per * (num_l * num_m - num_l) - num_params + prior_size(fit.groups)
    if dof < 1:
        raise ValueError(
            f"{per * num_l * num_m} residuals cannot fit {num_params} parameters and {num_l} "
            "CPOs: use more labeled snapshots"
        )
    return fit._replace(dof=dof)


def _with_unlabeled(fit: _Fit, x, r, noise_var, unl_all, num_steps, max_steps):
    """The last stage: the unlabeled snapshots that fit the labeled calibration (re-located
    under it, :func:`_screen_unlabeled`) join a fit of every group. Returns the fit and the
    unlabeled arrays with their re-located starts."""
    complex_data = bool(jnp.iscomplexobj(r))
    chi2 = fit.cost / fit.dof
    start = apply_groups(fit.model, fit.groups, jnp.asarray(fit.u))
    used, x_start = _screen_unlabeled(start, unl_all, chi2, complex_data)
    unl_all = (x_start, *unl_all[1:])
    fit = fit._replace(used=used)
    if not np.any(used):
        return fit, unl_all
    unl = tuple(v[used] for v in unl_all)
    u, cost, converged = fit_lm(
        fit.model, fit.groups, x, r, noise_var, np.asarray(fit.u)[None], num_steps, unl, max_steps
    )
    # M residuals (2M real), a CPO (snapshot factor: 2) and three coordinates each
    per = 2 if complex_data else 1
    dof = fit.dof + int(used.sum()) * (per * (r.shape[1] - 1) - 3)
    ll = -0.5 * (
        cost + log_normalizer(noise_var, complex_data) + log_normalizer(unl[2], complex_data)
    )
    return fit._replace(u=u, cost=cost, converged=converged, dof=dof, log_likelihood=ll), unl_all


def _report(fit, x, r, noise_var, unl_all, dof_labeled, names, surfaces, lls, warn, max_steps):
    """The :class:`Calibration` of a finished fit: status (and its warnings), standard
    errors from the information in the natural values, the values per group, the CPOs."""
    m, groups, dof = fit.model, fit.groups, fit.dof
    u, chi2 = jnp.asarray(fit.u), fit.cost / fit.dof
    complex_data = bool(jnp.iscomplexobj(r))
    num_l, num_m = r.shape
    unl = None if fit.used is None or not np.any(fit.used) else tuple(v[fit.used] for v in unl_all)
    e = np.asarray(whitened(apply_groups(m, groups, u), x, r, noise_var)).reshape(num_l, num_m, -1)
    chi2_by_ap = num_m * np.sum(e**2, axis=(0, 2)) / dof_labeled
    status = fit_status(chi2, dof, fit.converged)
    if warn and status != "converged":
        warn_status(status, chi2, dof, chi2_by_ap, max_steps)
    # the information in the natural values of surfaces and exponents: at a physical bound
    # the parametrization has a kink and the delta method could report an error of 0
    lin = [g.linearized(p) for g, p in zip(groups, split(groups, u), strict=True)]
    u_lin = jnp.concatenate([p for _, p in lin])
    info, nat, _ = information(m, tuple(g for g, _ in lin), x, r, noise_var, u_lin, unl)
    se = standard_errors(np.asarray(info), np.asarray(nat), error_scale(chi2, dof))
    fitted = apply_groups(m, groups, u)
    values, stderr, i = {}, {}, 0
    for g, part in zip(groups, split(groups, u), strict=True):
        natural = g.natural(part)
        values[g.name] = g.report(natural)
        stderr[g.name] = g.report(jnp.asarray(se[i : i + natural.shape[0]]))
        i += natural.shape[0]
    if warn:
        warn_unidentified(stderr)
    unlabeled_x = None if unl_all is None else _locate_jit(fitted, *unl_all)
    fitted_rx = None
    if complex_data:
        fitted, fitted_rx = fitted.model, fitted.receivers
        v = jax.vmap(partial(channel, fitted))(x) * fitted_rx.gains[None, :]
        cpo = jnp.angle(profiled_residuals(r, v, fitted_rx.constants, noise_var)[1])
    else:
        cpo = wrap(cpo_estimate(r, jax.vmap(fitted.mean)(x), noise_var))
    return Calibration(
        model=fitted,
        values=values,
        stderr=stderr,
        log_likelihood=jnp.asarray(fit.log_likelihood),
        cpo=cpo,
        reduced_chi2=jnp.asarray(chi2),
        log_likelihood_by_polarization=jnp.asarray([lls["TE"], lls["TM"]]),
        dof=int(dof),
        polarization=fit.polarization,
        fit=names,
        surfaces=surfaces,
        unlabeled_x=unlabeled_x,
        unlabeled_used=None if fit.used is None else jnp.asarray(fit.used),
        status=status,
        chi2_by_ap=jnp.asarray(chi2_by_ap),
        receivers=fitted_rx,
    )


def _unlabeled_arrays(
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


_locate_jit = jax.jit(locate_labeled)


def _screen_unlabeled(
    model: Any, unlabeled: tuple, chi2: float, complex_data: bool = False
) -> tuple[np.ndarray, Array]:
    """The unlabeled snapshots re-located under ``model`` (N, 3), and which of them (N,) bool
    have a cost there within 5 standard deviations of its chi-square (M - 4 degrees of
    freedom; 2M - 5 for complex snapshots), scaled by the labeled fit's reduced chi-square
    when above 1: a snapshot in a wrong lobe fails it."""
    x0, r, nv = unlabeled
    xs = _locate_jit(model, x0, r, nv)
    e = whitened(model, xs, r, nv).reshape(r.shape[0], -1)
    k = 2 * r.shape[1] - 5 if complex_data else r.shape[1] - 4
    bound = max(1.0, chi2) * (k + 5.0 * np.sqrt(2.0 * k))
    return np.asarray(jnp.sum(e * e, axis=1)) < bound, xs
