r"""Fit of the shared GP (Sec. III-B): hyperparameters by L-BFGS, CPOs profiled in closed form."""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_scalar, warn_if_float32
from dmimo_jax.gp.kernel import (
    FIT_MEMORY_FACTOR,
    GPParams,
    check_covariance_size,
    check_params,
    check_training_data,
    flat_features,
    log_marginal_likelihood,
    residuals,
    training_process,
)
from dmimo_jax.phase import wrap
from dmimo_jax.scene import Scene


def initial_cpos(x: ArrayLike, r: ArrayLike, scene: Scene) -> Array:
    r"""CPO start values: the circular mean over APs of the LoS residuals :math:`r - 2\pi d^{(1)}/\lambda`, (L,)."""
    e = residuals(x, r, jnp.zeros(jnp.shape(r)[0]), scene)
    return jnp.angle(jnp.sum(jnp.exp(1j * e), axis=-1))


def initial_params(x: ArrayLike, r: ArrayLike, scene: Scene) -> GPParams:
    r"""Hyperparameter start values from the data.

    :math:`\sigma_f^2` = variance of the LoS residuals after the CPO start values (floor
    1e-4 rad^2); :math:`\ell_1^2 = 1` (a sine-shaped period);
    :math:`\ell_2`, :math:`\ell_3` = the standard deviations of
    :math:`\Delta d` and :math:`\gamma` over the training inputs (floors 0.5 m, 0.1 rad).
    """
    e = residuals(x, r, initial_cpos(x, r, scene), scene)
    f = flat_features(jnp.asarray(x), scene)
    ell2 = jnp.maximum(jnp.std(f[:, 0]), 0.5)
    ell3 = jnp.maximum(jnp.std(f[:, 1]), 0.1)
    return GPParams.from_natural(jnp.maximum(jnp.var(e), 1e-4), 1.0, ell2**2, ell3**2)


def profile_cpos(
    params: GPParams,
    cpo0: ArrayLike,
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
) -> Array:
    r"""The CPOs that maximize eq. (23) for fixed :math:`\psi`, by generalized least squares.

    With :math:`\mathbf y = \upsilon(\phi_0)` and :math:`\mathbf A = \mathbf I_L\otimes\mathbf 1_M`,
    :math:`\upsilon(\phi_0+\delta) = \mathbf y - \mathbf A\delta` while no residual crosses
    :math:`\pm\pi`, so setting eq. (23b) to zero gives
    :math:`\delta = (\mathbf A^\top\mathbf K_{\mathbf r}^{-1}\mathbf A)^{-1}\mathbf A^\top\mathbf K_{\mathbf r}^{-1}\mathbf y`
    (two triangular solves with tinygp's Cholesky factor). Returns :math:`\phi_0+\delta` (L,).
    """
    x, noise_var, cpo0 = jnp.asarray(x), jnp.asarray(noise_var), jnp.asarray(cpo0)
    num_loc, m = noise_var.shape
    gp = training_process(params, x, noise_var, scene)
    y = residuals(x, r, cpo0, scene).reshape(-1)
    a = jnp.repeat(jnp.eye(num_loc, dtype=y.dtype), m, axis=0)  # (LM, L), q = i M + m
    w = gp.solver.solve_triangular(a)
    z = gp.solver.solve_triangular(y)
    return cpo0 + jnp.linalg.solve(w.T @ w, w.T @ z)


@jax.jit
def profiled_cpos(
    params: GPParams, x: ArrayLike, r: ArrayLike, noise_var: ArrayLike, scene: Scene
) -> Array:
    """The CPOs :func:`fit` returns at ``params``: :func:`profile_cpos` from the
    circular-mean start (:func:`initial_cpos`), wrapped (L,); one compiled program per
    shape."""
    start = initial_cpos(x, r, scene)
    return wrap(profile_cpos(params, start, x, r, noise_var, scene))


class GPFit(NamedTuple):
    """Output of :func:`fit`."""

    params: GPParams
    cpo: Array
    """(L,) estimated CPOs, wrapped."""
    log_likelihood: Array
    """() final eq. (23)."""
    history: Array
    """(steps,) eq. (23) per L-BFGS step of the best restart."""


