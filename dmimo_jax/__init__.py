"""dmimo_jax: differentiable carrier-phase-only positioning in distributed MIMO (POPT).

Physics, bounds and estimation expect float64: enable it in your entry point with
``jax.config.update("jax_enable_x64", True)``; importing dmimo_jax never changes it.

The top level holds the nouns a user composes: the scene and its propagation models
(``dj.Scene``, ``dj.paper_scene``, ``dj.ImageSourceModel``, ``dj.MeshModel``, ...), measurement
(``dj.simulate_phases``), the bound (``dj.peb``), the searches (``dj.egs``, ``dj.refine``,
``dj.coarse_to_fine``), and, imported on first access with their heavier dependencies (Flax,
orbax), ``dj.calibrate``, ``dj.Calibration``, ``dj.run_offline``, ``dj.Locator``,
``dj.Tracker``, ``dj.Receivers``, ``dj.synthetic_deployment``. Everything else lives in its
module (``dj.bounds.efim_schur``, ``dj.physics.phase_noise_var``); each public name is listed
in exactly one ``__all__``.
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
    peb,
    peb_map,
    position_fim,
)
from dmimo_jax.deployments import deployment_scene, load_scene, paper_scene
from dmimo_jax.estimators import (
    coarse_to_fine,
    egs,
    make_grid,
    refine,
    refine_batch,
    refine_multistart,
    window_search,
)
from dmimo_jax.materials import ITU_MATERIALS, relative_permittivity
from dmimo_jax.measure import (
    random_cpos,
    simulate_phases,
    simulate_phases_batch,
)
from dmimo_jax.phase import angle_diff, wrap
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
    room_model,
)
from dmimo_jax.scene import (
    Scene,
    perturb_deployment,
    sample_ap_positions,
    sample_positions,
)

__version__ = "0.2.0"  # the one place (pyproject.toml reads it; CHANGELOG.md)

_LAZY = (
    "learning",
    "pipeline",
    "complexity",
    "calibration",
    "design",
    "tracking",
    "datasets",
    "receivers",
    "tiles",
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
    "coarse_to_fine",
    "complexity",
    "egs",
    "estimators",
    "gp",
    "learning",
    "make_grid",
    "metrics",
    "pipeline",
    "refine",
    "refine_batch",
    "refine_multistart",
    "window_search",
    "materials",
    "measure",
    "paper_scene",
    "deployment_scene",
    "load_scene",
    "perturb_deployment",
    "peb",
    "peb_map",
    "phase",
    "physics",
    "position_fim",
    "random_cpos",
    "relative_permittivity",
    "sample_ap_positions",
    "sample_positions",
    "scene",
    "simulate_phases",
    "simulate_phases_batch",
    "tracking",
    "wrap",
]
