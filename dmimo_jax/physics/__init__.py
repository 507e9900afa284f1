"""Propagation models behind one :class:`PhaseModel` protocol.

* :mod:`~dmimo_jax.physics.model`: the protocol and :func:`as_phase_model`;
* :mod:`~dmimo_jax.physics.fresnel`: the Fresnel reflection coefficient, eq. (3);
* :mod:`~dmimo_jax.physics.two_ray`: the paper's LoS + ground model, eqs. (1)-(9);
* :mod:`~dmimo_jax.physics.image_source`: rooms with a ceiling and walls (beyond the paper);
* :mod:`~dmimo_jax.physics.faces`: scenes of finite faces with their own materials, shadows
  included (beyond the paper).
"""

from dmimo_jax.physics.faces import (
    Face,
    MeshModel,
    MeshPaths,
    box_faces,
    cuboid_faces,
    mesh_paths,
    occluders,
)
from dmimo_jax.physics.fresnel import reflection_coefficient, surface_reflections, zeta_term
from dmimo_jax.physics.image_source import (
    ImagePaths,
    ImageSourceModel,
    Reflector,
    box_room,
    image_paths,
    mirror,
    resolve_material,
    room_model,
)
from dmimo_jax.physics.model import PhaseModel, PhasorSumModel, as_phase_model, check_in_domain
from dmimo_jax.physics.two_ray import (
    Geometry,
    PathParameters,
    TwoRayModel,
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

__all__ = [
    "Face",
    "MeshModel",
    "MeshPaths",
    "box_faces",
    "cuboid_faces",
    "mesh_paths",
    "occluders",
    "mirror",
    "resolve_material",
    "surface_reflections",
    "Geometry",
    "ImagePaths",
    "ImageSourceModel",
    "Reflector",
    "box_room",
    "image_paths",
    "room_model",
    "PathParameters",
    "PhaseModel",
    "PhasorSumModel",
    "TwoRayModel",
    "as_phase_model",
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
