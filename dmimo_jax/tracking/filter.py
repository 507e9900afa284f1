r"""A tracking filter for carrier-phase-only positioning of a moving UE (beyond the paper).

**Measurement update.** A snapshot (eq. 8) carries a fresh CPO. As the MLE does (eq. 15),
the filter profiles it out: about a linearization point :math:`\mathbf x_i` the residuals
:math:`\boldsymbol\varepsilon = \mathrm{wrap}(\mathbf r - \boldsymbol\mu(\mathbf x_i) - \hat\phi)`
(eqs. 15-16, wrap-corrected) are weighted by the EFIM of eq. (13b),
:math:`\mathbf J(\boldsymbol\theta) = \mathrm{diag}(\mathbf w) - \mathbf w\mathbf w^\top/\sum w`,
:math:`w_m = 1/\sigma_m^2(\mathbf x_i)` from the model (eq. 9), which annihilates any common
offset. This is the Kalman update of the CPO-marginalized measurement (a flat prior on
the CPO), with the Jacobian :math:`\mathbf H` by autodiff
(:func:`dmimo_jax.bounds.linearize`, the core of the PEB); with ``num_iterations`` > 1 it
is the iterated EKF (Gauss-Newton on the MAP cost, Bell and Cathey 1993). An iteration
after the first whose previous step moved the position by less than ``chord_below`` is a
chord step: the residuals are re-evaluated at the iterate, the Jacobian, the weights and
the gain of the last linearization are kept (one forward-mode trace per snapshot instead
of one per iteration). What a second iteration corrects is mostly the residuals'
curvature (a prediction error :math:`\delta` leaves :math:`\sim\pi\delta^2/(\lambda d)`
in the residuals), while :math:`\mathbf H` changes by a relative :math:`\delta/d`; a
chord converges linearly where Gauss-Newton converges quadratically, which shows after
long steps (acquisition, re-acquisition, very high SNR: docs/tracking.md), so long steps
re-linearize. :func:`~dmimo_jax.tracking.run.run_tracker` makes that choice per UE but skips the second trace for
a whole batch when no UE needs it (a locked batch). ``relinearize=False``: chord steps
whatever the step.

**Lock.** The normalized innovation squared :math:`\nu` is computed as the MAP
objective at the updated state, :math:`\boldsymbol\varepsilon^{+\top}\mathbf J(\boldsymbol\theta)\boldsymbol\varepsilon^+ + \Delta\mathbf s^\top(\mathbf P^-)^{-1}\Delta\mathbf s`
with the residuals :math:`\boldsymbol\varepsilon^+` there (for a linear model it is
:math:`\mathbf z^\top\mathbf S^{-1}\mathbf z`; at high SNR a linearization's error would
swamp it): the model's phases at the update, or after a last step shorter than
``chord_below / 1000`` the last iteration's moved along its Jacobian
(:func:`phases_at_update`: off by less than 1e-6 rad after such steps). Under lock it
is :math:`\chi^2_{M-1}`: the CPO takes one degree of freedom. A snapshot with
:math:`\nu` beyond a validation gate is not applied (an outlier, or a track on a wrong
maximum, must not drag the velocity). The track is declared lost
when the sum over the last ``window`` snapshots exceeds the
:math:`1-\alpha` quantile of :math:`\chi^2_{\mathrm{window}(M-1)}` (a window, not one
snapshot, so that one outlier does not break a track and a wrong lobe, whose residuals
are systematic, cannot hide behind the noise for long). The flags of a step
(:class:`TrackOutput`): ``lost``, the lock test failed; ``reacquired``, the track restarted
elsewhere (a re-acquisition on a loss clears ``lost`` in the same step); ``locked``, lock
confirmed: a full window since the last re-acquisition passed the test, and an outage keeps
it only while the prior still resolves the comb. A track whose re-acquisitions keep firing
is never ``locked``, whatever its covariance says.

**Acquisition and re-acquisition.** The likelihood of one snapshot is a comb of maxima
about :math:`\lambda/2` apart; the filter can resolve it only while its prior is narrower
than that. When the predicted position standard deviation exceeds ``max_position_std``
(at the start, after an outage) or the lock test fails, the next ``window`` snapshots
are scored jointly on a lattice of half-width ``reacquire_radius`` around the track (the
positions of older snapshots moved back along the estimated velocity), and the filter
restarts at the best lattice point: ``window`` snapshots resolve the lobes where one
cannot.

:class:`Tracker` holds the model and settings (a pytree); :class:`TrackState` the state
of one UE (a NamedTuple, the optax pattern). ``Tracker.update`` advances one UE by one
snapshot; :func:`~dmimo_jax.tracking.run.run_tracker` scans many UEs over time.
"""

