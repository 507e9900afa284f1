r"""Place the APs by the gradient of the PEB (beyond the paper).

The PEB of eq. (14) is a differentiable function of the AP positions, so a deployment can be
designed by gradient descent: minimize the mean PEB over the UE region (``"mean"``) or a
smooth worst case (``"max"``: the :math:`L_p` norm of the PEB over the sampled UEs,
:math:`(\frac1N\sum_i \mathrm{PEB}_i^p)^{1/p}`, ``p = 16`` by default, which weights the worst
UEs near the walls and corners) while the APs stay on the allowed mounting surfaces and at
least ``min_separation`` apart.

Mounting surfaces are parametrized on the **unfolded box**: the ceiling
:math:`[0,W]\times[0,D]` with the four walls hinged at its edges (a cross-shaped net), so an
AP can slide from the ceiling over an edge onto a wall. ``"ceiling"`` keeps the ceiling
rectangle only. Each Adam step (optax) is followed by the Euclidean projection onto the net,
a fresh batch of UEs is drawn every step (stochastic gradient of the expectation over the
region), and the separation enters as a quadratic penalty on the violating pairs. The
smooth maximum is descended from the layout the mean objective reaches first
(``mean_steps``): from a random layout it stalls higher.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import Array
from jax.typing import ArrayLike
from tqdm.auto import tqdm

from dmimo_jax._checks import check_int, check_scalar, warn_if_float32
from dmimo_jax.bounds import peb_from_fim, position_fim
from dmimo_jax.physics import TwoRayModel
from dmimo_jax.scene import Scene, pack_greedily, sample_positions

__all__ = [
    "SURFACES",
    "DesignResult",
    "layout_objective",
    "min_pairwise_distance",
    "net_to_room",
    "optimize_ap_positions",
    "peb_values",
    "room_to_net",
    "sample_layout",
]

SURFACES = ("ceiling", "ceiling+walls")
"""Where the layout optimization may move the APs: on the ceiling, or on the ceiling
and the walls."""


class DesignResult(NamedTuple):
    """Output of :func:`optimize_ap_positions`."""

    scene: Scene
    """The scene with the optimized AP positions."""
    history: Array
    """(mean_steps + steps,) objective on each step's UE batch, m."""
    min_separation: float
    """Achieved minimum pairwise AP distance, m."""


def peb_values(scene: Scene, xs: ArrayLike) -> Array:
    """PEB (m) of the two-ray model of ``scene`` at positions ``xs`` (N, 3); traceable in the
    AP positions (``inf`` where the FIM is singular)."""
    model = TwoRayModel(scene)
    return jax.vmap(lambda x: peb_from_fim(position_fim(x, model)))(jnp.asarray(xs))


def layout_objective(pebs: Array, objective: str, p: float = 16.0) -> Array:
    r"""``"mean"``: the mean PEB; ``"max"``: :math:`(\mathrm{mean}\,\mathrm{PEB}^p)^{1/p}`."""
    _check_objective(objective)
    if objective == "mean":
        return jnp.mean(pebs)
    # the soft maximum, scaled by the (constant) largest PEB; an infinite PEB (a singular
    # FIM) makes it infinite, as the mean, not NaN
    scale = jax.lax.stop_gradient(jnp.max(pebs))
    finite = jnp.isfinite(scale) & (scale > 0)
    safe = jnp.where(finite, scale, 1.0)
    soft = safe * jnp.mean((pebs / safe) ** p) ** (1.0 / p)
    return jnp.where(finite, soft, scale)


def _check_objective(objective: str) -> None:
    if objective not in ("mean", "max"):
        raise ValueError(f"objective must be 'mean' or 'max', got {objective!r}")


def min_pairwise_distance(ap_positions: ArrayLike) -> float:
    """The smallest distance between two APs, m."""
    ap = np.asarray(ap_positions, float)
    d = np.linalg.norm(ap[:, None] - ap[None], axis=-1)
    d[np.diag_indices_from(d)] = np.inf
    return float(d.min())


# ----------------------------------------------------------------------------- the unfolded box


def _rectangles(size, surfaces: str, wall_low: float):
    """Net rectangles (s0, s1, t0, t1): ceiling, then walls y=0, y=D, x=0, x=W."""
    w, d, h = size
    rects = [(0.0, w, 0.0, d)]
    if surfaces == "ceiling+walls":
        top = h - wall_low  # how far down a wall an AP may go
        rects += [
            (0.0, w, -top, 0.0),
            (0.0, w, d, d + top),
            (-top, 0.0, 0.0, d),
            (w, w + top, 0.0, d),
        ]
    return jnp.asarray(rects)


