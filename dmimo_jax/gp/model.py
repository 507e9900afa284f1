r"""The GP carrier-phase model as PhaseModels (eqs. 25-27): exact and tabulated."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax.gp.fit import GPFit
from dmimo_jax.gp.kernel import (
    MAX_COVARIANCE_BYTES,
    GPParams,
    check_covariance_size,
    check_params,
    check_training_data,
    features,
    los_noise_var,
    los_phase,
    residuals,
    training_process,
)
from dmimo_jax.pytree import pytree_dataclass
from dmimo_jax.scene import Scene

__all__ = ["GPMeanModel", "GPPhaseModel", "TabulatedGPModel"]


@pytree_dataclass
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

    scene: Scene
    params: GPParams
    alpha: Array  # K_r^{-1} upsilon (LM,), from tinygp's conditioning
    cond_kernel: Any  # tinygp kernels.Conditioned: X, Cholesky solver, kernel

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
        check_training_data(x, r, noise_var, scene.num_aps)
        check_covariance_size(np.shape(x)[0], scene.num_aps, MAX_COVARIANCE_BYTES)
        check_params("params", params)
        gp = training_process(params, x, noise_var, scene)
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


@pytree_dataclass
class TabulatedGPModel:
    r"""The GP mean of eq. (26) read from a table over the GP inputs (Delta d, gamma).

    The GP is shared by all APs and sees a position only through the two features of
    eqs. (19-20), so :math:`\mathbb E[g]` is a function on a 2D box. Tabulated once on a
    regular grid (bilinear interpolation, clamped at the edges), a mean costs the geometry
    plus four look-ups per AP instead of L M kernel evaluations: cheap enough to screen a
    window of thousands of candidate positions per snapshot (the online safeguard,
    :func:`~dmimo_jax.estimators.window_search`). The default spacing :math:`\lambda/256` in Delta d keeps
    the interpolation error below :math:`\sigma_f (2\pi/256)^2/8\approx 10^{-4}` rad.

    ``variance`` is the LoS phase-noise variance only (no :math:`\mathbb V[g]`): this
    model screens and pre-refines, the exact :class:`GPPhaseModel` does the final fit.

    Build with :meth:`from_model`.
    """

    scene: Scene
    values: Array  # (n_dd, n_gamma) E[g] on the grid
    lower: Array  # (2,) first node (Delta d, gamma)
    step: Array  # (2,) node spacing

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


@partial(jax.jit, static_argnames=("chunk",))
def _tabulate(model: GPPhaseModel, f: Array, chunk: int) -> Array:
    k = model.cond_kernel.kernel
    row = lambda fi: jax.vmap(k.evaluate, in_axes=(None, 0))(fi, model.cond_kernel.X) @ model.alpha
    return jax.lax.map(row, f, batch_size=chunk)


@pytree_dataclass
class GPMeanModel:
    r"""The exact GP mean of eq. (26) with the LoS phase-noise variance only (no
    :math:`\mathbb V[g]`): the cheap exact model of a fine stage (beyond the paper).

    :class:`GPPhaseModel`'s predictive variance (eq. 27) needs M triangular solves against
    the (LM x LM) Cholesky factor at every evaluation, which dominates a refinement step;
    its mean is one cross-kernel product. On noise-free snapshots both refine to the
    same point (every residual vanishes there, whatever the weights).
    """

    gp: GPPhaseModel

    @property
    def scene(self) -> Scene:
        return self.gp.scene

    @property
    def num_aps(self) -> int:
        return self.gp.num_aps

    def mean(self, x: ArrayLike) -> Array:
        """Eq. (26) without the CPO, unwrapped (M,): the exact GP mean."""
        return self.gp.mean(x)

    def variance(self, x: ArrayLike) -> Array:
        """LoS phase-noise variance (M,), rad^2."""
        return los_noise_var(x, self.gp.scene)
