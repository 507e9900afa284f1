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
  further (:mod:`~dmimo_jax.calibration.groups`).
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
  (:data:`~dmimo_jax.calibration.CALIBRATION_STARTS`), the likeliest winning.
* ``"antenna"``: the exponent :math:`q` of a :class:`~dmimo_jax.CosinePattern` (shared or
  per AP), :math:`q = |c|`; a start below :data:`~dmimo_jax.calibration.groups.MIN_EXPONENT_START` starts there (at
  :math:`q = 0` the derivative vanishes and the fit could not leave it).
* ``"polarization"``: TE or TM, by the likelihood of the whole fit under each.

Staging: offsets from the closed form; then, when surfaces are fitted, surfaces and offsets
from each material start (the best kept); then every group jointly. For a scene of faces
(whose phases jump across shadow boundaries) a fit that ends outside its chi-square band gets
one more round with the residuals beyond
:data:`~dmimo_jax.calibration.staging.BOUNDARY_OUTLIER_Z` set aside, then all of
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

from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_int,
    is_concrete,
    warn_if_float32,
)
from dmimo_jax.calibration.closed_form import check_calibratable, receivers_closed_form
from dmimo_jax.calibration.groups import (
    Deployment,
    FitGroup,
    ReceiverConstants,
    ReceiverGains,
    Surfaces,
    as_fit_groups,
)
from dmimo_jax.calibration.solver import (
    apply_groups,
    fit_lm,
    information,
    split,
    standard_errors,
    whitened,
)
from dmimo_jax.calibration.staging import fit_staged
from dmimo_jax.calibration.status import (
    error_scale,
    fit_status,
    log_normalizer,
    warn_status,
    warn_unidentified,
)
from dmimo_jax.calibration.unlabeled import (
    Unlabeled,
    locate_jit,
    screen_unlabeled,
    unlabeled_arrays,
)
from dmimo_jax.gp.kernel import check_training_data
from dmimo_jax.likelihood import cpo_estimate
from dmimo_jax.phase import wrap
from dmimo_jax.physics import (
    PhaseModel,
    check_in_domain,
)
from dmimo_jax.pytree import pytree_dataclass, static_field
from dmimo_jax.receivers import (
    ReceiverModel,
    Receivers,
    channel,
    ideal_receivers,
    profiled_residuals,
)


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
        fit: the groups to fit: objects of :mod:`~dmimo_jax.calibration.groups` with their
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
    return _calibrate(
        [(model, x, r, noise_var)], fit, num_steps, max_steps, receivers, jacobian, warn, unlabeled
    )[0]


def calibrate_many(
    model: Any,
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    *,
    fit: Sequence[str | FitGroup] | str | FitGroup = ("ap_positions", "ap_phase_offsets"),
    num_steps: int = 40,
    max_steps: int = 600,
    receivers: Receivers | None = None,
    jacobian: str = "auto",
    warn: bool = True,
) -> list[Calibration]:
    r""":func:`calibrate` of N deployments of the same shapes at once: a study over many
    worlds (a robustness benchmark, a Monte Carlo of surveys) or many sites of one plan.

    Each deployment's calibration equals its own :func:`calibrate` call (the same checks,
    starts, stages, status, warnings and standard errors; answers equal to rounding, tested
    to 1e-9), but each LM stage of the N fits runs as one program: the fitting core
    :func:`~dmimo_jax.calibration.solver.fit_rounds` ``jax.vmap``-ed over the deployments
    (:func:`~dmimo_jax.calibration.solver.fit_lm_many`), each stopping at its own round.
    Labeled snapshots only (``unlabeled=`` is :func:`calibrate`'s).

    Args:
        model: the nominal model shared by every deployment (as :func:`calibrate`'s), or a
            sequence of N nominal models of the same kind and shapes (one per deployment).
        x: (N, L, 3) labeled UE positions, m.
        r: (N, L, M) their wrapped phases, rad, or complex snapshots.
        noise_var: (N, L, M) noise variances (as :func:`calibrate`'s).
        fit: as :func:`calibrate`'s (so are ``num_steps``, ``max_steps``, ``receivers``,
            ``jacobian`` and ``warn``), the same for every deployment.

    Returns:
        N :class:`Calibration`, in the deployments' order.

    Raises:
        ValueError: x, r, noise_var not (N, L, 3), (N, L, M), (N, L, M) with N >= 1; models
            of different kinds or shapes; anything :func:`calibrate` refuses (naming it).
    """
    shapes = (np.shape(x), np.shape(r), np.shape(noise_var))
    num = shapes[0][0] if len(shapes[0]) == 3 and shapes[0][0] >= 1 else -1
    if num < 0 or shapes[0][2] != 3 or not shapes[1] == shapes[2] == shapes[0][:2] + shapes[1][2:]:
        raise ValueError(
            "x, r and noise_var must have shapes (N, L, 3), (N, L, M), (N, L, M) with N >= 1 "
            f"deployments, got {shapes[0]}, {shapes[1]}, {shapes[2]}"
        )
    models = list(model) if isinstance(model, (list, tuple)) else [model] * num
    if len(models) != num:
        raise ValueError(f"model: a sequence of models must hold N = {num}, got {len(models)}")
    if len({type(m) for m in models}) > 1:
        raise ValueError("model: every deployment's model must be of one kind")
    data = [(models[i], x[i], r[i], noise_var[i]) for i in range(num)]
    return _calibrate(data, fit, num_steps, max_steps, receivers, jacobian, warn)


