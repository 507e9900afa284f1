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

from dmimo_jax._checks import check_int, check_scalar
from dmimo_jax.antenna import CosinePattern
from dmimo_jax.deployments import paper_scene
from dmimo_jax.physics import (
    Face,
    MeshModel,
    TwoRayModel,
    cuboid_faces,
    room_model,
)
from dmimo_jax.scene import Scene, perturb_deployment, sample_positions


class SyntheticDeployment(NamedTuple):
    """Output of :func:`synthetic_deployment`."""

    truth: Any
    """The world as it is (hidden from the methods)."""
    surveyed: Scene
    """The deployment as surveyed: nominal positions, no offsets."""
    nominal: Any
    """The model a user writes down from the survey (ITU guesses)."""


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


FACE_MATERIALS = MappingProxyType(
    {
        "floor_concrete": "concrete",
        "floor_wood": "floorboard",
        "ceiling": "plasterboard",
        "walls": "brick",
        "pillar": "concrete",
        "cabinet": "metal",
    }
)
"""The materials of :func:`face_scene` by face name (ITU-R P.2040 names; metal: a perfect
conductor)."""


def face_scene(
    scene: Scene, materials: Mapping[str, Any] | None = None, *, order: int = 1
) -> MeshModel:
    """The paper's room as a scene of faces: a floor of two materials (concrete for x < 5 m,
    floorboard beyond), a plasterboard ceiling, brick walls, a 0.6 x 0.6 m concrete pillar
    from floor to ceiling at (6.0, 4.5) and a 0.8 x 0.6 x 1.9 m metal cabinet at (1.4, 7.8).

    Args:
        scene: the deployment (its ``room_size`` must be the paper's 10 x 10 x 4 m).
        materials: permittivities (or ITU names, or ``None`` for a perfect conductor) by face
            name, overriding :data:`FACE_MATERIALS` (e.g. a nominal model's guesses).
        order: reflection order of the :class:`~dmimo_jax.physics.MeshModel`.
    """
    size = np.asarray(scene.room_size, float)
    if not np.allclose(size, (10.0, 10.0, 4.0)):
        raise ValueError(f"scene.room_size must be the paper's (10, 10, 4) m, got {size}")
    mats = dict(FACE_MATERIALS)
    if materials is not None:
        unknown = set(materials) - set(mats)
        if unknown:
            raise ValueError(f"materials keys must be among {sorted(mats)}, got {sorted(unknown)}")
        mats.update(materials)
    f = float(scene.frequency)
    kw = dict(frequency_hz=f, dtype=scene.ap_positions.dtype)
    walls = cuboid_faces(
        (0, 0, 0), size, mats["walls"], name="walls", inward=True, skip=("z0", "z1"), **kw
    )
    ceiling = cuboid_faces(
        (0, 0, 0),
        size,
        mats["ceiling"],
        name="ceiling",
        inward=True,
        skip=("x0", "x1", "y0", "y1", "z0"),
        **kw,
    )
    floor = (
        Face(
            [[0, 0, 0], [5, 0, 0], [5, 10, 0], [0, 10, 0]],
            mats["floor_concrete"],
            name="floor_concrete",
            **kw,
        ),
        Face(
            [[5, 0, 0], [10, 0, 0], [10, 10, 0], [5, 10, 0]],
            mats["floor_wood"],
            name="floor_wood",
            **kw,
        ),
    )
    pillar = cuboid_faces(
        (5.7, 4.2, 0.0), (6.3, 4.8, 4.0), mats["pillar"], name="pillar", skip=("z0", "z1"), **kw
    )
    cabinet = cuboid_faces(
        (1.0, 7.5, 0.0), (1.8, 8.1, 1.9), mats["cabinet"], name="cabinet", skip=("z0",), **kw
    )
    return MeshModel(scene, floor + ceiling + walls + pillar + cabinet, order)


def sample_world_positions(key: Any, num: int, model: Any, *, clearance: float = 0.05) -> Any:
    """``num`` positions uniform in the UE region of ``model.scene``, kept in the air: for a
    :class:`~dmimo_jax.physics.MeshModel` positions inside a solid, within ``clearance``
    metres of a face, or where some AP receives no path at all (every path blocked: zero
    amplitude, infinite variance) are redrawn (:meth:`~dmimo_jax.physics.MeshModel.in_air`);
    any other model is :func:`~dmimo_jax.sample_positions`."""
    check_int("num", num, minimum=1)
    if not isinstance(model, MeshModel):
        return sample_positions(key, num, model.scene)
    kept, drawn = [], 0
    while drawn < num:
        key, sub = jax.random.split(key)
        xs = np.asarray(sample_positions(sub, 2 * num, model.scene))
        xs = xs[model.in_air(xs, clearance=clearance)]
        heard = np.all(np.isfinite(np.asarray(jax.vmap(model.variance)(xs))), axis=1)
        xs = xs[heard]
        kept.append(xs)
        drawn += len(xs)
    return jax.numpy.asarray(np.concatenate(kept)[:num])