from __future__ import annotations

from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_finite,
    check_int,
    check_num_aps,
    check_positions,
    check_scalar,
    is_concrete,
)
from dmimo_jax.bounds import linearize
from dmimo_jax.estimators.grid import PhasorTable, check_table_of
from dmimo_jax.estimators.phasors import cube_offsets
from dmimo_jax.likelihood import compressed_residuals
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.pytree import pytree_dataclass, static_field
from dmimo_jax.tracking.kalman import position_update
from dmimo_jax.tracking.motion import MotionModel, check_dt, check_motion, start_in_region
from dmimo_jax.tracking.reacquire import needs_reacquisition, reacquire


class TrackState(NamedTuple):
    """State of one UE's track (a leading axis for many UEs). K = the tracker's window."""

    mean: Array
    """(S,) estimate of the free state (position m, then velocity m/s if any);."""
    cov: Array
    """(S, S) its covariance   Tracker.position folds it into the region."""
    prior_mean: Array
    """(S,) while a re-acquisition is pending: the prediction without."""
    prior_cov: Array
    """(S, S)   the snapshots since (otherwise the filter's prediction)."""
    recent_r: Array
    """(K, M) the last K snapshots (oldest first)."""
    recent_age: Array
    """(K,) seconds since each was taken."""
    recent_valid: Array
    """(K,) bool, a snapshot was received."""
    recent_nis: Array
    """(K,) their normalized innovations squared."""
    nis_valid: Array
    """(K,) bool, counts in the lock test (reset by a re-acquisition)."""
    pending: Array
    """() bool, the prior no longer resolves the comb: re-acquire."""
    since_pending: Array
    """() int32, snapshots received since ``pending`` was raised."""
    lost: Array
    """() bool, the lock test failed at the last snapshot."""
    reacquired: Array
    """() bool, the last update restarted the track elsewhere."""
    num_reacquisitions: Array
    """() int32, restarts so far."""
    locked: Array
    """() bool, the lock test passed on a full window since the last restart."""
    failures: Array
    """() int32, re-acquisitions since lock was last confirmed."""


class TrackOutput(NamedTuple):
    """Per step of :func:`~dmimo_jax.tracking.run.run_tracker`: (T, B, ...)."""

    position: Array
    """(T, B, 3) m, after the step's update (folded into the region)."""
    position_cov: Array
    """(T, B, 3, 3) m^2, its covariance."""
    nis: Array
    """(T, B) normalized innovation squared (0 without a snapshot)."""
    lost: Array
    """(T, B) bool, the lock test failed at this step."""
    reacquired: Array
    """(T, B) bool, the track restarted elsewhere at this step."""
    locked: Array
    """(T, B) bool, lock confirmed: the lock test passed on a full window."""
    # since the last re-acquisition (or the last snapshot before an outage), and the prior
    # still resolves the comb. A track whose re-acquisitions keep firing never is.


