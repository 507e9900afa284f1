r"""The shared quasi-periodic Gaussian-process phase model of Sec. III (tinygp).

The measured phase of AP m at UE location i is modelled as (eq. 19)

.. math:: r_{m,i} = \mathrm{wrap}(2\pi d^{(1)}_{m,i}/\lambda + \phi_i + g(\mathbf s_q) + n_{m,i}),

with one zero-mean GP :math:`g` shared by all APs, whose inputs are the features
:math:`\Delta d = d^{(2)} - d^{(1)}` and the incidence angle :math:`\gamma` (Sec. III-A),
and the quasi-periodic kernel of eq. (22):

.. math:: k = \sigma_f^2\,k_{pe}(\Delta d\mid\ell_1^2)\,k_{se}(\Delta d\mid\ell_2^2)\,k_{se}(\gamma\mid\ell_3^2).

Neither :math:`\varepsilon_r` nor the polarization is used: only the geometry (AP
positions, the ground plane z = 0) and the wavelength.

* :func:`features`, :func:`build_kernel`, :func:`log_marginal_likelihood` (eq. 23);
* :func:`fit` maximizes eq. (23) jointly over the log hyperparameters and the L CPOs;
* :class:`GPPhaseModel` (eqs. 25-27) is a **PhaseModel** built from tinygp's conditioned
  mean and kernel, so simulation, the MLE and refinement use it unchanged.

Shapes: training positions ``x`` (L, 3), phases ``r`` (L, M), noise variances (L, M).
Observations are flattened UE-major, ``q = i M + m`` as in the paper.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tinygp
from jax import Array
from jax.typing import ArrayLike
from tinygp import kernels, transforms

from dmimo_jax._checks import check_finite, check_positions
from dmimo_jax.phase import angle_diff, circular_mean, wrap
from dmimo_jax.physics import _safe_norm, geometry, noise_var_from_amplitude
from dmimo_jax.scene import Scene

__all__ = [
    "GPParams",
    "features",
    "los_phase",
    "los_noise_var",
    "build_kernel",
    "residuals",
    "log_marginal_likelihood",
    "initial_cpos",
    "initial_params",
    "profile_cpos",
    "GPFit",
    "fit",
    "GPPhaseModel",
    "GPPosterior",
    "fit_nuts",
    "GPMixtureModel",
    "TabulatedGPModel",
]


class GPParams(NamedTuple):
    r"""Hyperparameters :math:`\psi = [\sigma_f^2, \ell_1^2, \ell_2^2, \ell_3^2]` in log space."""

    log_sigma_f2: Array  # magnitude, rad^2
    log_ell1_sq: Array  # periodic length-scale (dimensionless, in sin^2 units)
    log_ell2_sq: Array  # quasi-periodic decay along Delta d, m^2
    log_ell3_sq: Array  # decay along the incidence angle, rad^2

    @classmethod
    def from_natural(cls, sigma_f2, ell1_sq, ell2_sq, ell3_sq) -> GPParams:
        return cls(*(jnp.log(jnp.asarray(v, float)) for v in (sigma_f2, ell1_sq, ell2_sq, ell3_sq)))

    def natural(self) -> dict[str, float]:
        """The four hyperparameters as plain floats (for reports)."""
        names = ("sigma_f2", "ell1_sq", "ell2_sq", "ell3_sq")
        return {n: float(jnp.exp(v)) for n, v in zip(names, self, strict=True)}


def features(x: ArrayLike, scene: Scene) -> Array:
    r"""GP inputs :math:`[\Delta d_m, \gamma_m]` (M, 2) for one UE position ``x`` (3,).

    :math:`\Delta d = d^{(2)} - d^{(1)}` (m, computed as :math:`4 z z_m/(d^{(1)}+d^{(2)})`
    without cancellation) and :math:`\gamma = \arccos((z + z_m)/d^{(2)})` (rad), evaluated
    as ``atan2(horizontal distance, z + z_m)`` so that its gradient stays finite straight
    below an AP.
    """
    x = jnp.asarray(x, scene.ap_positions.dtype)
    geo = geometry(x, scene)
    ap = scene.ap_positions
    horizontal = _safe_norm(ap[:, :2] - x[None, :2])
    gamma = jnp.arctan2(horizontal, x[2] + ap[:, 2])
    return jnp.stack([geo.path_difference, gamma], axis=-1)


def los_phase(x: ArrayLike, scene: Scene) -> Array:
    r"""LoS carrier phase :math:`2\pi d^{(1)}_m/\lambda` (M,), unwrapped."""
    return 2 * jnp.pi / scene.wavelength * geometry(x, scene).d1


def los_noise_var(x: ArrayLike, scene: Scene) -> Array:
    r"""Phase-noise variance of eq. (9) with the LoS amplitude :math:`\lambda/(4\pi d^{(1)})` (M,).

    What a model that does not know :math:`\varepsilon_r` can say about the noise at a new
    position (the reflection changes the true amplitude by a factor :math:`|1+\rho|`).
    """
    return noise_var_from_amplitude(scene.wavelength / (4 * jnp.pi * geometry(x, scene).d1), scene)


def build_kernel(params: GPParams, wavelength: ArrayLike) -> kernels.Kernel:
    r"""The quasi-periodic product kernel of eq. (22) on inputs ``[Delta d, gamma]``.

    :math:`k_{pe}(\Delta d\mid\ell_1^2) = \exp(-\tfrac{2}{\ell_1^2}\sin^2(\pi(\Delta d - \Delta d')/\lambda))`
    is tinygp's ``ExpSineSquared(scale=lambda, gamma=2/ell1^2)``; :math:`k_{se}(\cdot\mid\ell^2)`
    is ``ExpSquared(scale=ell)``; ``Subspace`` picks the feature each factor sees.
    """
    sigma_f2, ell1_sq, ell2_sq, ell3_sq = (jnp.exp(p) for p in params)
    k_pe = kernels.ExpSineSquared(scale=wavelength, gamma=2.0 / ell1_sq)
    k_se_dd = kernels.ExpSquared(scale=jnp.sqrt(ell2_sq))
    k_se_gamma = kernels.ExpSquared(scale=jnp.sqrt(ell3_sq))
    return (
        sigma_f2
        * transforms.Subspace(0, k_pe)
        * transforms.Subspace(0, k_se_dd)
        * transforms.Subspace(1, k_se_gamma)
    )


def residuals(x: ArrayLike, r: ArrayLike, cpo: ArrayLike, scene: Scene) -> Array:
    r""":math:`\upsilon_{m,i} = \mathrm{wrap}(r_{m,i} - 2\pi d^{(1)}_{m,i}/\lambda - \phi_i)`, eq. (24a), (L, M)."""
    los = jax.vmap(los_phase, in_axes=(0, None))(x, scene)
    return wrap(jnp.asarray(r) - los - jnp.asarray(cpo)[:, None])


def _flat_features(x: Array, scene: Scene) -> Array:
    return jax.vmap(features, in_axes=(0, None))(x, scene).reshape(-1, 2)


def _training_gp(params: GPParams, x: Array, noise_var: Array, scene: Scene):
    kernel = build_kernel(params, scene.wavelength)
    return tinygp.GaussianProcess(kernel, _flat_features(x, scene), diag=noise_var.reshape(-1))


def log_marginal_likelihood(
    params: GPParams, cpo: ArrayLike, x: ArrayLike, r: ArrayLike, noise_var: ArrayLike, scene: Scene
) -> Array:
    r"""Log marginal likelihood :math:`\mathcal L_{\mathbf r} = \log p(\mathbf r\mid\phi,\psi)`, eq. (23).

    :math:`\mathbf K_{\mathbf r} = k(\mathbf s_q, \mathbf s_{q'}) + \delta_{qq'}\sigma^2_{m,i}`
    (eq. 24b) with the known per-observation noise on the diagonal. Differentiable in
    ``params`` and ``cpo`` (the gradients of eqs. 23b-c come from autodiff).
    """
    x, noise_var = jnp.asarray(x), jnp.asarray(noise_var)
    gp = _training_gp(params, x, noise_var, scene)
    return gp.log_probability(residuals(x, r, cpo, scene).reshape(-1))


def _check_training_data(x: Any, r: Any, noise_var: Any, num_aps: int) -> None:
    check_positions("x", x, batched=True)
    x = np.asarray(x)
    if x.shape[0] < 2:
        raise ValueError(f"need at least L = 2 training locations, got x with shape {x.shape}")
    for name, v in (("r", r), ("noise_var", noise_var)):
        v = np.asarray(v)
        if v.shape != (x.shape[0], num_aps):
            raise ValueError(
                f"{name} must have shape {(x.shape[0], num_aps)} (L, M), got {v.shape}"
            )
        check_finite(name, v)
    if np.any(np.asarray(noise_var) <= 0):
        raise ValueError("noise_var must be positive (rad^2)")


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
    f = _flat_features(jnp.asarray(x), scene)
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
    gp = _training_gp(params, x, noise_var, scene)
    y = residuals(x, r, cpo0, scene).reshape(-1)
    a = jnp.repeat(jnp.eye(num_loc, dtype=y.dtype), m, axis=0)  # (LM, L), q = i M + m
    w = gp.solver.solve_triangular(a)
    z = gp.solver.solve_triangular(y)
    return cpo0 + jnp.linalg.solve(w.T @ w, w.T @ z)


class GPFit(NamedTuple):
    """Output of :func:`fit`."""

    params: GPParams
    cpo: Array  # (L,) estimated CPOs, wrapped
    log_likelihood: Array  # () final eq. (23)
    history: Array  # (steps,) eq. (23) per L-BFGS step of the best restart
    seconds: float  # wall time of the fit (compile included)


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
        key: PRNG key for the restarts (default ``jax.random.key(0)``).
        init: override the first start's hyperparameters.

    Raises:
        ValueError: L < 2, shapes that do not match (L, M), non-finite or non-positive inputs.
    """
    _check_training_data(x, r, noise_var, scene.num_aps)
    if not (isinstance(num_restarts, int) and num_restarts >= 1):
        raise ValueError(f"num_restarts must be a positive int, got {num_restarts!r}")
    if not (isinstance(num_steps, int) and num_steps >= 1):
        raise ValueError(f"num_steps must be a positive int, got {num_steps!r}")
    x, r, noise_var = (jnp.asarray(v, scene.ap_positions.dtype) for v in (x, r, noise_var))
    t0 = time.perf_counter()
    base = initial_params(x, r, scene) if init is None else init
    cpo0 = initial_cpos(x, r, scene)
    key = jax.random.key(0) if key is None else key
    jitter = jax.random.normal(key, (num_restarts, 4), x.dtype).at[0].set(0.0)
    best = None
    for s in range(num_restarts):
        params0 = GPParams(*(jnp.asarray(b) + jitter[s, j] for j, b in enumerate(base)))
        params, history = _fit_lbfgs(params0, cpo0, x, r, noise_var, scene, num_steps, rtol)
        history = history[jnp.isfinite(history)]
        if best is None or (history.size and history[-1] > best[1][-1]):
            best = (params, history)
    params, history = best
    cpo = profile_cpos(params, cpo0, x, r, noise_var, scene)
    final = log_marginal_likelihood(params, cpo, x, r, noise_var, scene)
    jax.block_until_ready(final)
    return GPFit(params, wrap(cpo), final, history, time.perf_counter() - t0)


