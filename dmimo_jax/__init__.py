"""dmimo_jax: differentiable carrier-phase-only positioning in distributed MIMO (POPT).

Physics, bounds and estimation expect float64: enable it in your entry point with
``jax.config.update("jax_enable_x64", True)``; importing dmimo_jax never changes it.

Each layer's main entry points are here (``dj.egs``, ``dj.refine``, ``dj.coarse_to_fine``,
``dj.peb``, ...), and its module too (``dj.gp``, ``dj.estimators``). ``dj.learning`` and
``dj.pipeline`` (Flax, orbax) are imported on first access, and so are the nouns a user
composes from them: ``dj.calibrate``, ``dj.Calibration``, ``dj.run_offline``, ``dj.Locator``,
``dj.Tracker``, ``dj.Receivers``, ``dj.synthetic_deployment``.
"""

import importlib
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from dmimo_jax import (
    antenna,
    bounds,
    estimators,
    gp,
    likelihood,
    materials,
    measure,
    metrics,
    phase,
    physics,
    scene,
)
from dmimo_jax.antenna import CosinePattern, DipolePattern, IsotropicPattern
from dmimo_jax.bounds import (
    channel_fim,
    efim,
    efim_from_variance,
    efim_schur,
    jacobian_analytic,
    peb,
    peb_map,
    phase_jacobian,
    position_fim,
)
from dmimo_jax.estimators import (
    coarse_to_fine,
    egs,
    make_grid,
    phasor_table,
    refine,
    refine_batch,
    refine_multistart,
    search_grid,
    window_search,
)
from dmimo_jax.likelihood import ls_cost, ml_cost
from dmimo_jax.materials import ITU_MATERIALS, relative_permittivity
from dmimo_jax.measure import (
    phases_from_signal,
    random_cpos,
    received_signal,
    simulate_phases,
    simulate_phases_batch,
    simulate_phases_exact,
    simulate_phases_exact_batch,
)
from dmimo_jax.phase import angle_diff, circular_mean, wrap
from dmimo_jax.physics import (
    Face,
    ImageSourceModel,
    MeshModel,
    PhaseModel,
    Reflector,
    TwoRayModel,
    as_phase_model,
    box_faces,
    box_room,
    cuboid_faces,
    effective_amplitude,
    effective_phase,
    effective_phasor,
    path_parameters,
    phase_noise_var,
    phase_perturbation,
    reflection_coefficient,
    room_model,
    unwrapped_phase,
)
from dmimo_jax.scene import (
    Scene,
    dbm_to_watt,
    paper_scene,
    perturb_deployment,
    sample_ap_positions,
    sample_positions,
    thermal_noise_power,
    watt_to_dbm,
)

__version__ = "0.1.0"

_LAZY = (
    "learning",
    "pipeline",
    "complexity",
    "calibration",
    "design",
    "tracking",
    "datasets",
    "receivers",
)  # heavier imports, loaded on first access


if TYPE_CHECKING:  # what type checkers and the API reference see of the lazy names below
    from dmimo_jax.calibration import Calibration, calibrate
    from dmimo_jax.datasets import synthetic_deployment
    from dmimo_jax.pipeline import Locator, run_offline
    from dmimo_jax.receivers import Receivers
    from dmimo_jax.tracking import Tracker

_LAZY_NAMES = MappingProxyType(
    {
        "calibrate": "calibration",
        "Calibration": "calibration",
        "run_offline": "pipeline",
        "Locator": "pipeline",
        "Tracker": "tracking",
        "Receivers": "receivers",
        "synthetic_deployment": "datasets",
    }
)
"""The nouns a user composes, at the top (``dj.calibrate``, ``dj.run_offline``, ``dj.Locator``,
...): each lives in its module and is imported from it on first access."""


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return importlib.import_module(f"dmimo_jax.{name}")
    if name in _LAZY_NAMES:
        return getattr(importlib.import_module(f"dmimo_jax.{_LAZY_NAMES[name]}"), name)
    raise AttributeError(f"module 'dmimo_jax' has no attribute {name!r}")


__all__ = [
    "likelihood",
    "Calibration",
    "Locator",
    "Receivers",
    "Tracker",
    "calibrate",
    "run_offline",
    "synthetic_deployment",
    "CosinePattern",
    "DipolePattern",
    "IsotropicPattern",
    "antenna",
    "ITU_MATERIALS",
    "Face",
    "ImageSourceModel",
    "MeshModel",
    "PhaseModel",
    "Reflector",
    "box_faces",
    "box_room",
    "cuboid_faces",
    "room_model",
    "Scene",
    "TwoRayModel",
    "angle_diff",
    "as_phase_model",
    "bounds",
    "calibration",
    "channel_fim",
    "coarse_to_fine",
    "complexity",
    "egs",
    "estimators",
    "gp",
    "learning",
    "ls_cost",
    "make_grid",
    "ml_cost",
    "metrics",
    "phasor_table",
    "pipeline",
    "refine",
    "refine_batch",
    "refine_multistart",
    "search_grid",
    "window_search",
    "circular_mean",
    "dbm_to_watt",
    "effective_amplitude",
    "effective_phase",
    "effective_phasor",
    "efim",
    "efim_from_variance",
    "efim_schur",
    "jacobian_analytic",
    "materials",
    "measure",
    "paper_scene",
    "path_parameters",
    "perturb_deployment",
    "peb",
    "peb_map",
    "phase",
    "phase_jacobian",
    "phase_noise_var",
    "phase_perturbation",
    "phases_from_signal",
    "physics",
    "position_fim",
    "random_cpos",
    "received_signal",
    "reflection_coefficient",
    "relative_permittivity",
    "sample_ap_positions",
    "sample_positions",
    "scene",
    "simulate_phases",
    "simulate_phases_batch",
    "simulate_phases_exact",
    "simulate_phases_exact_batch",
    "thermal_noise_power",
    "tracking",
    "unwrapped_phase",
    "watt_to_dbm",
    "wrap",
]