class TrackerSettings(NamedTuple):
    """How a :class:`Tracker` iterates, tests its lock and re-acquires (the defaults are the
    ones every measurement in docs/tracking.md used).

    Attributes:
        num_iterations: Gauss-Newton iterations per snapshot (1: EKF; more: iterated EKF).
        relinearize: iterations after the first re-linearize (Jacobian and weights at the
            iterate: the iterated EKF, the default) where the previous step was at least
            ``chord_below`` long, and take a chord step (the residuals at the iterate, the
            last linearization's Jacobian, weights and gain) where it was shorter.
            ``False``: chord steps always (faster, less robust; module docstring).
        chord_below: that step length, m (default :math:`\\lambda/100`; 0: re-linearize at
            every iteration).
        window: snapshots in the lock test and in a re-acquisition (K >= 2).
        false_alarm: per-test probability :math:`\\alpha` of declaring a locked track lost.
        gate_false_alarm: per-snapshot probability that a locked track rejects a snapshot
            (its NIS beyond the :math:`\\chi^2_{M-1}` quantile, or its update's squared
            Mahalanobis length beyond the :math:`\\chi^2_3` one: the validation gate).
        max_position_std: predicted position standard deviation (per axis, m) above which
            the filter re-acquires (default :math:`\\lambda/12`: three standard deviations
            then reach :math:`\\lambda/4`, the edge of the basin of a maximum of the comb).
        reacquire_radius: half-width of the re-acquisition lattice, m (default
            :math:`\\lambda`, twice the comb's period: the spread of a 1 s outage's
            prediction at walking speed).
        reacquire_spacing: its spacing, m (default :math:`\\lambda/8`).
        reacquire_batch: UEs re-acquired per step at most in :func:`~dmimo_jax.tracking.run.run_tracker` (memory:
            each scores ``window`` snapshots at every lattice point).
        screen_snapshots: newest snapshots the re-acquisition's certified screen scores
            every lattice point on (:func:`~dmimo_jax.tracking.reacquire.lattice_argmin`; 1 to ``window``).
        screen_size: lattice points (times velocities) it scores on the whole window.
        lattice_chunk: lattice points a re-acquisition scores at once (faces: ~5 MB a point).
        global_after: failed local re-acquisitions before a global one (with a ``table``).
    """

    num_iterations: int = 2
    relinearize: bool = True
    chord_below: float | None = None
    window: int = 10
    false_alarm: float = 1e-6
    gate_false_alarm: float = 1e-9
    max_position_std: float | None = None
    reacquire_radius: float | None = None
    reacquire_spacing: float | None = None
    reacquire_batch: int = 8
    screen_snapshots: int = 2
    screen_size: int = 256
    global_after: int = 2
    lattice_chunk: int = 512


