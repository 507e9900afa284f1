"""Box rooms as reflectors (beyond the paper): a material given by name, value or
``"metal"`` (:func:`resolve_material`), the six planes of a box (:func:`box_room`) and the
scene's own room as an :class:`~dmimo_jax.physics.ImageSourceModel` (:func:`room_model`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from dmimo_jax._checks import check_permittivity
from dmimo_jax.materials import is_perfect_conductor, relative_permittivity
from dmimo_jax.physics.image_source import ImageSourceModel, Reflector
from dmimo_jax.scene import Scene

MaterialSpec = complex | float | str | None


def resolve_material(spec: Any, where: str, frequency_hz: float | None, convention: str = "itu"):
    """``(eps_r, perfect_conductor)`` of a material spec (a complex permittivity, an ITU-R
    P.2040 name evaluated at ``frequency_hz``, ``"metal"`` a perfect conductor), or ``None``
    for ``None`` (the surface is left out). ``where`` names the argument in errors.

    Raises:
        ValueError: a name without a frequency, an unknown name, or a permittivity that is
            not a passive medium.
    """
    if spec is None:
        return None
    if isinstance(spec, str):
        if frequency_hz is None:
            raise ValueError(
                f"{where}={spec!r} is a material name: pass frequency_hz to evaluate ITU-R P.2040"
            )
        try:
            if is_perfect_conductor(spec):
                return 1.0 + 0.0j, True
            return relative_permittivity(spec, frequency_hz, convention=convention), False
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
    numeric = not isinstance(spec, bool) and np.shape(spec) == ()
    if numeric:
        numeric = jnp.issubdtype(jnp.result_type(spec), jnp.number)
    if not numeric:
        raise ValueError(
            f"{where} must be a complex permittivity, an ITU-R material name or None, got {spec!r}"
        )
    check_permittivity(where, spec)  # concrete values only: a traced eps_r passes through
    return spec, False


WALLS = ("x0", "x1", "y0", "y1")
"""The four walls of :func:`box_room`: the planes x = 0, x = W, y = 0, y = D."""


def box_room(
    size: ArrayLike,
    *,
    floor: MaterialSpec,
    ceiling: MaterialSpec = None,
    walls: MaterialSpec | Mapping[str, MaterialSpec] = None,
    frequency_hz: float | None = None,
    convention: str = "itu",
    dtype: Any = None,
) -> tuple[Reflector, ...]:
    r"""The reflectors of the box room :math:`[0,W]\times[0,D]\times[0,H]`.

    Each surface is a complex :math:`\varepsilon_r`, an ITU-R P.2040 material name (``"metal"``
    is a perfect conductor) or ``None`` to leave it out.

    Args:
        size: (W, D, H) in metres, each > 0.
        floor: the plane z = 0 (normal +z).
        ceiling: the plane z = H (normal -z).
        walls: one spec for all four walls, or a mapping from ``"x0"``, ``"x1"``, ``"y0"``,
            ``"y1"`` (the planes x = 0, x = W, y = 0, y = D) to specs; missing keys are absent.
        frequency_hz: carrier frequency, needed when a material is given by name.
        convention: ``"itu"`` (correct, default) or ``"paper"`` (see :mod:`dmimo_jax.materials`).
        dtype: float dtype of the leaves.

    Returns:
        A tuple of :class:`Reflector` named ``"floor"``, ``"ceiling"``, ``"wall_x0"``, ...

    Examples:
        >>> room = box_room((10, 10, 4), floor=5.24 - 0.87j, ceiling="plasterboard",
        ...                 walls="concrete", frequency_hz=800e6)
        >>> [r.name for r in room]
        ['floor', 'ceiling', 'wall_x0', 'wall_x1', 'wall_y0', 'wall_y1']
    """
    if np.shape(size) != (3,):
        raise ValueError(f"size must have shape (3,) (W, D, H in metres), got {np.shape(size)}")
    w, d, h = (float(s) for s in np.asarray(size, float))
    if not all(np.isfinite(s) and s > 0 for s in (w, d, h)):
        raise ValueError(f"size must be positive and finite (metres), got {(w, d, h)}")
    if isinstance(walls, Mapping):
        unknown = set(walls) - set(WALLS)
        if unknown:
            raise ValueError(f"walls keys must be among {WALLS}, got {sorted(unknown)}")
        wall_specs = {k: walls.get(k) for k in WALLS}
    else:
        wall_specs = dict.fromkeys(WALLS, walls)
    planes = [
        ("floor", floor, (0.0, 0.0, 0.0), (0.0, 0.0, 1.0)),
        ("ceiling", ceiling, (0.0, 0.0, h), (0.0, 0.0, -1.0)),
        ("wall_x0", wall_specs["x0"], (0.0, 0.0, 0.0), (1.0, 0.0, 0.0)),
        ("wall_x1", wall_specs["x1"], (w, 0.0, 0.0), (-1.0, 0.0, 0.0)),
        ("wall_y0", wall_specs["y0"], (0.0, 0.0, 0.0), (0.0, 1.0, 0.0)),
        ("wall_y1", wall_specs["y1"], (0.0, d, 0.0), (0.0, -1.0, 0.0)),
    ]
    out = []
    for name, spec, point, normal in planes:
        mat = resolve_material(
            spec, name if name in ("floor", "ceiling") else "walls", frequency_hz, convention
        )
        if mat is not None:
            eps, pec = mat
            out.append(Reflector(point, normal, eps, perfect_conductor=pec, name=name, dtype=dtype))
    return tuple(out)


def room_model(
    scene: Scene,
    *,
    ceiling: MaterialSpec = None,
    walls: MaterialSpec | Mapping[str, MaterialSpec] = None,
    floor: MaterialSpec | str = "scene",
    order: int = 1,
    convention: str = "itu",
) -> ImageSourceModel:
    """The scene's box room (``scene.room_size``) as an :class:`ImageSourceModel`.

    ``floor="scene"`` keeps the scene's ground (its ``eps_r`` or perfect conductor), so
    ``room_model(scene)`` is the two-ray model; ``ceiling`` and ``walls`` are as in
    :func:`box_room`, with material names evaluated at the scene's carrier frequency.
    """
    if not isinstance(scene, Scene):
        raise ValueError(f"scene must be a Scene, got {type(scene).__name__}")
    ground: MaterialSpec
    if isinstance(floor, str) and floor == "scene":
        ground = "metal" if scene.perfect_conductor else complex(scene.eps_r)
    else:
        ground = floor
    reflectors = box_room(
        np.asarray(scene.room_size),
        floor=ground,
        ceiling=ceiling,
        walls=walls,
        frequency_hz=float(scene.frequency),
        convention=convention,
        dtype=scene.ap_positions.dtype,
    )
    return ImageSourceModel(scene, reflectors, order)