@partial(jax.jit, static_argnames=("num_steps",))
def _fit_lbfgs(params0, cpo0, x, r, noise_var, scene, num_steps, rtol):
    def loss(params):
        cpo = jax.lax.stop_gradient(profile_cpos(params, cpo0, x, r, noise_var, scene))
        return -log_marginal_likelihood(params, cpo, x, r, noise_var, scene)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    def step(carry):
        params, state, _, value, k, history = carry
        new_value, grad = value_and_grad(params, state=state)
        updates, state = opt.update(grad, state, params, value=new_value, grad=grad, value_fn=loss)
        history = history.at[k].set(-new_value)
        return optax.apply_updates(params, updates), state, value, new_value, k + 1, history

    def keep_going(carry):  # stop when an iteration changes eq. (23) by < rtol (relative)
        _, _, prev, value, k, _ = carry
        return (k < 2) | ((k < num_steps) & (jnp.abs(prev - value) > rtol * jnp.abs(value)))

    inf = jnp.asarray(jnp.inf, x.dtype)
    history = jnp.full((num_steps,), jnp.nan, x.dtype)
    init = (params0, opt.init(params0), inf, inf, jnp.zeros((), jnp.int32), history)
    params, _, _, _, _, history = jax.lax.while_loop(keep_going, step, init)
    return params, history