@pytree_dataclass
class Tracker:
    """An (iterated) extended Kalman filter on wrapped carrier phases with profiled CPOs,
    a windowed lock test and lattice re-acquisition (module docstring).

    Its fields are its constructor's arguments (a pytree: ``model``, ``motion``, ``dt`` and
    ``table`` are leaves, ``settings`` static, as for the
    :class:`~dmimo_jax.pipeline.Locator`); the construction checks them, makes a Scene its
    two-ray model and resolves the settings' wavelength-relative defaults, and the
    thresholds derived from them (the lock test's and the gates' chi-square quantiles, the
    re-acquisition lattice) are properties. Copies are ``dataclasses.replace``.

    Attributes:
        model: the PhaseModel the filter believes (or a Scene: its two-ray model).
        motion: :class:`~dmimo_jax.tracking.ConstantVelocity` or
            :class:`~dmimo_jax.tracking.RandomWalk`.
        dt: snapshot interval, s.
        settings: how it iterates, tests its lock and re-acquires (:class:`TrackerSettings`;
            default its defaults; stored with ``chord_below``, ``max_position_std``,
            ``reacquire_radius`` and ``reacquire_spacing`` resolved to metres).
        table: a :class:`~dmimo_jax.estimators.PhasorTable` of the model over the region:
            global re-acquisition after ``settings.global_after`` failed local ones.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from dmimo_jax import paper_scene
        >>> from dmimo_jax.tracking import ConstantVelocity
        >>> tracker = Tracker(paper_scene(), ConstantVelocity(1.0), dt=0.01,
        ...                   settings=TrackerSettings(window=8))
        >>> state = tracker.init(jnp.array([5.0, 5.0, 1.5]), position_std=0.01)
        >>> state.mean.shape, state.recent_r.shape
        ((6,), (8, 17))
    """

    model: PhaseModel
    motion: MotionModel
    dt: Array
    settings: TrackerSettings | None = static_field(default=None)
    table: PhasorTable | None = None

    def __post_init__(self) -> None:
        s = TrackerSettings() if self.settings is None else self.settings
        if not isinstance(s, TrackerSettings):
            raise ValueError(
                f"settings must be a TrackerSettings (or None: the defaults), got "
                f"{type(s).__name__}"
            )
        model = as_phase_model(self.model)
        check_num_aps(model.num_aps)
        check_motion(self.motion)
        check_dt(self.dt)
        check_int("num_iterations", s.num_iterations, minimum=1)
        if not isinstance(s.relinearize, bool | np.bool_):
            raise ValueError(f"relinearize must be a bool, got {s.relinearize!r}")
        check_int("window", s.window, minimum=2)
        for name in ("reacquire_batch", "screen_snapshots", "screen_size", "lattice_chunk",
                     "global_after"):  # fmt: skip
            check_int(name, getattr(s, name), minimum=1)
        if s.screen_snapshots > s.window:
            raise ValueError(
                f"screen_snapshots must be at most window = {s.window}, got {s.screen_snapshots}"
            )
        if self.table is not None:
            if not isinstance(self.table, PhasorTable):
                raise ValueError(
                    f"table must be a PhasorTable (estimators.phasor_table of the model over "
                    f"the region) or None, got {type(self.table).__name__}"
                )
            check_table_of(self.table, model)
        for name in ("false_alarm", "gate_false_alarm"):
            value = getattr(s, name)
            check_scalar(name, value, positive=True)
            if not float(value) < 1:
                raise ValueError(f"{name} must be in (0, 1), got {value!r}")
        lam = float(model.scene.wavelength)
        resolved = dict(
            chord_below=lam / 100 if s.chord_below is None else s.chord_below,
            max_position_std=lam / 12 if s.max_position_std is None else s.max_position_std,
            reacquire_radius=lam if s.reacquire_radius is None else s.reacquire_radius,
            reacquire_spacing=lam / 8 if s.reacquire_spacing is None else s.reacquire_spacing,
        )
        check_scalar("chord_below", resolved["chord_below"])
        if not float(resolved["chord_below"]) >= 0:
            raise ValueError(f"chord_below must be >= 0, got {s.chord_below!r}")
        for name in ("max_position_std", "reacquire_radius", "reacquire_spacing"):
            check_scalar(name, resolved[name], positive=True)
        ratio = float(resolved["reacquire_radius"]) / float(resolved["reacquire_spacing"])
        if (2 * int(np.ceil(ratio)) + 1) ** 3 > 100_000:
            raise ValueError(
                f"reacquire_radius / reacquire_spacing = {ratio:.3g} gives a lattice of more "
                "than 100,000 points; widen the spacing"
            )
        resolved = {k: float(v) for k, v in resolved.items()}
        object.__setattr__(self, "model", model)
        object.__setattr__(self, "dt", jnp.asarray(self.dt, model.scene.ap_positions.dtype))
        object.__setattr__(self, "settings", s._replace(**resolved))

    @property
    def nis_threshold(self) -> float:
        """The lock test's threshold: the chi-square quantile of ``window`` (M - 1) degrees of
        freedom at ``false_alarm``."""
        s = self.settings
        return float(scipy.stats.chi2.isf(s.false_alarm, s.window * (self.num_aps - 1)))

    @property
    def nis_gate(self) -> float:
        """A snapshot's validation gate: the chi-square quantile of M - 1 degrees of freedom
        at ``gate_false_alarm``."""
        return float(scipy.stats.chi2.isf(self.settings.gate_false_alarm, self.num_aps - 1))

    @property
    def jump_gate(self) -> float:
        """The update's squared Mahalanobis length gate: the chi-square quantile of 3
        degrees of freedom at ``gate_false_alarm``."""
        return float(scipy.stats.chi2.isf(self.settings.gate_false_alarm, 3))

    @property
    def offsets(self) -> Array:
        """The re-acquisition lattice's offsets (P, 3), m: ``reacquire_spacing`` apart out to
        ``reacquire_radius`` on each axis."""
        s = self.settings
        n = int(np.ceil(s.reacquire_radius / s.reacquire_spacing))
        axis = np.arange(-n, n + 1) * s.reacquire_spacing
        return jnp.asarray(cube_offsets(axis), self.dt.dtype)

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.model.num_aps

    def init(
        self,
        x0: ArrayLike,
        *,
        position_std: float,
        velocity_std: float = 1.0,
        v0: ArrayLike | None = None,
        acquire: bool = True,
    ) -> TrackState:
        """The state of one UE from a first position estimate ``x0`` (3,), m.

        Args:
            x0: e.g. the single-snapshot online stage's estimate of the first snapshot.
            position_std: its standard deviation per axis, m.
            velocity_std: the prior velocity's standard deviation per axis, m/s.
            v0: prior velocity (3,), m/s (default zero).
            acquire: re-acquire from the first ``window`` snapshots (a single-snapshot
                estimate may sit on a wrong maximum of the comb).
        """
        check_positions("x0", x0, batched=False)
        if is_concrete(x0):
            x0 = start_in_region(self.motion, np.asarray(x0, float)[None], "x0")[0]
        check_scalar("position_std", position_std, positive=True)
        check_scalar("velocity_std", velocity_std, positive=True)
        if v0 is not None:
            check_finite("v0", v0)
        dtype = self.dt.dtype
        mean = self.motion.initial_state(jnp.asarray(x0, dtype), v0).astype(dtype)
        variances = jnp.full(mean.shape, jnp.asarray(velocity_std, dtype) ** 2, dtype)
        variances = variances.at[:3].set(jnp.asarray(position_std, dtype) ** 2)
        k, m = self.settings.window, self.num_aps
        return TrackState(
            mean=mean,
            cov=jnp.diag(variances),
            prior_mean=mean,
            prior_cov=jnp.diag(variances),
            recent_r=jnp.zeros((k, m), dtype),
            recent_age=jnp.zeros((k,), dtype),
            recent_valid=jnp.zeros((k,), bool),
            recent_nis=jnp.zeros((k,), dtype),
            nis_valid=jnp.zeros((k,), bool),
            pending=jnp.asarray(bool(acquire)),
            since_pending=jnp.asarray(0, jnp.int32),
            lost=jnp.asarray(False),
            reacquired=jnp.asarray(False),
            num_reacquisitions=jnp.asarray(0, jnp.int32),
            locked=jnp.asarray(False),
            failures=jnp.asarray(0, jnp.int32),
        )

    def position(self, state: TrackState) -> tuple[Array, Array]:
        """Position estimate (..., 3), m, and its covariance (..., 3, 3): the state's free
        position folded into the motion model's region (:mod:`~dmimo_jax.tracking.motion`)."""
        position, parity = self.motion.fold(state.mean[..., :3])
        cov = state.cov[..., :3, :3] * parity[..., :, None] * parity[..., None, :]
        return position, cov

    def update(self, state: TrackState, r: ArrayLike | None) -> TrackState:
        """Advance one UE by one interval: predict, then correct with snapshot ``r`` (M,)
        (``None``: no snapshot this interval), test the lock, re-acquire if needed.

        Pure; jit it (``jax.jit(Tracker.update)``) or use :func:`~dmimo_jax.tracking.run.run_tracker` for many UEs
        over time.
        """
        if r is None:
            r, valid = jnp.zeros((self.num_aps,), self.dt.dtype), jnp.asarray(False)
        else:
            check_snapshots(r, self.num_aps, "(M,)", 1)
            r, valid = jnp.asarray(r, self.dt.dtype), jnp.asarray(True)
        state = step(self, state, r, valid)
        return jax.lax.cond(
            needs_reacquisition(self, state), partial(reacquire, self), lambda s: s, state
        )