def fit(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    *,
    num_steps: int = 50,
    num_restarts: int = 1,
    rtol: float = 1e-8,
    key: Array | None = None,
    init: GPParams | None = None,
    max_memory_bytes: float | None = None,
) -> GPFit:
    r"""Maximize eq. (23) jointly over :math:`\psi` (log space) and the L CPOs :math:`\phi`.

    The CPOs enter the residuals linearly (away from the wrap), so for every
    :math:`\psi` their maximizer is closed form (:func:`profile_cpos`); the optimizer
    then climbs the profile likelihood :math:`\max_\phi\mathcal L_{\mathbf r}(\psi,\phi)`
    in the 4 log hyperparameters only. Same optimum as the joint ascent of eqs. (23b-c),
    in fewer, better-conditioned steps (joint L-BFGS over 4 + L unknowns was still
    climbing after 100 steps at L = 50).

    Optimizer: L-BFGS (``optax.lbfgs``, zoom line search): 4 smooth unknowns, one
    (LM x LM) Cholesky per evaluation, no learning rate to tune.

    Robustness: the CPOs start at the circular mean of the LoS residuals
    (:func:`initial_cpos`), the hyperparameters at :func:`initial_params`; restarts
    perturb the log hyperparameters (N(0, 1) per entry) and the best final likelihood wins.

    Args:
        x: (L, 3) training UE positions, m.
        r: (L, M) wrapped measured phases.
        noise_var: (L, M) known phase-noise variances (e.g. eq. 9 at the measurement SNR).
        scene: geometry and wavelength (its permittivity is not used).
        num_steps: at most this many L-BFGS iterations per restart.
        rtol: stop when an iteration changes eq. (23) by less than this (relative).
        num_restarts: independent starts (the first is the data-driven one).
        key: PRNG key of the restarts; required when ``num_restarts > 1`` (the first
            start is deterministic, so one restart needs no key).
        init: override the first start's hyperparameters.
        max_memory_bytes: refuse a fit whose working memory (``FIT_MEMORY_FACTOR`` times
            its LM x LM float64 covariance) is above this; default half this host's memory.

    Raises:
        ValueError: L < 2, shapes that do not match (L, M), non-finite or non-positive inputs,
            a fit above ``max_memory_bytes``.
    """
    check_training_data(x, r, noise_var, scene.num_aps)
    check_covariance_size(
        np.shape(x)[0],
        scene.num_aps,
        max_memory_bytes,
        factor=FIT_MEMORY_FACTOR,
        name="max_memory_bytes",
    )
    if init is not None:
        check_params("init", init)
    warn_if_float32("gp.fit")
    if not (isinstance(num_restarts, int) and num_restarts >= 1):
        raise ValueError(f"num_restarts must be a positive int, got {num_restarts!r}")
    if not (isinstance(num_steps, int) and num_steps >= 1):
        raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
    check_rtol(rtol)
    x, r, noise_var = (jnp.asarray(v, scene.ap_positions.dtype) for v in (x, r, noise_var))
    if num_restarts > 1 and key is None:
        raise ValueError(f"key is required for num_restarts={num_restarts} > 1 (random restarts)")
    data_params, cpo0 = _starts(x, r, scene)
    base = data_params if init is None else init
    jitter = jnp.zeros((num_restarts, 4), x.dtype)
    if num_restarts > 1:
        jitter = jax.random.normal(key, (num_restarts, 4), x.dtype).at[0].set(0.0)
    best = None
    for s in range(num_restarts):
        params0 = GPParams(*(jnp.asarray(b) + jitter[s, j] for j, b in enumerate(base)))
        params, history = _fit_lbfgs(params0, cpo0, x, r, noise_var, scene, num_steps, rtol)
        history = history[jnp.isfinite(history)]
        if best is None or (history.size and history[-1] > best[1][-1]):
            best = (params, history)
    params, history = best
    cpo, final = _finish(params, cpo0, x, r, noise_var, scene)
    return GPFit(params, cpo, final, history)


@jax.jit
def _starts(x: Array, r: Array, scene: Scene) -> tuple[GPParams, Array]:
    """:func:`initial_params` and :func:`initial_cpos`, compiled as one program."""
    return initial_params(x, r, scene), initial_cpos(x, r, scene)


@jax.jit
def _finish(params, cpo0, x, r, noise_var, scene) -> tuple[Array, Array]:
    """The profiled CPOs (wrapped) and eq. (23) there, compiled as one program."""
    cpo = profile_cpos(params, cpo0, x, r, noise_var, scene)
    return wrap(cpo), log_marginal_likelihood(params, cpo, x, r, noise_var, scene)


def check_rtol(rtol: float) -> None:
    """``ValueError`` unless the fits' stopping tolerance ``rtol`` is finite and >= 0 (a
    negative or NaN one would never stop a fit early, silently)."""
    check_scalar("rtol", rtol)
    if rtol < 0:
        raise ValueError(f"rtol must be >= 0 (a relative change), got {rtol!r}")


@partial(jax.jit, static_argnames=("num_steps",))
def _fit_lbfgs(params0, cpo0, x, r, noise_var, scene, num_steps, rtol):
    def loss(params):
        cpo = jax.lax.stop_gradient(profile_cpos(params, cpo0, x, r, noise_var, scene))
        return -log_marginal_likelihood(params, cpo, x, r, noise_var, scene)

    return _minimize(loss, params0, num_steps, rtol)