@jax.tree_util.register_pytree_with_keys_class
class GPPhaseModel:
    r"""The GP carrier-phase model as a **PhaseModel** (eqs. 25-27).

    ``mean(x)`` :math:`= 2\pi d^{(1)}/\lambda + \mathbb E[g(\mathbf s)]` (eq. 26 without the
    CPO), ``variance(x)`` :math:`= \sigma^2_{\mathrm{LoS}}(\mathbf x) + \mathbb V[g(\mathbf s)]`
    (eq. 27, with :func:`los_noise_var` as the noise a new position would carry). The
    predictive mean and variance are tinygp's conditioned mean and kernel
    (``GaussianProcess.condition``), with :math:`\mathbf K_{\mathbf r}^{-1}\upsilon` and
    the Cholesky factor computed once: a mean costs O(LM) per AP, a variance O((LM)^2).

    Build with :meth:`from_fit` or :meth:`from_data`.
    """

    def __init__(self, scene: Scene, params: GPParams, alpha: Array, cond_kernel: Any):
        self.scene = scene
        self.params = params
        self.alpha = alpha  # K_r^{-1} upsilon (LM,), from tinygp's conditioning
        self.cond_kernel = cond_kernel  # tinygp kernels.Conditioned: X, Cholesky solver, kernel

    @classmethod
    def from_data(
        cls,
        params: GPParams,
        cpo: ArrayLike,
        x: ArrayLike,
        r: ArrayLike,
        noise_var: ArrayLike,
        scene: Scene,
    ) -> GPPhaseModel:
        """Condition the GP of ``params`` on L training snapshots with known/estimated CPOs."""
        _check_training_data(x, r, noise_var, scene.num_aps)
        x, noise_var = jnp.asarray(x), jnp.asarray(noise_var)
        gp = _training_gp(params, x, noise_var, scene)
        cond = gp.condition(residuals(x, r, cpo, scene).reshape(-1)).gp
        return cls(scene, params, cond.mean_function.alpha, cond.kernel)

    @classmethod
    def from_fit(
        cls, result: GPFit, x: ArrayLike, r: ArrayLike, noise_var: ArrayLike, scene: Scene
    ):
        """The model of a :func:`fit` result on the same training data."""
        return cls.from_data(result.params, result.cpo, x, r, noise_var, scene)

    @property
    def num_aps(self) -> int:
        return self.scene.num_aps

    def perturbation(self, x: ArrayLike) -> tuple[Array, Array]:
        r"""Predictive mean and variance of :math:`g` at (x, every AP): eqs. (25a-b), (M,), (M,)."""
        f = features(x, self.scene)
        return self._mean_g(f), self._var_g(f)

    def _var_g(self, f: Array) -> Array:
        """Eq. (25b) at features f (M, 2), via tinygp's conditioned kernel."""
        return jnp.maximum(jax.vmap(self.cond_kernel.evaluate_diag)(f), 0.0)

    def _mean_g(self, f: Array) -> Array:
        """Eq. (25a) at features f (M, 2): k_p^T K_r^{-1} upsilon (tinygp's conditioned mean)."""
        k = self.cond_kernel.kernel
        cross = jax.vmap(jax.vmap(k.evaluate, in_axes=(None, 0)), in_axes=(0, None))
        return cross(f, self.cond_kernel.X) @ self.alpha

    def mean(self, x: ArrayLike) -> Array:
        """Eq. (26) without the CPO, unwrapped (M,)."""
        return los_phase(x, self.scene) + self._mean_g(features(x, self.scene))

    def variance(self, x: ArrayLike) -> Array:
        """Eq. (27) (M,), rad^2."""
        return los_noise_var(x, self.scene) + self._var_g(features(x, self.scene))

    def tree_flatten_with_keys(self):
        keys = ("scene", "params", "alpha", "cond_kernel")
        return tuple((jax.tree_util.GetAttrKey(k), getattr(self, k)) for k in keys), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