SEED_MAX = 2**32 - 1 - 1000
"""The largest ``seed`` of :func:`synthetic_deployment` (its key is ``seed + 1000``, and a
seed past 32 bits would silently wrap onto another world's)."""


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
    * ``world="faces"``: as ``"room"`` (APs on the ceiling, off laterally), in the scene of
      faces :func:`face_scene` (a floor of two materials, a pillar, a metal cabinet). The
      nominal model is the same scene with every dielectric guessed concrete (the cabinet
      known to be metal); with ``random_materials`` the five dielectric materials are drawn
      from :data:`ROOM_MATERIALS`.
    * ``world="two-ray"``: free-standing APs off by N(0, sigma^2) in 3-D (``position_std``,
      default 1 cm), the two-ray channel. The nominal model is the surveyed two-ray model.

    With ``patch``, the APs are downward patches (:class:`~dmimo_jax.CosinePattern`) of
    exponent ``true_exponent`` that the survey believes to be ``believed_exponent``.
    Same arguments, same world (the materials' draw uses its own key, so a world with and
    without ``random_materials`` has the same APs).

    Raises:
        ValueError: an unknown ``world``, a ``seed`` that is not an integer in [0,
            :data:`SEED_MAX`], a non-finite ``power_dbm``, a negative or non-finite
            ``position_std``, a negative exponent, ``random_materials`` for the two-ray world.
    """
    if world not in ("room", "two-ray", "faces"):
        raise ValueError(f"world must be 'room', 'two-ray' or 'faces', got {world!r}")
    check_int("seed", seed, maximum=SEED_MAX)  # seed + 1000 is a 32-bit key (larger wrap)
    check_scalar("power_dbm", power_dbm)
    for name, q in (("true_exponent", true_exponent), ("believed_exponent", believed_exponent)):
        check_scalar(name, q)  # checked without patch too, where they are not used
        if q < 0:
            raise ValueError(f"{name} must be >= 0 (a cosine pattern's exponent), got {q!r}")
    if random_materials and world == "two-ray":
        raise ValueError("random_materials draws a room's surfaces: use world='room' or 'faces'")
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
    if world == "faces":
        names = ("floor_concrete", "floor_wood", "ceiling", "walls", "pillar")
        materials = None
        if random_materials:  # each dielectric material drawn from ROOM_MATERIALS
            draw = jax.random.randint(
                jax.random.fold_in(key, 7), (len(names),), 0, len(ROOM_MATERIALS)
            )
            materials = {n: ROOM_MATERIALS[int(i)] for n, i in zip(names, draw, strict=True)}
        guess = dict.fromkeys(names, "concrete")
        truth = face_scene(real, materials)
        return SyntheticDeployment(truth, surveyed, face_scene(surveyed, guess))
    room: Mapping[str, Any] = {"ceiling": "plasterboard", "walls": ROOM_WALLS, "floor": "concrete"}
    if random_materials:
        room = _random_room(jax.random.fold_in(key, 7))
    truth = room_model(real, **room)
    nominal = room_model(surveyed, ceiling="concrete", walls="concrete", floor="concrete")
    return SyntheticDeployment(truth, surveyed, nominal)


PAPER_DENSITY = 0.17
"""APs per square metre of the paper's room (17 over 10 x 10 m)."""


UE_TOP = 3.5
"""The top of a hall's UE region (:func:`hall_scene`), m: its APs hang above it."""


def hall_scene(
    side: float,
    *,
    seed: int = 0,
    power_dbm: float = -10.0,
    density: float = PAPER_DENSITY,
    height: float = 4.0,
    jitter: float = 0.3,
) -> Scene:
    """A square hall of ``side`` metres at the paper's AP density: round(``density`` *
    side^2) APs on a jittered grid on the ceiling (``height``), the paper's radio (800 MHz,
    ``power_dbm``, concrete ground, ITU convention), UE region 0.5 m inside the walls and
    0.5-3.5 m high. The scaling worlds of locality (:mod:`dmimo_jax.tiles`,
    ``benchmarks/scaling.py``): 20 m holds 68 APs, 40 m 272, 80 m 1,088.

    The grid has ``ceil(sqrt(M))`` columns and enough rows for M cells; M of its cells,
    drawn with ``seed``, hold one AP each, moved by up to ``jitter`` of the cell's size
    from its centre. Same arguments, same hall.

    Raises:
        ValueError: a ``side`` not above 2 m, fewer than 4 APs, a ``height`` not above the
            UE region (:data:`UE_TOP`), a bad ``seed`` or ``jitter``.
    """
    check_scalar("side", side, positive=True)
    if side <= 2.0:
        raise ValueError(f"side must exceed 2 m (a 0.5 m margin on each side), got {side!r}")
    check_scalar("density", density, positive=True)
    check_scalar("height", height, positive=True)
    if height <= UE_TOP:  # the APs would hang inside the UE region (a UE at an AP)
        raise ValueError(f"height must be above the UE region's top, {UE_TOP} m, got {height!r}")
    check_scalar("jitter", jitter)
    if not 0 <= jitter < 0.5:
        raise ValueError(f"jitter must be in [0, 0.5) of a cell, got {jitter!r}")
    check_int("seed", seed, maximum=SEED_MAX)
    m = int(round(density * side * side))
    if m < 4:
        raise ValueError(f"a {side} m hall at density {density} holds {m} APs: at least 4")
    cols = int(np.ceil(np.sqrt(m)))
    rows = int(np.ceil(m / cols))
    rng = np.random.default_rng(seed)
    cells = np.sort(rng.choice(cols * rows, m, replace=False))
    ix, iy = cells % cols, cells // cols
    dx, dy = side / cols, side / rows
    x = (ix + 0.5 + rng.uniform(-jitter, jitter, m)) * dx
    y = (iy + 0.5 + rng.uniform(-jitter, jitter, m)) * dy
    ap = np.stack([x, y, np.full(m, float(height))], axis=1)
    base = paper_scene(power_dbm, "concrete", convention="itu")
    return base.replace(
        ap_positions=ap,
        ue_low=np.array([0.5, 0.5, 0.5]),
        ue_high=np.array([side - 0.5, side - 0.5, UE_TOP]),
        room_size=np.array([side, side, float(height)]),
    )
