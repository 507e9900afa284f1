"""Propagation models behind one :class:`PhaseModel` protocol.

* :mod:`~dmimo_jax.physics.model`: the protocol and :func:`as_phase_model`;
* :mod:`~dmimo_jax.physics.fresnel`: the Fresnel reflection coefficient, eq. (3);
* :mod:`~dmimo_jax.physics.two_ray`: the paper's LoS + ground model, eqs. (1)-(9);
* :mod:`~dmimo_jax.physics.image_source`: reflectors and their image paths, and
  :mod:`~dmimo_jax.physics.rooms`: box rooms with a ceiling and walls (beyond the paper);
* :mod:`~dmimo_jax.physics.faces`, :mod:`~dmimo_jax.physics.occlusion` and
  :mod:`~dmimo_jax.physics.mesh_model`: scenes of finite faces with their own materials
  (the faces, which faces a path crosses, the mesh PhaseModel), shadows included (beyond the
  paper).
"""

from dmimo_jax.physics.fresnel import reflection_coefficient, surface_reflections, zeta_term
from dmimo_jax.physics.image_source import ImagePaths, image_paths, mirror
from dmimo_jax.physics.model import CalibratableModel, PhasorSumModel, check_in_domain
from dmimo_jax.physics.occlusion import MeshPaths, mesh_paths, occluders
from dmimo_jax.physics.rooms import resolve_material
from dmimo_jax.physics.two_ray import (
    Geometry,
    PathParameters,
    departure_directions,
    effective_amplitude,
    effective_phase,
    effective_phasor,
    geometry,
    noise_var_from_amplitude,
    path_gains,
    path_parameters,
    phase_noise_var,
    phase_perturbation,
    relative_reflection,
    safe_norm,
    unwrapped_phase,
)

# isort: split
# At the top of the package (their home is `dmimo_jax`, e.g. `dj.Face`): kept here so the
# older paths keep working; they are not in this module's __all__.
from dmimo_jax.physics.faces import Face, box_faces, cuboid_faces  # noqa: F401
from dmimo_jax.physics.image_source import ImageSourceModel, Reflector  # noqa: F401
from dmimo_jax.physics.mesh_model import MeshModel  # noqa: F401
from dmimo_jax.physics.model import PhaseModel, as_phase_model  # noqa: F401
from dmimo_jax.physics.rooms import box_room, room_model  # noqa: F401
from dmimo_jax.physics.two_ray import TwoRayModel  # noqa: F401

__all__ = [
    "CalibratableModel",
    "MeshPaths",
    "mesh_paths",
    "occluders",
    "mirror",
    "resolve_material",
    "surface_reflections",
    "Geometry",
    "ImagePaths",
    "image_paths",
    "PathParameters",
    "PhasorSumModel",
    "check_in_domain",
    "departure_directions",
    "effective_amplitude",
    "effective_phase",
    "effective_phasor",
    "geometry",
    "noise_var_from_amplitude",
    "path_gains",
    "path_parameters",
    "phase_noise_var",
    "phase_perturbation",
    "reflection_coefficient",
    "relative_reflection",
    "safe_norm",
    "unwrapped_phase",
    "zeta_term",
]