def net_to_room(st: ArrayLike, size: ArrayLike) -> Array:
    """Net coordinates (..., 2) -> positions (..., 3) on the ceiling or a wall."""
    st = jnp.asarray(st)
    w, d, h = (jnp.asarray(size)[i] for i in range(3))
    s, t = st[..., 0], st[..., 1]
    on_y0, on_yd = t < 0, t > d
    on_x0, on_xw = s < 0, s > w
    x = jnp.clip(s, 0.0, w)
    y = jnp.clip(t, 0.0, d)
    z = h + jnp.where(on_y0, t, 0.0) - jnp.where(on_yd, t - d, 0.0)
    z = z + jnp.where(on_x0, s, 0.0) - jnp.where(on_xw, s - w, 0.0)
    return jnp.stack([x, y, z], axis=-1)


def room_to_net(pos: ArrayLike, size: ArrayLike, tol: float = 1e-6) -> Array:
    """Positions (N, 3) on the ceiling or a wall -> net coordinates (N, 2).

    Raises:
        ValueError: a position on no mounting surface of the box.
    """
    pos = np.asarray(pos, float)
    w, d, h = (float(v) for v in np.asarray(size))
    out = []
    for i, (x, y, z) in enumerate(pos):
        if abs(z - h) <= tol and -tol <= x <= w + tol and -tol <= y <= d + tol:
            out.append((x, y))
        elif abs(y) <= tol:
            out.append((x, -(h - z)))
        elif abs(y - d) <= tol:
            out.append((x, d + (h - z)))
        elif abs(x) <= tol:
            out.append((-(h - z), y))
        elif abs(x - w) <= tol:
            out.append((w + (h - z), y))
        else:
            raise ValueError(
                f"ap_positions[{i}] = {[x, y, z]} is on no mounting surface of the "
                f"{w} x {d} x {h} m room (the ceiling z = {h} or a wall)"
            )
    return jnp.asarray(out)


def _project(st: Array, rects: Array) -> Array:
    """Euclidean projection of net points (N, 2) onto the union of rectangles."""
    lo, hi = rects[:, [0, 2]], rects[:, [1, 3]]  # (R, 2)
    cand = jnp.clip(st[:, None, :], lo[None], hi[None])  # (N, R, 2)
    dist = jnp.sum((cand - st[:, None, :]) ** 2, axis=-1)
    best = jnp.argmin(dist, axis=1)
    return jnp.take_along_axis(cand, best[:, None, None], axis=1)[:, 0]


def _check_on_surfaces(st: Array, rects: Array, tol: float = 1e-6) -> bool:
    return bool(jnp.all(jnp.linalg.norm(_project(st, rects) - st, axis=-1) <= tol))


def sample_layout(
    key: Array,
    num_aps: int,
    size: ArrayLike,
    *,
    surfaces: str = "ceiling",
    min_separation: float = 1.0,
    wall_low: float = 0.5,
    max_candidates: int = 100_000,
) -> Array:
    """Random AP positions (num_aps, 3) uniform by area on the mounting surfaces, accepted
    greedily at ``min_separation`` (sequential random packing, as
    :func:`~dmimo_jax.scene.sample_ap_positions` on the ceiling).

    Raises:
        ValueError: the surfaces cannot hold ``num_aps`` APs at that separation.
    """
    _check_surfaces(surfaces)
    rects = np.asarray(_rectangles(np.asarray(size, float), surfaces, wall_low))
    area = (rects[:, 1] - rects[:, 0]) * (rects[:, 3] - rects[:, 2])
    k_r, k_u = jax.random.split(key)
    which = np.asarray(
        jax.random.choice(k_r, len(rects), (max_candidates,), p=jnp.asarray(area / area.sum()))
    )
    u = np.asarray(jax.random.uniform(k_u, (max_candidates, 2)))
    st = rects[which, [0]] + u[:, 0] * (rects[which, 1] - rects[which, 0])
    tt = rects[which, 2] + u[:, 1] * (rects[which, 3] - rects[which, 2])
    pts = np.asarray(net_to_room(jnp.stack([st, tt], -1), jnp.asarray(size, float)))
    packed = pack_greedily(pts, num_aps, min_separation)
    if packed is not None:
        return jnp.asarray(packed)
    raise ValueError(
        f"could not place num_aps={num_aps} APs {min_separation} m apart on the {surfaces} "
        f"after {max_candidates} candidates; lower min_separation"
    )


def _check_surfaces(surfaces: str) -> None:
    if surfaces not in SURFACES:
        raise ValueError(f"surfaces must be one of {SURFACES}, got {surfaces!r}")


# ----------------------------------------------------------------------------- the optimizer