@jax.tree_util.register_pytree_with_keys_class
class TabulatedGPModel:
    r"""The GP mean of eq. (26) read from a table over the GP inputs (Delta d, gamma).

    The GP is shared by all APs and sees a position only through the two features of
    eqs. (19-20), so :math:`\mathbb E[g]` is a function on a 2D box. Tabulated once on a
    regular grid (bilinear interpolation, clamped at the edges), a mean costs the geometry
    plus four look-ups per AP instead of L M kernel evaluations: cheap enough to screen a
    window of thousands of candidate positions per snapshot (the online safeguard of
    :mod:`dmimo_jax.pipeline`). The default spacing :math:`\lambda/256` in Delta d keeps
    the interpolation error below :math:`\sigma_f (2\pi/256)^2/8\approx 10^{-4}` rad.

    ``variance`` is the LoS phase-noise variance only (no :math:`\mathbb V[g]`): this
    model screens and pre-refines, the exact :class:`GPPhaseModel` does the final fit.

    Build with :meth:`from_model`.
    """

    def __init__(self, scene: Scene, values: Array, lower: Array, step: Array):
        self.scene = scene
        self.values = values  # (n_dd, n_gamma) E[g] on the grid
        self.lower = lower  # (2,) first node (Delta d, gamma)
        self.step = step  # (2,) node spacing

    @classmethod
    def from_model(
        cls,
        model: GPPhaseModel,
        *,
        max_path_difference: float | None = None,
        dd_step: float | None = None,
        num_gamma: int = 128,
        chunk: int = 4096,
    ) -> TabulatedGPModel:
        """Tabulate ``model``'s mean perturbation.

        Args:
            model: the fitted GP PhaseModel.
            max_path_difference: largest Delta d, m (default 2 z_max + 0.5 m with z_max the
                top of the scene's UE region: Delta d <= 2 z for a ceiling AP).
            dd_step: Delta d spacing, m (default lambda / 256).
            num_gamma: nodes over gamma in [0, pi/2].
            chunk: nodes per evaluation batch (bounds memory at chunk x L M).
        """
        if not isinstance(model, GPPhaseModel):
            raise ValueError(f"model must be a GPPhaseModel, got {type(model).__name__}")
        scene = model.scene
        dd_max = (
            2 * float(scene.ue_high[2]) + 0.5
            if max_path_difference is None
            else max_path_difference
        )
        h = float(scene.wavelength) / 256 if dd_step is None else dd_step
        if not (dd_max > 0 and h > 0 and isinstance(num_gamma, int) and num_gamma >= 2):
            raise ValueError("max_path_difference, dd_step must be > 0 and num_gamma an int >= 2")
        dd = jnp.arange(int(np.ceil(dd_max / h)) + 1) * h
        gamma = jnp.linspace(0.0, jnp.pi / 2, num_gamma)
        f = jnp.stack(jnp.meshgrid(dd, gamma, indexing="ij"), axis=-1).reshape(-1, 2)
        values = _tabulate(model, f, chunk)
        lower = jnp.zeros(2, dd.dtype)
        step = jnp.array([h, float(gamma[1] - gamma[0])])
        return cls(scene, values.reshape(dd.shape[0], num_gamma), lower, step)

    @property
    def num_aps(self) -> int:
        return self.scene.num_aps

    def _interp(self, f: Array) -> Array:
        n = jnp.broadcast_to(jnp.array(self.values.shape), f.shape)
        u = (f - jnp.broadcast_to(self.lower, f.shape)) / jnp.broadcast_to(self.step, f.shape)
        u = jnp.clip(u, 0.0, n - 1.0)
        i0 = jnp.minimum(jnp.floor(u).astype(jnp.int32), n - 2)
        w = u - i0
        v = self.values
        a, b = i0[..., 0], i0[..., 1]
        top = v[a, b] * (1 - w[..., 1]) + v[a, b + 1] * w[..., 1]
        bottom = v[a + 1, b] * (1 - w[..., 1]) + v[a + 1, b + 1] * w[..., 1]
        return top * (1 - w[..., 0]) + bottom * w[..., 0]

    def mean(self, x: ArrayLike) -> Array:
        """Eq. (26) without the CPO, with the tabulated E[g] (M,)."""
        return los_phase(x, self.scene) + self._interp(features(x, self.scene))

    def variance(self, x: ArrayLike) -> Array:
        """LoS phase-noise variance (M,) (see the class notes)."""
        return los_noise_var(x, self.scene)

    def tree_flatten_with_keys(self):
        keys = ("scene", "values", "lower", "step")
        return tuple((jax.tree_util.GetAttrKey(k), getattr(self, k)) for k in keys), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)


