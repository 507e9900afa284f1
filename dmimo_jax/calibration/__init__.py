"""Calibration of the physical model from L labeled snapshots (beyond the paper).

* :mod:`~dmimo_jax.calibration.calibrating`: :func:`calibrate`, maximum likelihood of any
  group of the model's unknowns (AP phase centres, per-AP phase offsets, surfaces'
  permittivities, the antenna exponent, the polarization), with honest standard errors and
  the fit's reduced chi-square.
  :func:`calibrate_many`: N deployments of the same shapes at once (each LM stage one
  vmapped program), each calibration as its own :func:`calibrate` call would give it.
* :mod:`~dmimo_jax.calibration.groups`: what :func:`calibrate` fits, one class per group of
  unknowns (:class:`FitGroup`: :class:`Positions`, :class:`Offsets`, :class:`Surfaces`,
  :class:`Antenna`, :class:`Polarization`, :class:`ReceiverGains`,
  :class:`ReceiverConstants`), each the request with its options
  (``fit=(Positions(prior=0.01), Offsets(), Surfaces(names=...))``; the strings
  ``"ap_positions"``, ... are their shorthands) and, built on a deployment, the parameter
  block the solver runs on. A new kind of unknown is one new subclass.
* :mod:`~dmimo_jax.calibration.staging`: how a fit is staged (the closed-form starts, the
  multi-start, the joint rounds, the extra round of a scene of faces), each group saying
  where it enters; :mod:`~dmimo_jax.calibration.closed_form`: the starts that need no basin
  (:func:`offsets_closed_form`, :func:`receivers_closed_form`);
  :mod:`~dmimo_jax.calibration.solver`: the fitting core (Levenberg-Marquardt rounds on a
  :class:`Deployment`, the information, the standard errors).
* :mod:`~dmimo_jax.calibration.surfaces`: the surfaces alone (:func:`fit_material` for the
  ground of the two-ray model, :func:`fit_surfaces` for a room) and the numpyro NUTS
  posterior of the ground's permittivity (:func:`material_posterior`).
* :mod:`~dmimo_jax.calibration.measured`: the recipe for measured complex snapshots
  (:func:`calibrate_receivers`: model B's receivers and phase centres, each receiver with its
  own variance, each labeled spot counted once, :func:`spot_counts`).
* :mod:`~dmimo_jax.calibration.residual`: what the calibrated physics still misses, a GP per
  AP on the residual phasors (:func:`fit_residual_field`), for measured data.
* :mod:`~dmimo_jax.calibration.self_training`: that field relearned from unlabeled snapshots
  in time order, pseudo-labels confirmed by their neighbours (:func:`self_train_field`).
"""

from dmimo_jax.calibration.calibrating import calibrate_many
from dmimo_jax.calibration.closed_form import (
    check_calibratable,
    offsets_closed_form,
    receivers_closed_form,
)
from dmimo_jax.calibration.groups import (
    FIT_GROUPS,
    GROUPS,
    Antenna,
    Deployment,
    FitGroup,
    Offsets,
    Polarization,
    Positions,
    ReceiverConstants,
    ReceiverGains,
    Surfaces,
    as_fit_groups,
)
from dmimo_jax.calibration.measured import (
    PHASE_CENTRE_PRIOR,
    SPOT_RADIUS,
    ReceiverCalibration,
    calibrate_receivers,
    spot_counts,
)
from dmimo_jax.calibration.parametrization import (
    CALIBRATION_STARTS,
    MIN_EXPONENT_START,
    permittivity_starts,
    with_permittivities,
)
from dmimo_jax.calibration.residual import (
    ResidualFieldModel,
    fit_residual_field,
    residual_phasors,
)
from dmimo_jax.calibration.self_training import (
    SelfTraining,
    confirmed_by_neighbours,
    self_train_field,
)
from dmimo_jax.calibration.solver import CONVERGENCE_TOLERANCE, UNLABELED_STEPS
from dmimo_jax.calibration.staging import BOUNDARY_OUTLIER_Z
from dmimo_jax.calibration.status import chi2_band, error_scale, fit_status
from dmimo_jax.calibration.surfaces import (
    MaterialFit,
    MaterialPosterior,
    fit_material,
    fit_surfaces,
    log_likelihood,
    material_posterior,
)
from dmimo_jax.calibration.unlabeled import Unlabeled

# isort: split
# At the top of the package (their home is `dmimo_jax`, e.g. `dj.Calibration`): kept here so the
# older paths keep working; they are not in this module's __all__.
from dmimo_jax.calibration.calibrating import Calibration, calibrate  # noqa: F401

__all__ = [
    "BOUNDARY_OUTLIER_Z",
    "CALIBRATION_STARTS",
    "CONVERGENCE_TOLERANCE",
    "GROUPS",
    "MIN_EXPONENT_START",
    "UNLABELED_STEPS",
    "Unlabeled",
    "calibrate_many",
    "check_calibratable",
    "FIT_GROUPS",
    "FitGroup",
    "Positions",
    "Offsets",
    "Surfaces",
    "Antenna",
    "Polarization",
    "ReceiverGains",
    "ReceiverConstants",
    "as_fit_groups",
    "Deployment",
    "permittivity_starts",
    "MaterialFit",
    "PHASE_CENTRE_PRIOR",
    "SPOT_RADIUS",
    "ReceiverCalibration",
    "calibrate_receivers",
    "spot_counts",
    "ResidualFieldModel",
    "fit_residual_field",
    "residual_phasors",
    "SelfTraining",
    "confirmed_by_neighbours",
    "self_train_field",
    "MaterialPosterior",
    "chi2_band",
    "error_scale",
    "fit_status",
    "fit_material",
    "fit_surfaces",
    "log_likelihood",
    "material_posterior",
    "offsets_closed_form",
    "receivers_closed_form",
    "with_permittivities",
]