def _ue_batch(key: Array, scene: Scene, num: int, objective: str) -> Array:
    """UEs of one step: uniform in the region for ``"mean"``; for ``"max"`` half of them in
    the band within 0.5 m of the region's side faces, where the worst PEBs are (a smooth
    maximum needs the tail sampled, not averaged)."""
    xs = sample_positions(key, num, scene)
    if objective != "max":
        return xs
    k_side, k_pos = jax.random.split(jax.random.fold_in(key, 1))
    half = num // 2
    low, high = scene.ue_low, scene.ue_high
    band = jnp.minimum(0.5, (high - low) / 2)
    u = jax.random.uniform(k_pos, (half, 3), dtype=xs.dtype)
    side = jax.random.randint(k_side, (half,), 0, 4)  # x low, x high, y low, y high
    inner = low[None, :] + u * (high - low)[None, :]
    axis = side // 2
    edge_val = jnp.where(
        side % 2 == 0, low[axis] + u[:, 0] * band[axis], high[axis] - u[:, 0] * band[axis]
    )
    pts = jnp.where(jnp.arange(3)[None, :] == axis[:, None], edge_val[:, None], inner)
    return xs.at[:half].set(pts)


@partial(jax.jit, static_argnames=("objective", "num_ue", "optimizer", "p"))
def _step(
    st, opt_state, key, scene, rects, min_separation, weight, objective, num_ue, optimizer, p
):
    size = scene.room_size

    def loss(st):
        ap = net_to_room(st, size)
        xs = _ue_batch(key, scene, num_ue, objective)
        value = layout_objective(peb_values(scene.replace(ap_positions=ap), xs), objective, p)
        diff = ap[:, None, :] - ap[None, :, :]
        sq = jnp.sum(diff * diff, axis=-1) + jnp.eye(ap.shape[0]) * 1e6
        dist = jnp.sqrt(sq)
        violation = jnp.sum(jnp.maximum(min_separation - dist, 0.0) ** 2) / 2
        return value * (1.0 + weight * violation / min_separation**2), value

    (_, value), grad = jax.value_and_grad(loss, has_aux=True)(st)
    grad = jnp.where(jnp.isfinite(grad), grad, 0.0)
    updates, opt_state = optimizer.update(grad, opt_state, st)
    st = _project(optax.apply_updates(st, updates), rects)
    return st, opt_state, value


def _check_start(
    scene: Scene, rects: Array, surfaces: str, wall_low: float, min_separation: float
) -> None:
    """``ValueError`` unless the scene's APs lie on the allowed surfaces, far enough apart."""
    if not _check_on_surfaces(room_to_net(scene.ap_positions, scene.room_size), rects):
        raise ValueError(
            f"scene.ap_positions are not all on the allowed surfaces ({surfaces!r}; walls from "
            f"z = {wall_low} m up)"
        )
    sep0 = min_pairwise_distance(scene.ap_positions)
    if sep0 < min_separation - 1e-9:
        raise ValueError(
            f"the starting layout has APs {sep0:.3g} m apart, below min_separation="
            f"{min_separation}: start from a layout that meets it (e.g. design.sample_layout)"
        )


def _phases(objective: str, steps: int, mean_steps: int, learning_rate: float) -> list:
    """(objective, steps, optimizer) of each descent phase: ``mean_steps`` of the mean at
    ``learning_rate``, then ``steps`` of ``objective`` (at half the rate after a warm-up);
    optax Adam on a cosine-decayed step."""
    return [
        (name, n, optax.adam(optax.cosine_decay_schedule(lr, n, alpha=0.02)))
        for name, n, lr in (
            ("mean", mean_steps, learning_rate),
            (objective, steps, learning_rate / 2 if mean_steps else learning_rate),
        )
        if n
    ]


def _descend(st, phases, k_steps, shared, num_ue, p, bar) -> tuple[Array, list]:
    """Run the descent ``phases`` from the surface coordinates ``st``: the final ``st`` and
    the objective after every step."""
    history = []
    for phase, (name, n, optimizer) in enumerate(phases):
        opt_state = optimizer.init(st)
        statics = (name, num_ue, optimizer, p)
        for k in jax.random.split(jax.random.fold_in(k_steps, phase), n):
            st, opt_state, value = _step(st, opt_state, k, *shared, *statics)
            history.append(value)
            bar.update()
    return st, history


