r"""Motion models and moving-UE simulation (beyond the paper: its Sec. VII future work).

A motion model is a frozen pytree with the linear-Gaussian transition of its state
:math:`\mathbf s_{k+1} = \mathbf F\mathbf s_k + \mathbf w_k`,
:math:`\mathbf w_k \sim \mathcal N(\mathbf 0, \mathbf Q)`, for a snapshot interval
``dt``; the first three state entries are the position (m).

- :class:`ConstantVelocity`: state :math:`[\mathbf p, \mathbf v]` (6,), discrete white
  noise acceleration (a piecewise-constant acceleration
  :math:`\mathbf a_k \sim \mathcal N(\mathbf 0, \sigma_a^2\mathbf I)` per interval,
  Bar-Shalom, Li and Kirubarajan 2001, Sec. 6.3.2):
  :math:`\mathbf F = \begin{bmatrix}\mathbf I & \Delta t\,\mathbf I\\ \mathbf 0 & \mathbf I\end{bmatrix}`,
  :math:`\mathbf Q = \sigma_a^2\,\boldsymbol\Gamma\boldsymbol\Gamma^\top\otimes\mathbf I`,
  :math:`\boldsymbol\Gamma = [\Delta t^2/2,\ \Delta t]^\top`.
- :class:`RandomWalk`: state :math:`\mathbf p` (3,), :math:`\mathbf F = \mathbf I`,
  :math:`\mathbf Q = \sigma^2\Delta t\,\mathbf I` (``sigma`` in m/sqrt(s)).

A model may be confined to a box (the UE region), where the UE bounces specularly at the
faces. A bouncing path is the free path of the same model folded into the box
(:func:`fold`: reflection is an isometry, and white noise stays white under it), so the
state is kept free and linear-Gaussian and the bounces enter only where a position is
used: the filter measures at the folded position, the simulator reports it.

:func:`simulate_trajectory` draws a path from a model (folded into its box);
:func:`simulate_track_phases` takes snapshots along it (eq. 8) with an unknown CPO per
snapshot (the paper's model) or a CPO that drifts as a random walk.
"""

from __future__ import annotations

import warnings
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_finite, check_int, check_positions, check_scalar, is_concrete
from dmimo_jax.measure import random_cpos, simulate_phases_batch
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.pytree import pytree_dataclass
from dmimo_jax.scene import Scene
from dmimo_jax.tracking.kalman import predict_covariance


def _region(region: Scene | tuple[ArrayLike, ArrayLike] | None) -> tuple[Array, Array]:
    if region is None:
        return jnp.full((3,), -jnp.inf), jnp.full((3,), jnp.inf)
    if isinstance(region, Scene):
        return region.ue_low, region.ue_high
    try:
        low, high = (jnp.asarray(v, float) for v in region)
    except (TypeError, ValueError) as err:
        raise ValueError(f"region must be a Scene, (low, high) or None, got {region!r}") from err
    if is_concrete(low, high) and (
        low.shape != (3,) or high.shape != (3,) or not bool(jnp.all(high > low))
    ):
        raise ValueError(
            f"region must be (low, high), each of shape (3,) with low < high, got "
            f"{np.asarray(low)} and {np.asarray(high)}"
        )
    return low, high


def fold(position: Array, low: Array, high: Array) -> tuple[Array, Array]:
    """A free position (..., 3) folded into the box ``[low, high]`` by mirroring at its
    faces (specular bounces), and the parity (..., 3) of +-1 per axis (the fold's
    Jacobian; velocities fold by it). Infinite bounds leave an axis unchanged."""
    shape = (1,) * (jnp.ndim(position) - 1) + (3,)
    low, high = jnp.reshape(low, shape), jnp.reshape(high, shape)
    finite = jnp.isfinite(low) & jnp.isfinite(high)
    lo = jnp.where(finite, low, 0.0)
    width = jnp.where(finite, high - low, 1.0)
    u = jnp.mod(position - lo, 2 * width)
    back = u > width
    folded = jnp.where(finite, lo + jnp.where(back, 2 * width - u, u), position)
    parity = jnp.where(finite & back, -1.0, 1.0).astype(position.dtype)
    return folded, parity