@partial(jax.jit, static_argnames=("chunk",))
def _tabulate(model: GPPhaseModel, f: Array, chunk: int) -> Array:
    k = model.cond_kernel.kernel
    row = lambda fi: jax.vmap(k.evaluate, in_axes=(None, 0))(fi, model.cond_kernel.X) @ model.alpha
    return jax.lax.map(row, f, batch_size=chunk)


# ----------------------------------------------------------------------------- Bayesian option


class GPPosterior(NamedTuple):
    """Output of :func:`fit_nuts`: posterior draws (leading axis = draws)."""

    params: GPParams  # each field (S,)
    cpo: Array  # (S, L)
    diverging: Array  # (S,) bool, NUTS divergences
    seconds: float


def fit_nuts(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    *,
    key: Array,
    num_warmup: int = 300,
    num_samples: int = 300,
    prior_scale: float = 2.0,
    init: GPFit | None = None,
    progress: bool = False,
) -> GPPosterior:
    r"""Hyperparameter inference by NUTS (numpyro), next to the point estimate of :func:`fit`.

    Model: :math:`\log\psi_j \sim \mathcal N(\log\psi_j^{(0)}, s^2)` around the data-driven
    start values (:func:`initial_params`, ``s = prior_scale``); CPOs
    :math:`\phi_i \sim \mathcal U[-\pi, \pi)` as latent variables; the likelihood is eq. (23)
    (tinygp), added with ``numpyro.factor``. The chain starts at the point estimate
    (``init``, or a fresh :func:`fit`), which saves most of the warm-up.
    """
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS, init_to_value

    _check_training_data(x, r, noise_var, scene.num_aps)
    x, r, noise_var = (jnp.asarray(v, scene.ap_positions.dtype) for v in (x, r, noise_var))
    t0 = time.perf_counter()
    start = fit(x, r, noise_var, scene) if init is None else init
    center = initial_params(x, r, scene)
    names = GPParams._fields

    def model():
        params = GPParams(
            *(
                numpyro.sample(n, dist.Normal(c, prior_scale))
                for n, c in zip(names, center, strict=True)
            )
        )
        cpo = numpyro.sample("cpo", dist.Uniform(-jnp.pi, jnp.pi).expand([x.shape[0]]).to_event(1))
        numpyro.factor(
            "log_marginal_likelihood", log_marginal_likelihood(params, cpo, x, r, noise_var, scene)
        )

    values = dict(zip(names, start.params, strict=True))
    values["cpo"] = jnp.clip(start.cpo, -jnp.pi + 1e-6, jnp.pi - 1e-6)
    kernel = NUTS(model, init_strategy=init_to_value(values=values))
    mcmc = MCMC(kernel, num_warmup=num_warmup, num_samples=num_samples, progress_bar=progress)
    mcmc.run(key, extra_fields=("diverging",))
    draws = mcmc.get_samples()
    params = GPParams(*(draws[n] for n in names))
    diverging = mcmc.get_extra_fields()["diverging"]
    return GPPosterior(params, draws["cpo"], diverging, time.perf_counter() - t0)