def check_snapshots(r: Any, num_aps: int, shape: str, ndim: int) -> None:
    if np.iscomplexobj(r):  # a dtype: known under tracing too
        raise ValueError(
            "r must be real wrapped phases (rad), got complex values (complex snapshots h "
            "are not phases: their real part would be read as one)"
        )
    if not is_concrete(r):
        return
    arr = np.asarray(r)
    if arr.ndim != ndim or arr.shape[-1] != num_aps:
        raise ValueError(f"r must have shape {shape} with M = {num_aps}, got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(
            "r must be finite, got NaN or inf entries; mark a missing snapshot with "
            "valid=False (or r=None for Tracker.update), not with NaN"
        )


def predict(tracker: Tracker, state: TrackState) -> TrackState:
    """The motion model's prediction over one interval, the snapshots aging by ``dt``."""
    mean, cov = tracker.motion.predict(state.mean, state.cov, tracker.dt)
    prior_mean, prior_cov = tracker.motion.predict(state.prior_mean, state.prior_cov, tracker.dt)
    std = jnp.sqrt(jnp.max(jnp.diagonal(cov)[:3]))
    return state._replace(
        mean=mean,
        cov=cov,
        prior_mean=jnp.where(state.pending, prior_mean, mean),
        prior_cov=jnp.where(state.pending, prior_cov, cov),
        recent_age=state.recent_age + tracker.dt,
        pending=state.pending | (std > tracker.settings.max_position_std),
    )