class _Bounded:
    """What both motion models share: the box they move in and the predicted moments."""

    low: Array
    high: Array

    def _set(self, name: str, sigma: ArrayLike, region: Scene | tuple | None) -> None:
        """The validating constructor both models share: the noise scale and the box."""
        _check_sigma(name, sigma)
        low, high = _region(region)
        for field, value in [(name, jnp.asarray(sigma, float)), ("low", low), ("high", high)]:
            object.__setattr__(self, field, value)

    def fold(self, position: Array) -> tuple[Array, Array]:
        """:func:`fold` into this model's box: (folded position, parity), each (..., 3)."""
        return fold(position, self.low, self.high)

    def predict(self, mean: Array, cov: Array, dt: ArrayLike) -> tuple[Array, Array]:
        r"""Predicted mean and covariance one interval ahead, :math:`\mathbf F\mathbf s`
        and :math:`\mathbf F\mathbf P\mathbf F^\top + \mathbf Q`, of the free state (the
        bounces are a fold of the free path, :meth:`fold`)."""
        f = self.transition(dt)
        return f @ mean, predict_covariance(cov, f, self.process_noise(dt))


def check_dt(dt: Any) -> None:
    """``ValueError`` unless the snapshot interval ``dt`` is a finite scalar > 0 (s)."""
    check_scalar("dt", dt, positive=True)


def _check_sigma(name: str, value: Any) -> None:
    check_scalar(name, value)
    if is_concrete(value) and float(value) < 0:
        raise ValueError(f"{name} must be >= 0, got {float(value)!r}")


@pytree_dataclass(init=False)
class ConstantVelocity(_Bounded):
    """Constant velocity with discrete white noise acceleration, state ``[p, v]`` (6,).

    Attributes:
        sigma_a: acceleration noise standard deviation per axis, m/s^2 (>= 0).
        low, high: the box the UE moves in (3,) each, m (``region``: a Scene's UE region,
            a ``(low, high)`` pair, or ``None``: unbounded); the UE bounces at its faces.
    """

    sigma_a: Array
    low: Array
    high: Array

    state_dim = 6

    def __init__(self, sigma_a: ArrayLike, region: Scene | tuple | None = None):
        self._set("sigma_a", sigma_a, region)

    def transition(self, dt: ArrayLike) -> Array:
        """:math:`\\mathbf F` (6, 6) for an interval ``dt`` (s)."""
        eye = jnp.eye(3, dtype=self.sigma_a.dtype)
        return jnp.block([[eye, dt * eye], [jnp.zeros_like(eye), eye]])

    def process_noise(self, dt: ArrayLike) -> Array:
        """:math:`\\mathbf Q` (6, 6) for an interval ``dt`` (s), rank 3."""
        gamma = jnp.stack([dt**2 / 2, dt * jnp.ones_like(dt)]).astype(self.sigma_a.dtype)
        return self.sigma_a**2 * jnp.kron(jnp.outer(gamma, gamma), jnp.eye(3, dtype=gamma.dtype))

    def initial_state(self, x0: ArrayLike, v0: ArrayLike | None = None) -> Array:
        """``[x0, v0]`` (6,) (``v0`` default zero)."""
        x0 = jnp.asarray(x0, self.sigma_a.dtype)
        v0 = jnp.zeros_like(x0) if v0 is None else jnp.asarray(v0, x0.dtype)
        return jnp.concatenate([x0, v0], axis=-1)