def _calibrate(
    data, fit, num_steps, max_steps, receivers, jacobian, warn, unlabeled=None
) -> list[Calibration]:
    """The shell of :func:`calibrate` and :func:`calibrate_many`: ``data`` a list of
    ``(model, x, r, noise_var)``, one per deployment; the fits of every deployment staged
    together (:func:`~dmimo_jax.calibration.staging.fit_staged`)."""
    for nominal, *_ in data:
        check_calibratable(nominal)
    requests = as_fit_groups(fit)
    check_int("num_steps", num_steps, minimum=1)
    check_int("max_steps", max_steps, minimum=num_steps)
    if jacobian not in ("auto", "autodiff"):
        raise ValueError(f"jacobian must be 'auto' or 'autodiff', got {jacobian!r}")
    deployments = []
    for nominal, x, r, noise_var in data:
        x, r, noise_var = _checked_data(nominal, x, r, noise_var, requests)
        complex_data = bool(jnp.iscomplexobj(r))
        m = _with_receivers(nominal, x, r, requests, receivers, complex_data)
        deployments.append(Deployment(m, x, r, noise_var))
    model = deployments[0].model
    unl_all = None
    if unlabeled is not None:
        unl_all = unlabeled_arrays(unlabeled, model, deployments[0].x.dtype, complex_data)
    # each deployment under its own polarization, or under each a group asks for in turn
    pols = tuple(dict.fromkeys(p for g in requests for p in g.polarizations())) or (None,)
    lls = [{"TE": -np.inf, "TM": -np.inf} for _ in deployments]
    best: list[_Fit | None] = [None] * len(deployments)
    for pol in pols:
        under = [d._replace(model=_with_polarization(d.model, pol)) for d in deployments]
        staged = fit_staged(under, requests, num_steps, max_steps, jacobian)
        for i, (d, s) in enumerate(zip(under, staged, strict=True)):
            p = d.model.scene.polarization
            lls[i][p] = -0.5 * (s.cost + log_normalizer(d.noise_var, complex_data))
            if best[i] is None or lls[i][p] > best[i].log_likelihood:
                best[i] = _Fit(d.model, s.groups, s.u, s.cost, s.converged, lls[i][p], p)
    names = tuple(g.name for g in requests)
    out = []
    for d, fitted, ll in zip(deployments, best, lls, strict=True):
        fitted = _degrees_of_freedom(fitted, d.r, d.noise_var, complex_data)
        dof_labeled, unl = fitted.dof, unl_all
        if unl is not None:
            fitted, unl = _with_unlabeled(fitted, d, unl, num_steps, max_steps)
        surfaces = next((g.names for g in fitted.groups if isinstance(g, Surfaces)), ())
        out.append(
            _report(fitted, d, unl, dof_labeled, names, tuple(surfaces), ll, warn, max_steps)
        )
    return out


def _with_polarization(model: Any, pol: str) -> Any:
    """``model`` under polarization ``pol`` (itself when it has it already or ``pol`` is
    None)."""
    if pol is None or model.scene.polarization == pol:
        return model
    return model.with_scene(model.scene.replace(polarization=pol))


class _Fit(NamedTuple):
    """A fit under one polarization, as :func:`calibrate` carries it to its report."""

    model: Any  # the model under that polarization (receivers included)
    groups: tuple[FitGroup, ...]
    u: Any
    cost: float
    converged: bool
    log_likelihood: float
    polarization: str
    dof: int | None = None  # degrees of freedom of the residuals (with the unlabeled ones)
    used: Any = None  # (N,) bool: the unlabeled snapshots kept, or None