def _minimize(loss, params0: GPParams, num_steps: int, rtol) -> tuple[GPParams, Array]:
    """L-BFGS (``optax.lbfgs``, zoom line search) on ``loss`` from ``params0`` (traced): the
    minimizer and the negated loss per iteration (NaN after the last)."""
    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)
    dtype = params0.log_sigma_f2.dtype

    def step(carry):
        params, state, _, value, k, history = carry
        new_value, grad = value_and_grad(params, state=state)
        updates, state = opt.update(grad, state, params, value=new_value, grad=grad, value_fn=loss)
        history = history.at[k].set(-new_value)
        return optax.apply_updates(params, updates), state, value, new_value, k + 1, history

    def keep_going(carry):  # stop when an iteration changes eq. (23) by < rtol (relative)
        _, _, prev, value, k, _ = carry
        return (k < 2) | ((k < num_steps) & (jnp.abs(prev - value) > rtol * jnp.abs(value)))

    inf = jnp.asarray(jnp.inf, dtype)
    history = jnp.full((num_steps,), jnp.nan, dtype)
    init = (params0, opt.init(params0), inf, inf, jnp.zeros((), jnp.int32), history)
    params, _, _, _, _, history = jax.lax.while_loop(keep_going, step, init)
    return params, history


class BlocksFit(NamedTuple):
    """Output of :func:`fit_blocks`."""

    params: GPParams
    """The one psi of every block."""
    log_likelihood: Array
    """() the composite eq. (23): the sum over blocks."""
    history: Array
    """(steps,) the composite eq. (23) per L-BFGS step (NaN after the last)."""


def fit_blocks(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scenes: Scene,
    *,
    num_steps: int = 50,
    rtol: float = 1e-8,
    max_memory_bytes: float | None = None,
) -> BlocksFit:
    r"""The hyperparameters :math:`\psi` of B independent blocks of training pairs at once:
    L-BFGS on the composite likelihood :math:`\sum_b \mathcal L_{\mathbf r}^{(b)}(\psi)`
    (eq. 23 per block, each block's CPOs profiled, :func:`profile_cpos`), as :func:`fit`
    does for one block.

    A block is n labeled snapshots seen by K APs (a tile's labels and its APs,
    :func:`dmimo_jax.tiles.fit_tiles`): the GP of eq. (22) is shared, so the blocks share
    :math:`\psi`, while their covariances stay B of (nK x nK) instead of one of (LM x LM).
    Pairs of two blocks are treated as independent (a composite likelihood); one block is
    :func:`fit` with one start.

    Args:
        x: (B, n, 3) each block's training positions, m.
        r: (B, n, K) their wrapped phases at the block's APs.
        noise_var: (B, n, K) their phase-noise variances.
        scenes: the B blocks' scenes stacked on a leading axis (each the scene of its K
            APs: :meth:`~dmimo_jax.scene.Scene.subset`).
        num_steps: at most this many L-BFGS iterations (as :func:`fit`).
        rtol: stop when an iteration changes the sum by less than this (relative).
        max_memory_bytes: refuse a fit whose working memory (one block at a time:
            ``FIT_MEMORY_FACTOR`` times its nK x nK covariance) is above this; default half
            this host's memory.

    Raises:
        ValueError: shapes that do not agree, fewer than 2 labels per block, non-finite or
            non-positive inputs.
    """
    x, r, noise_var = (np.asarray(v) for v in (x, r, noise_var))
    if x.ndim != 3 or x.shape[-1] != 3:
        raise ValueError(f"x must have shape (B, n, 3), got {x.shape}")
    b, n, _ = x.shape
    k = int(np.shape(scenes.ap_positions)[-2])
    if np.shape(scenes.ap_positions)[:-2] != (b,):
        raise ValueError(
            f"scenes must be {b} scenes stacked on a leading axis (one per block), got AP "
            f"positions of shape {np.shape(scenes.ap_positions)}"
        )
    for i in range(b):  # each block is the training data of one GP
        check_training_data(x[i], r[i], noise_var[i], k)
    check_covariance_size(n, k, max_memory_bytes, factor=FIT_MEMORY_FACTOR, name="max_memory_bytes")
    warn_if_float32("gp.fit_blocks")
    if not (isinstance(num_steps, int) and num_steps >= 1):
        raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
    check_rtol(rtol)
    dtype = scenes.ap_positions.dtype
    x, r, noise_var = (jnp.asarray(v, dtype) for v in (x, r, noise_var))
    return _fit_blocks(x, r, noise_var, scenes, num_steps, rtol)


@partial(jax.jit, static_argnames=("num_steps",))
def _fit_blocks(x, r, noise_var, scenes, num_steps, rtol) -> BlocksFit:
    starts, cpo0 = jax.vmap(_starts)(x, r, scenes)
    params0 = jax.tree.map(lambda v: jnp.mean(v, axis=0), starts)  # the mean log start

    def loss(params):
        def block(c, xb, rb, nb, sb):
            cpo = jax.lax.stop_gradient(profile_cpos(params, c, xb, rb, nb, sb))
            return log_marginal_likelihood(params, cpo, xb, rb, nb, sb)

        # one block after another (lax.map): vmapped, the blocks' Choleskys inside the
        # L-BFGS loop stalled the CPU runtime (jax 0.10, four blocks of 312 pairs)
        return -jnp.sum(jax.lax.map(lambda a: block(*a), (cpo0, x, r, noise_var, scenes)))

    params, history = _minimize(loss, params0, num_steps, rtol)
    return BlocksFit(params, -loss(params), history)