@pytree_dataclass(init=False)
class RandomWalk(_Bounded):
    """Position random walk, state ``p`` (3,).

    Attributes:
        sigma: diffusion per axis, m/sqrt(s) (>= 0): the position moves by
            ``N(0, sigma**2 * dt)`` per axis per interval.
        low, high: the box, as for :class:`ConstantVelocity` (``region``).
    """

    sigma: Array
    low: Array
    high: Array

    state_dim = 3

    def __init__(self, sigma: ArrayLike, region: Scene | tuple | None = None):
        self._set("sigma", sigma, region)

    def transition(self, dt: ArrayLike) -> Array:
        return jnp.eye(3, dtype=self.sigma.dtype)

    def process_noise(self, dt: ArrayLike) -> Array:
        return self.sigma**2 * dt * jnp.eye(3, dtype=self.sigma.dtype)

    def initial_state(self, x0: ArrayLike, v0: ArrayLike | None = None) -> Array:
        return jnp.asarray(x0, self.sigma.dtype)


MotionModel = ConstantVelocity | RandomWalk


def check_motion(motion: Any) -> None:
    if not isinstance(motion, (ConstantVelocity, RandomWalk)):
        raise ValueError(
            f"motion must be a ConstantVelocity or a RandomWalk, got {type(motion).__name__}"
        )


class Trajectory(NamedTuple):
    """A simulated path (one UE; ``jax.vmap`` adds a leading UE axis)."""

    positions: Array
    """(T, 3) m, in the box."""
    velocities: Array
    """(T, 3) m/s (zeros for a random walk), folded with the positions."""
    free_positions: Array
    """(T, 3) m, the free path the positions are the fold of."""


def simulate_trajectory(
    key: Array,
    motion: MotionModel,
    x0: ArrayLike,
    v0: ArrayLike | None,
    num_steps: int,
    dt: float,
) -> Trajectory:
    """A path of ``num_steps`` states drawn from ``motion``, kept inside its region.

    Step 0 is ``(x0, v0)``; each later state is :math:`\\mathbf F\\mathbf s + \\mathbf w`
    (module docstring), folded into the motion model's box: a UE that reaches a face
    bounces (its position mirrored, that velocity component reversed).

    Args:
        key: PRNG key.
        motion: :class:`ConstantVelocity` or :class:`RandomWalk`.
        x0: start position (3,), m, inside the model's region.
        v0: start velocity (3,), m/s (``None``: zero; ignored by a random walk).
        num_steps: T >= 1.
        dt: snapshot interval, s.

    Returns:
        :class:`Trajectory` of (T, 3) positions and velocities.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from dmimo_jax import paper_scene
        >>> walk = ConstantVelocity(1.0, region=paper_scene())
        >>> path = simulate_trajectory(jax.random.PRNGKey(0), walk,
        ...     jnp.array([5.0, 5.0, 1.5]), jnp.array([1.5, 0.0, 0.0]), 100, 0.01)
        >>> path.positions.shape
        (100, 3)
    """
    check_motion(motion)
    check_int("num_steps", num_steps, minimum=1)
    check_dt(dt)
    check_positions("x0", x0, batched=False)
    low, high = motion.low, motion.high
    x0 = jnp.asarray(x0, low.dtype)
    if is_concrete(x0) and not bool(jnp.all((x0 >= low) & (x0 <= high))):
        raise ValueError(f"x0 must lie inside the region [{np.asarray(low)}, {np.asarray(high)}]")
    if v0 is not None:
        v0 = jnp.asarray(v0, low.dtype)
        if v0.shape != (3,):
            raise ValueError(f"v0 must have shape (3,), got {v0.shape}")
        check_finite("v0", v0)
    return _simulate(key, motion, x0, v0, num_steps, jnp.asarray(dt, low.dtype))


