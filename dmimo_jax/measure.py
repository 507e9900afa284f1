r"""Wrapped carrier-phase snapshots, eq. (8), from any PhaseModel, and the exact
route through the complex received signal, eq. (6).

Single-snapshot functions take one position (3,) and one CPO (); the ``*_batch``
functions take (N, 3) positions and (N,) CPOs and split the key per snapshot, so a
batch equals the single-snapshot calls with ``jax.random.split(key, N)``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_away_from_aps,
    check_finite,
    check_int,
    check_positions,
    check_scalar,
    dtype_of,
    is_concrete,
)
from dmimo_jax.phase import wrap
from dmimo_jax.physics import (
    PhaseModel,
    TwoRayModel,
    as_phase_model,
    check_in_domain,
    effective_amplitude,
    unwrapped_phase,
)
from dmimo_jax.pytree import jit_or_eager
from dmimo_jax.scene import Scene, sample_positions

__all__ = [
    "FAULT_KINDS",
    "inject_faults",
    "LabeledSnapshots",
    "labeled_snapshots",
    "received_signal",
    "phases_from_signal",
    "simulate_phases_exact",
    "simulate_phases_exact_batch",
]


def random_cpos(key: Array, num: int, dtype: Any = None) -> Array:
    r"""``num`` common phase offsets uniform on :math:`[-\pi, \pi)`."""
    check_int("num", num)
    dtype = jnp.result_type(float) if dtype is None else dtype
    return jax.random.uniform(key, (num,), dtype, minval=-jnp.pi, maxval=jnp.pi)


FAULT_KINDS = ("random", "stuck", "jump", "blocked")
"""The AP faults :func:`inject_faults` simulates."""


def inject_faults(
    key: Array, r: ArrayLike, faulty: ArrayLike, kind: str, *, jump: ArrayLike | None = None
) -> Array:
    r"""Snapshots ``r`` (N, M) with faulty APs (beyond the paper): wrapped phases, the
    entries where ``faulty`` ((N, M) or (M,) for every snapshot, bool) holds replaced by

    * ``"random"``: a dead receiver or lost lock, uniform on :math:`[-\pi, \pi)`;
    * ``"stuck"``: a stale value, one phase per AP (uniform) held in every snapshot;
    * ``"jump"``: lost phase synchronisation, the AP's phase offset changed by
      :math:`\delta_m` (``jump`` (M,), rad; default :math:`|\delta_m|` uniform on
      :math:`[\pi/2, \pi]` with a random sign), the same in every snapshot;
    * ``"blocked"``: a body in the line of sight, each snapshot's phase moved by a few
      radians (uniform on :math:`\pm[1, 3]`).

    Raises:
        ValueError: an unknown ``kind``, ``r`` not (N, M) real, ``faulty`` not a bool mask
            of shape (M,) or (N, M), ``jump`` not (M,) finite.
    """
    if kind not in FAULT_KINDS:
        raise ValueError(f"kind must be one of {FAULT_KINDS}, got {kind!r}")
    r = jnp.asarray(r)
    if r.ndim != 2 or jnp.iscomplexobj(r):
        raise ValueError(f"r must be (N, M) wrapped phases, got {r.dtype} {r.shape}")
    mask = jnp.asarray(faulty)
    if mask.dtype != bool or mask.shape not in (r.shape[1:], r.shape):
        raise ValueError(
            f"faulty must be a bool mask of shape ({r.shape[1]},) or {r.shape}, got "
            f"{mask.dtype} {mask.shape}"
        )
    mask = jnp.broadcast_to(mask, r.shape)
    n, m = r.shape
    k_a, k_b, k_c = jax.random.split(key, 3)
    if kind == "random":
        new = jax.random.uniform(k_a, r.shape, r.dtype, -jnp.pi, jnp.pi)
    elif kind == "stuck":
        new = jnp.broadcast_to(jax.random.uniform(k_a, (m,), r.dtype, -jnp.pi, jnp.pi), r.shape)
    elif kind == "jump":
        if jump is None:
            size = jax.random.uniform(k_a, (m,), r.dtype, jnp.pi / 2, jnp.pi)
            jump = jnp.where(jax.random.bernoulli(k_b, 0.5, (m,)), size, -size)
        if dtype_of(jump).kind not in "biuf":
            raise ValueError(f"jump must be real phase changes (rad), got {jump!r:.60}")
        jump = jnp.asarray(jump, r.dtype)
        if jump.shape != (m,):
            raise ValueError(f"jump must have shape ({m},) (one per AP), got {jump.shape}")
        check_finite("jump", jump)
        new = wrap(r + jump[None, :])
    else:
        size = jax.random.uniform(k_a, r.shape, r.dtype, 1.0, 3.0)
        new = wrap(r + jnp.where(jax.random.bernoulli(k_c, 0.5, r.shape), size, -size))
    return jnp.where(mask, new, r)


def simulate_phases(key: Array, model: PhaseModel | Scene, x: ArrayLike, cpo: ArrayLike) -> Array:
    r"""One snapshot :math:`r_m = \mathrm{wrap}(\mu_m(\mathbf{x}) + \phi + n_m)`, eq. (8).

    :math:`n_m \sim \mathcal{N}(0, \sigma_m^2)` with :math:`\sigma_m^2` = ``model.variance(x)``.
    An AP with no signal at ``x`` (infinite variance: its pattern gives no field there)
    measures a phase uniform on :math:`[-\pi, \pi)`.

    Args:
        key: PRNG key.
        model: a PhaseModel (or a Scene, meaning its two-ray model).
        x: UE position (3,), metres.
        cpo: common phase offset :math:`\phi` (scalar), radians.

    Returns:
        (M,) wrapped phases in :math:`[-\pi, \pi)`.
    """
    model = as_phase_model(model)
    check_positions("x", x, batched=False)
    check_in_domain("x", x, model)
    check_scalar("cpo", cpo)
    return _snapshot(key, model, jnp.asarray(x), cpo)


def _simulate(key: Array, model: PhaseModel, x: Array, cpo: Array) -> Array:
    """Eq. (8), unchecked; a uniform phase where the variance is infinite (no signal)."""
    mean, var = model.mean(x), model.variance(x)
    blind = jnp.isinf(var)
    std = jnp.sqrt(jnp.where(blind, 0.0, var))
    noise = std * jax.random.normal(key, mean.shape, mean.dtype)  # the stream of eq. (8)
    uniform = jax.random.uniform(
        jax.random.fold_in(key, 1), mean.shape, mean.dtype, -jnp.pi, jnp.pi
    )
    return jnp.where(blind, uniform, wrap(mean + cpo + noise))


_snapshot = jit_or_eager(_simulate)  # one compiled program per model and shape


def _batch(fn, key: Array, model: PhaseModel | Scene, xs: ArrayLike, cpos: ArrayLike) -> Array:
    check_positions("xs", xs, batched=True)
    if isinstance(model, Scene):
        check_away_from_aps("xs", xs, model.ap_positions)
    else:
        check_in_domain("xs", xs, model)
    xs = jnp.asarray(xs)
    cpos = jnp.asarray(cpos, xs.dtype)
    if cpos.shape != xs.shape[:1]:
        raise ValueError(f"cpos must have shape ({xs.shape[0]},) to match xs, got {cpos.shape}")
    check_finite("cpos", cpos)
    return _vmapped(fn, key, model, xs, cpos)


def _vmap_over_snapshots(fn, key: Array, model: Any, xs: Array, cpos: Array) -> Array:
    keys = jax.random.split(key, xs.shape[0])
    return jax.vmap(fn, in_axes=(0, None, 0, 0))(keys, model, xs, cpos)


_vmapped = jit_or_eager(_vmap_over_snapshots, static_argnums=(0,))


def simulate_phases_batch(
    key: Array, model: PhaseModel | Scene, xs: ArrayLike, cpos: ArrayLike
) -> Array:
    """Snapshots for (N, 3) positions and (N,) CPOs, shape (N, M); see :func:`simulate_phases`."""
    return _batch(_simulate, key, as_phase_model(model), xs, cpos)


class LabeledSnapshots(NamedTuple):
    """A simulated labeled set: positions ``x`` (N, 3), phases ``r`` (N, M) (rad, wrapped), the
    true noise variances ``variance`` (N, M) (rad^2) and the CPOs ``cpo`` (N,) (rad)."""

    x: Array
    r: Array
    variance: Array
    cpo: Array


def labeled_snapshots(
    key: Array,
    model: PhaseModel | Scene,
    num: int,
    *,
    x: ArrayLike | None = None,
    cpo: ArrayLike | None = None,
) -> LabeledSnapshots:
    """``num`` snapshots of ``model`` with their labels: the L labeled snapshots of the offline
    stage, or a test set (the one simulator of the examples and benchmarks).

    ``key`` is split into three, for the positions (uniform in the scene's UE box,
    :func:`~dmimo_jax.scene.sample_positions`), the CPOs (uniform, :func:`random_cpos`) and the
    noise (:func:`simulate_phases_batch`, eq. (8)); a given ``x`` ((3,) or (num, 3)) or ``cpo``
    (scalar or (num,)) replaces its draw and leaves the other draws unchanged. For a model
    with solids (``model.in_air``, a :class:`~dmimo_jax.physics.MeshModel`: a pillar, a
    cabinet) the positions drawn inside them are drawn again.
    """
    check_int("num", num, minimum=1)
    model = as_phase_model(model)
    k_x, k_cpo, k_noise = jax.random.split(key, 3)
    if x is None:
        xs = sample_positions(k_x, num, model.scene)
        in_air = getattr(model, "in_air", None)  # a scene of faces: not inside its solids
        if in_air is not None and is_concrete(xs):
            xs = _redraw_outside_solids(k_x, xs, in_air, model.scene)
    else:
        x = jnp.asarray(x)
        if x.shape not in ((3,), (num, 3)):
            raise ValueError(f"x: expected shape (3,) or ({num}, 3), got {x.shape}")
        xs = jnp.broadcast_to(x, (num, 3))
    if cpo is None:
        cpos = random_cpos(k_cpo, num)
    else:
        if dtype_of(cpo).kind not in "biuf":
            raise ValueError(f"cpo must be real phase offsets (rad), got {cpo!r:.60}")
        cpo = jnp.asarray(cpo)
        if cpo.shape not in ((), (num,)):
            raise ValueError(f"cpo: expected a scalar or shape ({num},), got {cpo.shape}")
        cpos = jnp.broadcast_to(cpo, (num,))
    r = simulate_phases_batch(k_noise, model, xs, cpos)
    return LabeledSnapshots(xs, r, jax.vmap(model.variance)(xs), cpos)


def _redraw_outside_solids(key: Array, xs: Array, in_air: Any, scene: Scene) -> Array:
    """``xs`` with every position inside a solid (``in_air`` False) drawn again, uniformly
    in the UE box, until all are in the air (positions already in the air are kept)."""
    xs = np.array(xs)
    for attempt in range(100):
        bad = np.flatnonzero(~in_air(xs))
        if bad.size == 0:
            return jnp.asarray(xs)
        new = sample_positions(jax.random.fold_in(key, attempt + 1), bad.size, scene)
        xs[bad] = np.asarray(new)
    raise ValueError(
        "x: the UE region is (almost) all inside the scene's solids: no position in the air "
        "was drawn in 100 tries"
    )


def received_signal(key: Array, scene: Scene, x: ArrayLike, cpo: ArrayLike) -> Array:
    r"""Received pilot :math:`y_m = \sqrt{P}\alpha_m e^{-j(\theta_m+\phi)} + w_m`, eq. (6) with s = 1.

    :math:`w_m \sim \mathcal{CN}(0, \sigma_w^2)`. Complex (M,). ``scene`` may be a Scene or
    its :class:`~dmimo_jax.physics.TwoRayModel` (the amplitude is the two-ray one).
    """
    scene = _two_ray_scene(scene, "received_signal")
    check_positions("x", x, batched=False)
    check_scalar("cpo", cpo)
    alpha = effective_amplitude(x, scene)
    theta = unwrapped_phase(x, scene)
    mean = jnp.sqrt(scene.tx_power) * alpha * jnp.exp(-1j * (theta + cpo))
    std = jnp.sqrt(scene.noise_power / 2.0)
    w = std * jax.random.normal(key, (2,) + alpha.shape, alpha.dtype)
    return mean + (w[0] + 1j * w[1])


def phases_from_signal(y: ArrayLike) -> Array:
    r"""Measured phase :math:`r_m = -\angle y_m` in :math:`[-\pi, \pi)` (Sec. II-A)."""
    return wrap(-jnp.angle(jnp.asarray(y)))


def simulate_phases_exact(key: Array, scene: Scene, x: ArrayLike, cpo: ArrayLike) -> Array:
    """Snapshot through the complex signal (no Gaussian phase approximation), (M,).

    ``scene``: a Scene or its :class:`~dmimo_jax.physics.TwoRayModel`."""
    return phases_from_signal(received_signal(key, scene, x, cpo))


def simulate_phases_exact_batch(key: Array, scene: Scene, xs: ArrayLike, cpos: ArrayLike) -> Array:
    """Batched :func:`simulate_phases_exact`, (N, M)."""
    return _batch(simulate_phases_exact, key, _two_ray_scene(scene, "simulate"), xs, cpos)


def _two_ray_scene(scene: Scene | TwoRayModel, where: str) -> Scene:
    """The Scene of a Scene or a TwoRayModel; other PhaseModels have no two-ray amplitude."""
    if isinstance(scene, TwoRayModel):
        return scene.scene
    if not isinstance(scene, Scene):
        raise ValueError(
            f"{where}: scene must be a Scene or a TwoRayModel (the exact route needs the "
            f"two-ray amplitude), got {type(scene).__name__}"
        )
    return scene