@jax.tree_util.register_pytree_with_keys_class
class GPMixtureModel:
    r"""A PhaseModel averaging :class:`GPPhaseModel` s over posterior draws (moment matched).

    ``mean`` = average of the draws' means; ``variance`` = average variance + variance of
    the means (law of total variance).
    """

    def __init__(self, stacked: GPPhaseModel):
        self.stacked = stacked  # a GPPhaseModel whose leaves carry a leading draw axis

    @classmethod
    def from_posterior(
        cls,
        post: GPPosterior,
        x: ArrayLike,
        r: ArrayLike,
        noise_var: ArrayLike,
        scene: Scene,
        *,
        num_draws: int = 20,
    ) -> GPMixtureModel:
        """Condition ``num_draws`` evenly thinned draws on the training data and stack them."""
        total = post.cpo.shape[0]
        pick = np.linspace(0, total - 1, min(num_draws, total)).astype(int)
        # a constant c moved between all CPOs and g leaves eq. (23) almost unchanged (only
        # the zero-mean prior pins it): align every draw's CPOs to the first draw's gauge so
        # that the spread of the draws' means does not count that arbitrary constant
        ref = post.cpo[pick[0]]
        models = []
        for i in pick:
            cpo = post.cpo[i] - circular_mean(angle_diff(post.cpo[i], ref))
            params = GPParams(*(v[i] for v in post.params))
            models.append(GPPhaseModel.from_data(params, cpo, x, r, noise_var, scene))
        return cls(jax.tree.map(lambda *leaves: jnp.stack(leaves), *models))

    @property
    def num_aps(self) -> int:
        return self.stacked.scene.ap_positions.shape[-2]

    def _each(self, fn, x):
        return jax.vmap(lambda m: fn(m, x))(self.stacked)

    def mean(self, x: ArrayLike) -> Array:
        return jnp.mean(self._each(GPPhaseModel.mean, x), axis=0)

    def variance(self, x: ArrayLike) -> Array:
        means = self._each(GPPhaseModel.mean, x)
        return jnp.mean(self._each(GPPhaseModel.variance, x), axis=0) + jnp.var(means, axis=0)

    def tree_flatten_with_keys(self):
        return ((jax.tree_util.GetAttrKey("stacked"), self.stacked),), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(*children)
