r"""Calibrating real receivers from measured labeled snapshots: the recipe (beyond the paper).

:func:`~dmimo_jax.calibrate` fits model B of :mod:`dmimo_jax.receivers`
(:math:`h = s\,G\odot c(x) + b + w`) under the variances it is given. On measured data
(docs/real_data_measurements.md) two facts decide those variances:

* what the LoS model misses is a static field far stronger than the receivers' noise, and
  its share differs from receiver to receiver: each receiver gets its own variance
  :math:`\sigma_m^2`, measured by the fit itself (its share of the chi-square,
  ``Calibration.chi2_by_ap``);
* copies of one spot (a rover standing still, the same label drawn again) share that
  field's residual, so they are one observation, not many: each labeled snapshot's variance
  is multiplied by its :func:`spot_counts`, and a spot counts once however long the rover
  stood there.

:func:`calibrate_receivers` runs the fits in that order: the gains and constants at a
common unit variance; with ``phase_centres``, every group again at the common variance that
fit measured (its reduced chi-square), the antennas' 3-D phase centres within a Gaussian
prior of ``position_prior`` around the listed positions; then every group once more with
each receiver's own variance, started from the last fit (``position_start``, ``receivers``).
Its ``noise_var`` is the last fit's per-receiver variance, for
:func:`~dmimo_jax.receivers.whiten` (the weighted complex least-squares search).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from jax.typing import ArrayLike

from dmimo_jax._checks import check_positions, check_scalar
from dmimo_jax.calibration.calibrating import Calibration, calibrate
from dmimo_jax.calibration.groups import Positions
from dmimo_jax.physics import as_phase_model
from dmimo_jax.receivers import ReceiverModel

SPOT_RADIUS = 0.02
"""m: labeled snapshots closer than this (horizontally) are copies of one spot."""

PHASE_CENTRE_PRIOR = 0.10
"""m: the default survey prior on each phase-centre coordinate (10 cm)."""


class ReceiverCalibration(NamedTuple):
    """The result of :func:`calibrate_receivers`.

    Attributes:
        model: the calibrated :class:`~dmimo_jax.receivers.ReceiverModel` (the channel with
            the fitted phase centres, the fitted receivers).
        noise_var: (M,) each receiver's variance, in the snapshots' units squared (for
            :func:`~dmimo_jax.receivers.whiten`).
        calibration: the last :class:`~dmimo_jax.Calibration` (standard errors, goodness of
            fit, ``values``).
    """

    model: ReceiverModel
    noise_var: np.ndarray
    calibration: Calibration


def spot_counts(x: ArrayLike, radius: float = SPOT_RADIUS) -> np.ndarray:
    """(L,) how many of the positions ``x`` lie within ``radius`` (horizontally) of each, itself
    included: copies of one spot count together.

    Args:
        x: (L, 3) positions, m.
        radius: m, > 0.

    Raises:
        ValueError: ``x`` not (L, 3) finite, ``radius`` not positive.
    """
    check_positions("x", x, batched=True)
    check_scalar("radius", radius, positive=True)
    x = np.asarray(x, float)
    d = np.linalg.norm(x[:, None, :2] - x[None, :, :2], axis=-1)
    return np.sum(d < radius, axis=1)


def calibrate_receivers(
    model: Any,
    x: ArrayLike,
    h: ArrayLike,
    *,
    phase_centres: bool = True,
    position_prior: float = PHASE_CENTRE_PRIOR,
    spot_radius: float = SPOT_RADIUS,
) -> ReceiverCalibration:
    r"""Model B's receivers (and the phase centres) from measured complex labeled snapshots,
    each receiver with its own variance and each labeled spot counted once (module docstring).

    The intermediate fits do not warn (their variances are guesses the next fit corrects);
    the last one warns as :func:`~dmimo_jax.calibrate` does.

    Args:
        model: the channel's PhaseModel (e.g. ``ImageSourceModel(scene, [])``, the LoS with
            the listed antenna positions): the start, and the prior's centre.
        x: (L, 3) labeled positions, m.
        h: (L, M) their complex snapshots.
        phase_centres: fit the antennas' 3-D phase centres too.
        position_prior: m, > 0: the phase centres' prior standard deviation per coordinate.
        spot_radius: m, > 0: :func:`spot_counts`.

    Returns:
        A :class:`ReceiverCalibration`.

    Raises:
        ValueError: as :func:`~dmimo_jax.calibrate` (non-finite values, positions outside
            the model's domain), ``x`` not (L, 3), ``h`` not complex (L, M),
            ``position_prior`` or ``spot_radius`` not positive.
    """
    as_phase_model(model)  # a name or anything else without mean/variance: refused by name
    if not np.iscomplexobj(h):
        raise ValueError(
            f"h must be complex snapshots (L, M) (the CSI with its amplitudes), got "
            f"{np.asarray(h).dtype}"
        )
    check_positions("x", x, batched=True)
    shape = (np.shape(x)[0], model.num_aps)
    if np.shape(h) != shape:
        raise ValueError(f"h must have shape {shape} (L, M), got {np.shape(h)}")
    check_scalar("position_prior", position_prior, positive=True)
    check_scalar("spot_radius", spot_radius, positive=True)
    copies = spot_counts(x, spot_radius)[:, None]  # (L, 1): times (M,) variances, (L, M)
    groups = ("receiver_gains", "receiver_constants")

    def refit(var, cal, warn):  # every group, from the last fit's receivers and phase centres
        fit = groups
        if phase_centres:
            start = cal.values.get("ap_positions")
            fit = (Positions(prior=position_prior, start=start), *groups)
        return calibrate(model, x, h, var * copies, fit=fit, receivers=cal.receivers, warn=warn)

    var = np.ones(model.num_aps)
    cal = calibrate(model, x, h, var * copies, fit=groups[-2:], warn=False)
    if phase_centres:  # the phase centres at the common variance first
        var = var * float(cal.reduced_chi2)
        cal = refit(var, cal, warn=False)
    var = var * np.asarray(cal.chi2_by_ap)  # then each receiver's own
    cal = refit(var, cal, warn=True)
    var = var * np.asarray(cal.chi2_by_ap)
    return ReceiverCalibration(ReceiverModel(cal.model, cal.receivers), var, cal)
