"""Real measurements (beyond the paper): loaders that return the package's conventions.

* :mod:`~dmimo_jax.datasets.techtile`: the Techtile ELLIIIT carrier-phase measurements
  (42 ceiling antennas, 920 MHz, motion-capture truth): :func:`load_techtile`, a
  :class:`~dmimo_jax.scene.Scene` and a nominal room from its files.

* :mod:`~dmimo_jax.datasets.worlds`: synthetic deployments, the paper's APs as they would
  really be (:func:`synthetic_deployment`), the benchmark worlds of the calibration, and the
  halls of the paper's AP density at any size (:func:`hall_scene`, locality's worlds).

The data are never shipped with the package: every loader takes a folder.
"""

from dmimo_jax.datasets.meshes import load_mitsuba, load_obj, read_obj, read_ply
from dmimo_jax.datasets.polygons import (
    convex_polygons,
    faces_from_mesh,
    orient_polygons,
    scene_faces,
    winding_numbers,
)
from dmimo_jax.datasets.techtile import (
    TECHTILE_FREQUENCY_HZ,
    TechtileExperiment,
    list_experiments,
    load_techtile,
    techtile_room_model,
    techtile_scene,
)
from dmimo_jax.datasets.worlds import (
    FACE_MATERIALS,
    PAPER_DENSITY,
    ROOM_MATERIALS,
    ROOM_WALLS,
    SyntheticDeployment,
    face_scene,
    hall_scene,
    sample_world_positions,
)

# isort: split
# At the top of the package (their home is `dmimo_jax`, e.g. `dj.synthetic_deployment`): kept here so the
# older paths keep working; they are not in this module's __all__.
from dmimo_jax.datasets.worlds import synthetic_deployment  # noqa: F401

__all__ = [
    "convex_polygons",
    "faces_from_mesh",
    "load_mitsuba",
    "load_obj",
    "orient_polygons",
    "winding_numbers",
    "scene_faces",
    "read_obj",
    "read_ply",
    "FACE_MATERIALS",
    "face_scene",
    "hall_scene",
    "PAPER_DENSITY",
    "sample_world_positions",
    "ROOM_MATERIALS",
    "ROOM_WALLS",
    "SyntheticDeployment",
    "TECHTILE_FREQUENCY_HZ",
    "TechtileExperiment",
    "list_experiments",
    "load_techtile",
    "techtile_room_model",
    "techtile_scene",
]