# one program per motion model and length outside jit (a script, an eager vmap), instead
# of an eager dispatch per operation; inlined inside a jitted caller
@partial(jax.jit, static_argnames=("num_steps",))
def _simulate(key, motion, x0, v0, num_steps, dt) -> Trajectory:
    f, q = motion.transition(dt), motion.process_noise(dt)
    # Q's square root by eigendecomposition: Q is singular for constant velocity
    lam, vec = jnp.linalg.eigh(q)
    root = vec * jnp.sqrt(jnp.clip(lam, 0.0))[None, :]
    s0 = motion.initial_state(x0, v0)
    noise = jax.random.normal(key, (num_steps - 1, s0.shape[0]), s0.dtype) @ root.T

    def step(s, w):
        s = f @ s + w
        return s, s

    _, states = jax.lax.scan(step, s0, noise)
    states = jnp.concatenate([s0[None, :], states], axis=0)
    pos, parity = motion.fold(states[:, :3])
    vel = states[:, 3:] * parity if states.shape[1] == 6 else jnp.zeros_like(pos)
    return Trajectory(pos, vel, states[:, :3])


def simulate_track_phases(
    key: Array,
    model: PhaseModel | Scene,
    positions: ArrayLike,
    *,
    cpo_drift: float | None = None,
    dt: float | None = None,
) -> Array:
    r"""Snapshots along a path, eq. (8): :math:`r_{k,m} = \mathrm{wrap}(\mu_m(\mathbf x_k) + \phi_k + n_{k,m})`.

    Args:
        key: PRNG key.
        model: the world's PhaseModel (or a Scene: its two-ray model).
        positions: (T, 3) path, m.
        cpo_drift: ``None`` (default): an independent CPO uniform on
            :math:`[-\pi, \pi)` per snapshot (the paper's model). A value ``s`` (rad/sqrt(s)):
            a phase-continuous oscillator, :math:`\phi_{k+1} = \phi_k + \mathcal N(0, s^2\Delta t)`
            from a uniform :math:`\phi_0` (needs ``dt``).
        dt: snapshot interval, s (only with ``cpo_drift``).

    Returns:
        (T, M) wrapped phases.
    """
    model = as_phase_model(model)
    check_positions("positions", positions, batched=True)
    positions = jnp.asarray(positions)
    num = positions.shape[0]
    k_cpo, k_noise = jax.random.split(key)
    if cpo_drift is None:
        cpos = random_cpos(k_cpo, num, positions.dtype)
    else:
        _check_sigma("cpo_drift", cpo_drift)
        if dt is None:
            raise ValueError("dt is needed with cpo_drift (the random walk's interval, s)")
        check_dt(dt)
        k0, k1 = jax.random.split(k_cpo)
        steps = (
            float(cpo_drift) * np.sqrt(float(dt)) * jax.random.normal(k1, (num,), positions.dtype)
        )
        cpos = random_cpos(k0, 1, positions.dtype)[0] + jnp.cumsum(steps.at[0].set(0.0))
    return simulate_phases_batch(k_noise, model, positions, cpos)


START_MARGIN = 0.5  # m: a start this far outside the region is moved onto it; further: refused


def start_in_region(motion: MotionModel, pos: np.ndarray, name: str) -> np.ndarray:
    """Start positions ``pos`` (B, 3) inside the motion model's region: one at most
    ``START_MARGIN`` outside it (a single-snapshot estimate at low power, the normal case)
    is moved onto its boundary with a warning naming the UEs; NaN, or one further out
    (which cannot be meant), is a ``ValueError`` naming ``name``."""
    low, high = np.asarray(motion.low, float), np.asarray(motion.high, float)
    if not np.all(np.isfinite(pos)):
        raise ValueError(f"{name}: a start position is not finite: {pos.tolist()[:3]}")
    clipped = np.clip(pos, low, high)
    off = np.linalg.norm(pos - clipped, axis=1)
    far = np.flatnonzero(off > START_MARGIN)
    if far.size:
        raise ValueError(
            f"{name}: UE(s) {far.tolist()[:10]} start more than {START_MARGIN} m outside the "
            f"motion model's region [{low.tolist()}, {high.tolist()}] (e.g. "
            f"{pos[far[0]].tolist()})"
        )
    near = np.flatnonzero(off > 0)
    if near.size:
        warnings.warn(
            f"{name}: UE(s) {near.tolist()[:10]} start up to {off.max():.3g} m outside the "
            "motion model's region: moved onto its boundary",
            stacklevel=3,
        )
    return clipped