def optimize_ap_positions(
    scene: Scene,
    key: Array,
    *,
    objective: str = "mean",
    surfaces: str = "ceiling",
    num_ue: int = 256,
    steps: int = 400,
    min_separation: float = 1.0,
    learning_rate: float = 0.05,
    p: float = 16.0,
    wall_low: float = 0.5,
    penalty: float = 100.0,
    num_starts: int = 1,
    mean_steps: int | None = None,
    progress: bool = True,
) -> DesignResult:
    """Gradient descent (optax Adam, cosine-decayed step) on the AP positions.

    Args:
        scene: the starting deployment (its APs must lie on the allowed surfaces of its
            ``room_size`` box) and the UE region the PEB is averaged over.
        key: PRNG key of the UE batches.
        objective: ``"mean"`` PEB or a smooth ``"max"`` (the L_p norm, module docstring).
        surfaces: ``"ceiling"`` or ``"ceiling+walls"``.
        num_ue: UEs drawn per step.
        steps: optimizer steps.
        min_separation: minimum AP distance, m (a quadratic penalty during the descent; the
            returned layout is checked).
        learning_rate: peak Adam step, m.
        p: exponent of the smooth maximum.
        wall_low: lowest mounting height on a wall, m.
        penalty: weight of the separation penalty.
        num_starts: the scene's layout, then ``num_starts - 1`` random layouts
            (:func:`sample_layout`) are each optimized; the best objective on one fixed batch
            of 2048 UEs wins.
        mean_steps: steps of the ``"mean"`` objective run first on each start (at
            ``learning_rate``), before ``steps`` of ``objective`` at half that rate. Default:
            ``steps // 2`` for ``"max"`` (the smooth maximum descends poorly from a random
            layout; the attempts with and without the warm-up are measured in
            docs/calibration_design.md), 0 for ``"mean"``.
        progress: a tqdm bar (in a terminal; quiet when stderr is not one).

    Returns:
        A :class:`DesignResult`; its ``scene`` has the optimized APs.

    Raises:
        ValueError: a starting layout off the allowed surfaces, an unknown objective or
            surface set, a separation the starting layout or the result does not meet.
    """
    if not isinstance(scene, Scene):
        raise ValueError(f"scene must be a Scene, got {type(scene).__name__}")
    _check_surfaces(surfaces)
    _check_objective(objective)
    check_int("num_ue", num_ue, minimum=1)
    check_int("steps", steps, minimum=1)
    for name, v in (("min_separation", min_separation), ("learning_rate", learning_rate), ("p", p)):
        check_scalar(name, v, positive=True)
    warn_if_float32("optimize_ap_positions")
    size = np.asarray(scene.room_size, float)
    check_scalar("wall_low", wall_low)
    if surfaces == "ceiling+walls" and not 0 < wall_low < size[2]:
        raise ValueError(
            f"wall_low must lie between the floor and the ceiling, 0 < wall_low < "
            f"{size[2]:g} m (the room's height), got {wall_low}"
        )
    rects = _rectangles(size, surfaces, wall_low)
    _check_start(scene, rects, surfaces, wall_low, min_separation)
    check_int("num_starts", num_starts, minimum=1)
    if mean_steps is None:
        mean_steps = steps // 2 if objective == "max" else 0
    check_int("mean_steps", mean_steps, minimum=0)
    phases = _phases(objective, steps, mean_steps, learning_rate)
    k_steps, k_starts, k_select = jax.random.split(key, 3)
    starts = [room_to_net(scene.ap_positions, size)] + [
        room_to_net(
            sample_layout(
                k,
                scene.num_aps,
                size,
                surfaces=surfaces,
                min_separation=min_separation,
                wall_low=wall_low,
            ),
            size,
        )
        for k in jax.random.split(k_starts, num_starts - 1)
    ]
    select = _ue_batch(k_select, scene, 2048, objective)  # one fixed batch ranks the starts
    best = None
    bar = tqdm(
        total=(mean_steps + steps) * num_starts,
        desc="AP layout",
        disable=None if progress else True,
    )
    shared = (scene, rects, min_separation, penalty)
    for st in starts:
        st, history = _descend(st, phases, k_steps, shared, num_ue, p, bar)
        ap = net_to_room(st, jnp.asarray(size))
        achieved = min_pairwise_distance(ap)
        if achieved < min_separation * (1 - 1e-3):
            continue  # the penalty lost: this start is not a valid layout
        pebs = peb_values(scene.replace(ap_positions=ap), select)
        score = float(layout_objective(pebs, objective, p))
        if best is None or score < best[0]:
            best = (score, ap, jnp.asarray(history), achieved)
    bar.close()
    if best is None:
        raise ValueError(
            f"no start ended with the APs min_separation={min_separation} m apart: raise "
            "penalty or lower learning_rate"
        )
    _, ap, history, achieved = best
    return DesignResult(scene.replace(ap_positions=ap), history, achieved)
