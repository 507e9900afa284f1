"""Synthetic deployments: the paper's APs as they would really be (the benchmark worlds).

A world is a truth (the model that makes the data, hidden from the methods), the deployment
as surveyed, and the nominal model a user writes down from the survey. The calibration's
benchmarks (``benchmarks/calibration_robustness.py``) draw many of them: same arguments,
same world.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import numpy as np

from dmimo_jax._checks import check_int
from dmimo_jax.antenna import CosinePattern
from dmimo_jax.physics import TwoRayModel, room_model
from dmimo_jax.scene import Scene, paper_scene, perturb_deployment

__all__ = [
    "ROOM_MATERIALS",
    "ROOM_WALLS",
    "SyntheticDeployment",
    "synthetic_deployment",
]


class SyntheticDeployment(NamedTuple):
    """Output of :func:`synthetic_deployment`."""

    truth: Any  # the world as it is (hidden from the methods)
    surveyed: Scene  # the deployment as surveyed: nominal positions, no offsets
    nominal: Any  # the model a user writes down from the survey (ITU guesses)


ROOM_WALLS = MappingProxyType({"x0": "brick", "x1": "wood", "y0": "glass", "y1": "concrete"})
"""The walls of :func:`synthetic_deployment`'s fixed room (ITU-R P.2040 names)."""

ROOM_MATERIALS = (
    "concrete",
    "brick",
    "plasterboard",
    "wood",
    "glass",
    "ceiling_board",
    "chipboard",
    "plywood",
    "marble",
    "floorboard",
)
"""The ITU-R P.2040 building materials ``random_materials=True`` draws surfaces from."""


def _random_room(key: Any) -> dict[str, Any]:
    names = np.asarray(ROOM_MATERIALS)
    pick = np.asarray(jax.random.randint(key, (6,), 0, len(names)))
    walls = {w: str(names[i]) for w, i in zip(("x0", "x1", "y0", "y1"), pick[2:], strict=True)}
    return {"floor": str(names[pick[0]]), "ceiling": str(names[pick[1]]), "walls": walls}


def synthetic_deployment(
    power_dbm: float = -10.0,
    *,
    seed: int = 0,
    world: str = "room",
    patch: bool = False,
    true_exponent: float = 1.7,
    believed_exponent: float = 1.0,
    position_std: float | None = None,
    random_materials: bool = False,
) -> SyntheticDeployment:
    """The paper's deployment as it would really be.

    The paper's 17 APs (:func:`~dmimo_jax.paper_scene`, concrete ground, ITU convention) with
    per-AP phase offsets uniform on [-pi, pi) and

    * ``world="room"``: APs mounted on the ceiling, phase centres off by N(0, sigma^2)
      laterally (``position_std``, default 5 mm); the room's floor concrete, ceiling
      plasterboard and walls :data:`ROOM_WALLS`, or with ``random_materials`` each of the six
      surfaces drawn from :data:`ROOM_MATERIALS` (uniformly, independently). The nominal
      model guesses every surface concrete.
    * ``world="two-ray"``: free-standing APs off by N(0, sigma^2) in 3-D (``position_std``,
      default 1 cm), the two-ray channel. The nominal model is the surveyed two-ray model.

    With ``patch``, the APs are downward patches (:class:`~dmimo_jax.CosinePattern`) of
    exponent ``true_exponent`` that the survey believes to be ``believed_exponent``.
    Same arguments, same world (the materials' draw uses its own key, so a world with and
    without ``random_materials`` has the same APs).

    Raises:
        ValueError: an unknown ``world``, a non-integer ``seed``, a negative or non-finite
            ``position_std``, ``random_materials`` for the two-ray world.
    """
    if world not in ("room", "two-ray"):
        raise ValueError(f"world must be 'room' or 'two-ray', got {world!r}")
    check_int("seed", seed)
    if random_materials and world != "room":
        raise ValueError("random_materials draws a room's surfaces: use world='room'")
    surveyed = paper_scene(power_dbm, "concrete", convention="itu")
    if patch:
        surveyed = surveyed.replace(antenna=CosinePattern(believed_exponent))
    key = jax.random.key(seed + 1000)
    if position_std is None:
        position_std = 1e-2 if world == "two-ray" else 5e-3
    if world == "two-ray":
        real = perturb_deployment(key, surveyed, position_std=position_std)
    else:
        real = perturb_deployment(key, surveyed, position_std=position_std, axes=(0, 1))
    if patch:
        real = real.replace(antenna=CosinePattern(true_exponent))
    if world == "two-ray":
        return SyntheticDeployment(TwoRayModel(real), surveyed, TwoRayModel(surveyed))
    room: Mapping[str, Any] = {"ceiling": "plasterboard", "walls": ROOM_WALLS, "floor": "concrete"}
    if random_materials:
        room = _random_room(jax.random.fold_in(key, 7))
    truth = room_model(real, **room)
    nominal = room_model(surveyed, ceiling="concrete", walls="concrete", floor="concrete")
    return SyntheticDeployment(truth, surveyed, nominal)