class Linearization(NamedTuple):
    """One linearization of the measurement update at an iterate (:func:`correct`)."""

    mean: Array
    """(M,) the model's phases at the iterate."""
    jacobian: Array
    """(M, 3) H, signed by the fold's parity."""
    variance: Array
    """(M,) sigma^2 (eq. 9)."""
    info: Array
    """(3, 3) H^T J(theta) H (eq. 14)."""
    gain: Array
    """(S, 3)."""
    cov: Array
    """(S, S) the posterior covariance."""


def linearize_update(tracker: Tracker, x: Array, parity: Array, cov: Array) -> Linearization:
    """The measurement model linearized at the folded iterate ``x`` (3,) and the Kalman
    update it gives for the predicted covariance ``cov`` (the Woodbury form, kalman.py)."""
    mu, h, var = linearize(x, tracker.model)
    h = h * parity[None, :]
    w = 1.0 / var
    jh = w[:, None] * h - w[:, None] * (w @ h)[None, :] / jnp.sum(w)
    info = h.T @ jh  # eq. (14)
    gain, new_cov = position_update(cov, info)
    return Linearization(mu, h, var, info, gain, new_cov)


def correct(
    tracker: Tracker, mean: Array, cov: Array, r: Array, axis_name: str | None = None
) -> tuple[Array, Array, Array, Array]:
    """(Iterated) EKF update of one predicted state with snapshot ``r`` (M,): the new mean
    and covariance, the normalized innovation squared (module docstring) and its prior
    term, the squared Mahalanobis length of the update (``chi^2_3`` under lock).

    Inside ``jax.vmap(..., axis_name=axis_name)`` the second trace of an iteration runs
    only if some UE of the batch needs it (``chord_below``); each UE's answer is the same
    as alone.
    """
    x_pred = mean[:3]
    x_prev, x_i, new_mean = x_pred, x_pred, mean
    for k in range(tracker.settings.num_iterations):
        # the state is the free path; the phases see its fold into the region
        x_in, parity = tracker.motion.fold(x_i)
        if k == 0:
            lin = linearize_update(tracker, x_in, parity, cov)
        elif not tracker.settings.relinearize:  # a chord step
            lin = lin._replace(mean=tracker.model.mean(x_in))
        else:
            lin = _next_linearization(tracker, lin, x_in, parity, cov, x_i - x_prev, axis_name)
        var = lin.variance
        w = 1.0 / var
        eps = compressed_residuals(r, lin.mean, var)
        z = eps + lin.jacobian @ (x_i - x_pred)
        jz = w * z - w * (w @ z) / jnp.sum(w)  # J(theta) z, eq. (13b)
        g = lin.jacobian.T @ jz
        new_mean = mean + lin.gain @ g
        x_prev, x_i = x_i, new_mean[:3]
    info, new_cov = lin.info, lin.cov
    # the NIS as the MAP objective at the updated state (equal to z^T S^-1 z for a linear
    # model, and free of the linearization's error): the data term with the residuals
    # there, plus the prior's, ds^T P^-1 ds with ds = P S^T (I + J A)^-1 g
    eps = compressed_residuals(r, phases_at_update(tracker, lin, x_i, x_i - x_prev, axis_name), var)
    data = jnp.sum(w * eps**2) - (w @ eps) ** 2 / jnp.sum(w)
    a = cov[:3, :3]
    cg = jnp.linalg.solve(jnp.eye(3, dtype=a.dtype) + info @ a, g)
    jump = cg @ a @ cg
    return new_mean, new_cov, data + jump, jump


def any_in_batch(flag: Array, axis_name: str | None) -> Array:
    """``flag`` () for one UE; inside ``jax.vmap(..., axis_name=axis_name)`` whether any UE's
    is set, an unbatched value, so that a ``lax.cond`` on it stays a branch (a batched
    predicate would run both branches for every UE)."""
    return flag if axis_name is None else jax.lax.psum(flag.astype(jnp.int32), axis_name) > 0