def _checked_data(model, x, r, noise_var, requests) -> tuple[Array, Array, Array]:
    """``(x, r, noise_var)`` as arrays of the model's dtype, checked (``ValueError``)."""
    # one label may do (e.g. offsets alone); the count of residuals is checked against the
    # unknowns later
    # an AP that hears nothing at a label (behind metal) has an infinite variance there: it
    # weighs 0 (its residual, the CPO's estimate, the degrees of freedom and the normalizer
    # leave it out); NaN, zero or negative variances stay refused
    check_training_data(x, r, noise_var, model.num_aps, min_labels=1, deaf=True)
    complex_data = np.iscomplexobj(r)
    for group in requests:
        group.check(model, complex_data)
    warn_if_float32("calibrate")
    dtype = model.scene.ap_positions.dtype
    check_in_domain("x", np.asarray(x, float), model)
    if complex_data:
        dead = np.flatnonzero(np.all(np.asarray(r) == 0, axis=0))
        if dead.size:
            raise ValueError(
                f"r: the receivers of AP(s) {dead.tolist()} measured exactly 0 in every "
                "snapshot (dead receivers): leave those APs out of the model and the data"
            )
    r = jnp.asarray(r, jnp.result_type(dtype, complex) if complex_data else dtype)
    return jnp.asarray(x, dtype), r, jnp.asarray(noise_var, dtype)


def _with_receivers(model, x, r, requests, receivers, complex_data) -> Any:
    """The model complex snapshots are fitted with: a :class:`ReceiverModel` of the given
    receivers (those fitted started in closed form); phases: the model itself."""
    if not complex_data:
        if receivers is not None:
            raise ValueError("receivers=: the receivers need complex snapshots r (got phases)")
        return model
    rx = ideal_receivers(model.num_aps, r.dtype) if receivers is None else receivers
    if not isinstance(rx, Receivers) or rx.num_aps != model.num_aps:
        raise ValueError(
            f"receivers must be a Receivers of the model's {model.num_aps} APs, got "
            f"{type(rx).__name__}"
        )
    gains = any(isinstance(g, ReceiverGains) for g in requests)
    constants = any(isinstance(g, ReceiverConstants) for g in requests)
    if gains or constants:
        rx = receivers_closed_form(model, x, r, rx, gains=gains, constants=constants)
    return ReceiverModel(model, rx)


def _degrees_of_freedom(fit: _Fit, r: Array, noise_var: Array, complex_data: bool) -> _Fit:
    """``fit`` with its degrees of freedom: residuals (2 per complex entry), less one CPO
    (snapshot factor: 2) per snapshot and the unknowns, plus the prior's terms.

    Raises:
        ValueError: fewer residuals than unknowns.
    """
    num_params = sum(g.size for g in fit.groups)
    num_l, num_m = r.shape
    per = 2 if complex_data else 1
    heard = int(np.sum(np.isfinite(np.asarray(noise_var))))  # an AP that hears nothing: none
    dof = per * (heard - num_l) - num_params + sum(g.prior_size for g in fit.groups)
    if dof < 1:
        raise ValueError(
            f"{per * num_l * num_m} residuals cannot fit {num_params} parameters and {num_l} "
            "CPOs: use more labeled snapshots"
        )
    return fit._replace(dof=dof)


def _with_unlabeled(fit: _Fit, d: Deployment, unl_all, num_steps, max_steps):
    """The last stage: the unlabeled snapshots that fit the labeled calibration (re-located
    under it, :func:`~dmimo_jax.calibration.unlabeled.screen_unlabeled`) join a fit of every group. Returns the fit and the
    unlabeled arrays with their re-located starts."""
    _, x, r, noise_var = d
    complex_data = bool(jnp.iscomplexobj(r))
    chi2 = fit.cost / fit.dof
    start = apply_groups(fit.model, fit.groups, jnp.asarray(fit.u))
    used, x_start = screen_unlabeled(start, unl_all, chi2, complex_data)
    unl_all = (x_start, *unl_all[1:])
    fit = fit._replace(used=used)
    if not np.any(used):
        return fit, unl_all
    unl = tuple(v[used] for v in unl_all)
    d = Deployment(fit.model, x, r, noise_var)
    u, cost, converged = fit_lm(d, fit.groups, np.asarray(fit.u)[None], num_steps, unl, max_steps)
    # M residuals (2M real), a CPO (snapshot factor: 2) and three coordinates each
    per = 2 if complex_data else 1
    dof = fit.dof + int(used.sum()) * (per * (r.shape[1] - 1) - 3)
    ll = -0.5 * (
        cost + log_normalizer(noise_var, complex_data) + log_normalizer(unl[2], complex_data)
    )
    return fit._replace(u=u, cost=cost, converged=converged, dof=dof, log_likelihood=ll), unl_all


def _report(fit, d, unl_all, dof_labeled, names, surfaces, lls, warn, max_steps):
    """The :class:`Calibration` of a finished fit: status (and its warnings), standard
    errors from the information in the natural values, the values per group, the CPOs."""
    _, x, r, noise_var = d
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
    d_fit = Deployment(m, x, r, noise_var)
    info, nat, _ = information(d_fit, tuple(g for g, _ in lin), u_lin, unl)
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
    unlabeled_x = None if unl_all is None else locate_jit(fitted, *unl_all)
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