def _next_linearization(
    tracker: Tracker,
    lin: Linearization,
    x: Array,
    parity: Array,
    cov: Array,
    moved: Array,
    axis_name: str | None,
) -> Linearization:
    """Re-linearize at ``x`` if the last step ``moved`` (3,) was ``chord_below`` or longer,
    else a chord step (``lin`` with the phases at ``x``)."""
    long = moved @ moved >= tracker.settings.chord_below**2
    # a named batch re-linearizes if any UE needs it (selecting per UE), else chords for all
    any_long = any_in_batch(long, axis_name)

    def relinearized() -> Linearization:
        new = linearize_update(tracker, x, parity, cov)
        chord = lin._replace(mean=new.mean)  # the phases at x are the same in both
        return jax.tree.map(lambda a, b: jnp.where(long, a, b), new, chord)

    return jax.lax.cond(any_long, relinearized, lambda: lin._replace(mean=tracker.model.mean(x)))


def phases_at_update(
    tracker: Tracker,
    lin: Linearization,
    x: Array,
    moved: Array,
    axis_name: str | None = None,
) -> Array:
    """The model's phases at the updated free position ``x``: exact where the last step
    ``moved`` (3,) was ``chord_below / 1000`` or longer, else the last iteration's phases
    moved along the Jacobian (off by the curvature, :math:`\\sim\\pi\\delta^2/(\\lambda d)`, and
    by the chord's Jacobian error, :math:`\\sim 2\\pi\\delta\\,\\Delta/(\\lambda d)` for a
    first step :math:`\\Delta`: below 1e-6 rad for steps under 3.3 um and 3.3 mm). As
    :func:`_next_linearization`, the exact phases are computed for a named batch only if
    some UE needs them."""
    linear = lin.mean + lin.jacobian @ moved
    long = moved @ moved >= (tracker.settings.chord_below / 1000) ** 2
    any_long = any_in_batch(long, axis_name)

    def exact() -> Array:
        return jnp.where(long, tracker.model.mean(tracker.motion.fold(x)[0]), linear)

    return jax.lax.cond(any_long, exact, lambda: linear)


def step(
    tracker: Tracker, state: TrackState, r: Array, valid: Array, axis_name: str | None = None
) -> TrackState:
    """Predict, correct (if ``valid``), push the snapshot and test the lock; no
    re-acquisition (:func:`~dmimo_jax.tracking.reacquire.needs_reacquisition` says whether one is due). ``axis_name``:
    the name of a ``jax.vmap`` over UEs (:func:`correct`)."""
    state = predict(tracker, state)
    mean, cov, nis, jump = correct(tracker, state.mean, state.cov, r, axis_name)
    # a validation gate: a snapshot the prior cannot explain (a track on a wrong maximum,
    # an outlier), or one explained only by a jump the prior rules out (to a neighbouring
    # maximum: the jump would go into the velocity) is not applied; the lock test counts
    # it, and a jump of maximum is the re-acquisition's to make
    accept = valid & (nis <= tracker.nis_gate) & (jump <= tracker.jump_gate)
    mean = jnp.where(accept, mean, state.mean)
    cov = jnp.where(accept, cov, state.cov)
    # the lock test restarts after a re-acquisition (not while one is pending)
    use = valid & ~state.pending
    nis = jnp.where(use, nis, 0.0)

    def push(buffer: Array, value: Any) -> Array:
        return jnp.concatenate([buffer[1:], jnp.asarray(value, buffer.dtype)[None]], axis=0)

    nis_valid = push(state.nis_valid, use)
    recent_nis = push(state.recent_nis, nis)
    full = jnp.sum(nis_valid) == tracker.settings.window
    lost = use & full & (jnp.sum(jnp.where(nis_valid, recent_nis, 0.0)) > tracker.nis_threshold)
    locked = ~state.pending & ~lost & jnp.where(use, full, state.locked & ~valid)
    return state._replace(
        mean=mean,
        cov=cov,
        recent_r=push(state.recent_r, r),
        recent_age=push(state.recent_age, 0.0),
        recent_valid=push(state.recent_valid, valid),
        recent_nis=recent_nis,
        nis_valid=nis_valid,
        since_pending=jnp.where(state.pending, state.since_pending + valid, 0),
        lost=lost,
        reacquired=jnp.asarray(False),
        # confirmed by a full window that passes; an outage keeps it while the prior holds
        locked=locked,
        failures=jnp.where(locked, 0, state.failures),
    )
