r"""The GP carrier-phase model as PhaseModels (eqs. 25-27): exact and tabulated."""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.custom_derivatives import SymbolicZero
from jax.typing import ArrayLike

from dmimo_jax._checks import check_positions, is_concrete
from dmimo_jax.gp.fit import GPFit
from dmimo_jax.gp.kernel import (
    MAX_COVARIANCE_BYTES,
    GPParams,
    check_covariance_size,
    check_params,
    check_training_data,
    features,
    kernel_factors,
    los_noise_var,
    los_phase,
    residuals,
    training_process,
)
from dmimo_jax.pytree import pytree_dataclass
from dmimo_jax.scene import Scene


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
    alpha: Array
    """K_r^{-1} upsilon (LM,), from tinygp's conditioning."""
    cond_kernel: Any
    """tinygp's kernels.Conditioned: X, Cholesky solver, kernel."""

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
        return cls(scene, params, *_condition(params, cpo, x, r, noise_var, scene))

    @classmethod
    def from_fit(
        cls, result: GPFit, x: ArrayLike, r: ArrayLike, noise_var: ArrayLike, scene: Scene
    ):
        """The model of a :func:`fit` result on the same training data."""
        return cls.from_data(result.params, result.cpo, x, r, noise_var, scene)

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.scene.num_aps

    def perturbation(self, x: ArrayLike) -> tuple[Array, Array]:
        r"""Predictive mean and variance of :math:`g` at (x, every AP): eqs. (25a-b), (M,), (M,)."""
        check_positions("x", x, batched=False)
        return self._perturbation(x)

    # perturbation, mean and variance check x, then run one compiled program per model and
    # shape (outside jit: a script, an eager vmap) instead of an eager dispatch per operation
    @jax.jit
    def _perturbation(self, x: ArrayLike) -> tuple[Array, Array]:
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
        check_positions("x", x, batched=False)
        return self._mean(x)

    @jax.jit
    def _mean(self, x: ArrayLike) -> Array:
        return los_phase(x, self.scene) + self._mean_g(features(x, self.scene))

    def variance(self, x: ArrayLike) -> Array:
        """Eq. (27) (M,), rad^2."""
        check_positions("x", x, batched=False)
        return self._variance(x)

    @jax.jit
    def _variance(self, x: ArrayLike) -> Array:
        return los_noise_var(x, self.scene) + self._var_g(features(x, self.scene))


@jax.jit
def _condition(params, cpo, x, r, noise_var, scene) -> tuple[Array, Any]:
    """tinygp's conditioning of the training process on the residuals: ``alpha`` and the
    conditioned kernel of :class:`GPPhaseModel` (unchecked, one compiled program)."""
    gp = training_process(params, x, noise_var, scene)
    cond = gp.condition(residuals(x, r, cpo, scene).reshape(-1)).gp
    return cond.mean_function.alpha, cond.kernel


@pytree_dataclass
class TabulatedGPModel:
    r"""The GP model of eqs. (25-27) read from tables over the GP inputs (Delta d, gamma).

    The GP is shared by all APs and sees a position only through the two features of
    eqs. (19-20), so its predictive mean :math:`\mathbb E[g]` (eq. 25a) and variance
    :math:`\mathbb V[g]` (eq. 25b) are functions on a 2D box. Tabulated once on regular
    grids, a mean or a variance costs the geometry plus a few look-ups per AP instead of
    L M kernel evaluations (the mean) or M triangular solves against the (LM x LM)
    Cholesky factor (the variance): cheap enough to screen thousands of candidate
    positions per snapshot (the online safeguard,
    :func:`~dmimo_jax.estimators.window_search`) and to run the whole ML refinement of
    eq. (17) on tables (the cheap fine stage). The mean is read by cubic convolution
    (:func:`interpolate`, a continuous gradient for Gauss-Newton) from a
    :math:`\lambda/256` x 128 grid: 1.6e-7 rad RMS and 1.4e-5 rad worst error from the
    exact mean over 2,000 UEs of the paper's scene (L = 50), against a phase-noise
    standard deviation of 5e-4 rad at -10 dBm. The variance, a weight of the cost, is read
    bilinearly from a :math:`\lambda/64` x 128 grid (there: eq. (27) to 0.09% median and
    3.6% for 99% of the (UE, AP) pairs; the worst pairs sit straight below an AP, where
    V[g] changes fast with gamma).

    ``variance`` is eq. (27), :math:`\sigma^2_{\mathrm{LoS}}(\mathbf x) + \mathbb V[g]`, when
    the variance table was built (``from_model(..., variance=True)``, the default), and the
    LoS phase-noise variance alone otherwise.

    Build with :meth:`from_model`.
    """

    scene: Scene
    values: Array
    """(n_dd, n_gamma) E[g] on the grid."""
    lower: Array
    """(2,) first node (Delta d, gamma)."""
    step: Array
    """(2,) node spacing."""
    var_values: Array | None = None
    """(n_dd', n_gamma') V[g] on its own grid, or None."""
    var_step: Array | None = None
    """(2,) its node spacing (first node: lower)."""

    @classmethod
    def from_model(
        cls,
        model: GPPhaseModel,
        *,
        max_path_difference: float | None = None,
        dd_step: float | None = None,
        num_gamma: int = 128,
        variance: bool = True,
        var_dd_step: float | None = None,
        var_num_gamma: int = 128,
        chunk: int = 4096,
    ) -> TabulatedGPModel:
        """Tabulate ``model``'s predictive mean (and variance) of the perturbation.

        Args:
            model: the fitted GP PhaseModel.
            max_path_difference: largest Delta d, m. Delta d <= 2 min(z, z_m) for a UE at
                height z and an AP at z_m, so the default, 2 max_m z_m (plus a few nodes),
                covers a UE anywhere in the room; a smaller value must still cover the UE
                region (2 min(z_max, max_m z_m), z_max its top).
            dd_step: Delta d spacing of the mean, m (default lambda / 256).
            num_gamma: mean nodes over gamma in [0, pi/2].
            variance: also tabulate V[g] (eq. 25b).
            var_dd_step: Delta d spacing of the variance, m (default lambda / 64).
            var_num_gamma: variance nodes over gamma.
            chunk: nodes per evaluation batch (bounds memory at chunk x L M).
        """
        if not isinstance(model, GPPhaseModel):
            raise ValueError(f"model must be a GPPhaseModel, got {type(model).__name__}")
        grids = table_grids(
            model.scene,
            max_path_difference=max_path_difference,
            dd_step=dd_step,
            num_gamma=num_gamma,
            var_dd_step=var_dd_step,
            var_num_gamma=var_num_gamma,
        )
        if not variance:
            grids["var_dd_step"] = None
        return cls.tabulate(model, **grids, chunk=chunk)

    @classmethod
    def tabulate(
        cls,
        model: GPPhaseModel,
        *,
        max_path_difference: float,
        dd_step: float,
        num_gamma: int,
        var_dd_step: float | None,
        var_num_gamma: int,
        chunk: int = 4096,
    ) -> TabulatedGPModel:
        """:meth:`from_model`'s tables on grids given in full, unchecked and traceable.

        Every argument but ``model`` is a Python number (the grids' shapes), so many
        models of one shape tabulate in one compiled program
        (:func:`~dmimo_jax.tiles.fit_tiles`). ``var_dd_step=None``: no variance table.
        :meth:`from_model` checks and defaults the arguments, then calls this.
        """
        values, step = _grid_values(
            model, max_path_difference, dd_step, num_gamma, chunk, _mean_rows
        )
        var_values = var_step = None
        if var_dd_step is not None:
            var_values, var_step = _grid_values(
                model, max_path_difference, var_dd_step, var_num_gamma, chunk, _var_rows
            )
        lower = jnp.zeros(2, values.dtype)
        return cls(model.scene, values, lower, step, var_values, var_step)

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.scene.num_aps

    @property
    def has_variance(self) -> bool:
        """Whether ``variance`` includes the tabulated V[g] (eq. 27) or is the LoS part only."""
        return self.var_values is not None

    @property
    def max_path_difference(self) -> float:
        """The largest Delta d (m) both tables cover."""
        top = (self.values.shape[0] - 1) * float(self.step[0])
        if self.var_values is not None:
            top = min(top, (self.var_values.shape[0] - 1) * float(self.var_step[0]))
        return top

    def _features(self, x: ArrayLike) -> Array:
        f = features(x, self.scene)
        if is_concrete(f):  # concrete positions: refuse what the tables do not cover
            dd = float(np.max(np.asarray(f)[:, 0]))
            if dd > self.max_path_difference * (1 + 1e-9):
                raise ValueError(
                    f"x = {np.asarray(x).tolist()} has a path difference of {dd:.4g} m, beyond "
                    f"the tables' {self.max_path_difference:.4g} m: tabulate with a larger "
                    "max_path_difference (from_model's default covers the whole room)"
                )
        return f

    def mean(self, x: ArrayLike) -> Array:
        """Eq. (26) without the CPO, with the tabulated E[g] (M,).

        Raises:
            ValueError: a concrete ``x`` outside the tables (:attr:`max_path_difference`).
        """
        f = self._features(x)
        return los_phase(x, self.scene) + interpolate(
            self.values, self.lower, self.step, f, cubic=True
        )

    def variance(self, x: ArrayLike) -> Array:
        """Eq. (27) with the tabulated V[g] (M,), rad^2; the LoS part alone without the
        variance table (see the class notes)."""
        los = los_noise_var(x, self.scene)
        if self.var_values is None:
            return los
        g = interpolate(self.var_values, self.lower, self.var_step, self._features(x))
        return los + jnp.maximum(g, 0.0)

    def without_variance(self) -> TabulatedGPModel:
        """The same mean table with the LoS variance only (what the screens weigh by)."""
        return TabulatedGPModel(self.scene, self.values, self.lower, self.step)


@partial(jax.jit, static_argnames=("cubic",))  # one program per shape outside jit
def interpolate(
    values: Array, lower: Array, step: Array, f: Array, *, cubic: bool = False
) -> Array:
    """Interpolate a regular 2D table at points f (..., 2), clamped at the edges.

    Bilinear (4 nodes, error O(h^2), a piecewise-constant gradient) or, with ``cubic``,
    Catmull-Rom cubic convolution along both axes (16 nodes, error O(h^3), a continuous
    gradient: what a Gauss-Newton step differentiates). Edge nodes are repeated outside
    the table. Its derivative in ``f`` is the interpolant's own, written out (the weights'
    derivatives against the nodes gathered once), in ``values`` the interpolation of the
    tangent table.

    Args:
        values: (n0, n1) node values, node (i, j) at ``lower + (i, j) * step``; n0, n1 >= 2.
        lower: (2,) first node.
        step: (2,) node spacing.
        f: (..., 2) query points.
        cubic: cubic convolution instead of bilinear.
    """
    n = jnp.broadcast_to(jnp.array(values.shape), f.shape)
    u = (f - jnp.broadcast_to(lower, f.shape)) / jnp.broadcast_to(step, f.shape)
    return _lookup(values, jnp.clip(u, 0.0, n - 1.0), cubic)


def _nodes(values: Array, u: Array, cubic: bool) -> tuple[Array, Array, Array, Array]:
    """The rows ``a`` and columns ``b`` (..., k) of the k x k nodes around the continuous
    indices ``u`` (..., 2) and the weights ``w`` of those nodes along each axis with their
    derivatives in ``u``, ``dw`` (..., 2, k)."""
    last = jnp.broadcast_to(jnp.asarray(values.shape) - 2, u.shape)
    i0 = jnp.minimum(jnp.floor(u).astype(jnp.int32), last)
    t = u - i0
    if cubic:
        offsets = jnp.arange(-1, 3)
        t2, t3 = t * t, t * t * t
        w = jnp.stack(
            [(-t3 + 2 * t2 - t) / 2, (3 * t3 - 5 * t2 + 2) / 2, (-3 * t3 + 4 * t2 + t) / 2,
             (t3 - t2) / 2],
            axis=-1,
        )  # fmt: skip
        dw = jnp.stack(
            [(-3 * t2 + 4 * t - 1) / 2, (9 * t2 - 10 * t) / 2, (-9 * t2 + 8 * t + 1) / 2,
             (3 * t2 - 2 * t) / 2],
            axis=-1,
        )  # fmt: skip
    else:
        offsets = jnp.arange(2)
        w = jnp.stack([1 - t, t], axis=-1)
        dw = jnp.stack([-jnp.ones_like(t), jnp.ones_like(t)], axis=-1)
    offsets = offsets.reshape((1,) * (i0.ndim - 1) + (-1,))
    a = jnp.clip(i0[..., 0, None] + offsets, 0, values.shape[0] - 1)  # (..., k)
    b = jnp.clip(i0[..., 1, None] + offsets, 0, values.shape[1] - 1)
    return a, b, w, dw


def _block(values: Array, a: Array, b: Array) -> Array:
    """The (..., k, k) nodes ``values[a_i, b_j]`` in one gather (k^2 gathers, one per node,
    made every copy of the model in a traced program k^2 times as long)."""
    return values[a[..., :, None], b[..., None, :]]


def _contract(block: Array, w: Array) -> Array:
    """sum_ij w0_i block_ij w1_j of nodes (..., k, k) and weights (..., 2, k)."""
    return jnp.sum(jnp.sum(block * w[..., 1, None, :], axis=-1) * w[..., 0, :], axis=-1)


@partial(jax.custom_jvp, nondiff_argnums=(2,))
def _lookup(values: Array, u: Array, cubic: bool) -> Array:
    r"""The interpolant of :func:`interpolate` at continuous node indices ``u`` (..., 2)
    (clipped to the table: ``0 <= u_i <= n_i - 1``), traceable.

    :math:`v(u) = \sum_{ij} w_i(u_0)\, V_{a_i b_j}\, w_j(u_1)` over the k x k nodes around
    ``u`` (k = 4 cubic, 2 bilinear); its derivative in ``u`` is
    :math:`\partial v/\partial u_0 = \sum_{ij} w_i'(u_0) V_{a_i b_j} w_j(u_1)` (and alike
    in :math:`u_1`), written out (a ``custom_jvp``) so that a linearization costs two sums
    over the nodes gathered once, not a tangent of every node product per direction; in
    ``values`` it is the interpolation of the tangent table. The value is the same
    expression either way (bit-equal)."""
    a, b, w, _ = _nodes(values, u, cubic)
    return _contract(_block(values, a, b), w)


def _lookup_jvp(cubic: bool, primals: tuple, tangents: tuple) -> tuple[Array, Array]:
    values, u = primals
    dvalues, du = tangents
    a, b, w, dw = _nodes(values, u, cubic)
    block = _block(values, a, b)
    along = jnp.sum(block * w[..., 1, None, :], axis=-1)  # (..., k): the second axis summed
    value = jnp.sum(along * w[..., 0, :], axis=-1)
    tangent = jnp.zeros_like(value)
    if not isinstance(du, SymbolicZero):
        d0 = jnp.sum(along * dw[..., 0, :], axis=-1)
        d1 = jnp.sum(jnp.sum(block * dw[..., 1, None, :], axis=-1) * w[..., 0, :], axis=-1)
        tangent = tangent + d0 * du[..., 0] + d1 * du[..., 1]
    if not isinstance(dvalues, SymbolicZero):
        tangent = tangent + _contract(_block(dvalues, a, b), w)
    return value, tangent


_lookup.defjvp(_lookup_jvp, symbolic_zeros=True)


def table_grids(
    scene: Scene,
    *,
    max_path_difference: float | None = None,
    dd_step: float | None = None,
    num_gamma: int = 128,
    var_dd_step: float | None = None,
    var_num_gamma: int = 128,
) -> dict:
    """:meth:`TabulatedGPModel.from_model`'s grids for ``scene``, defaulted and checked on
    the host: ``max_path_difference`` (default 2 max_m z_m plus four nodes of the coarser
    grid), ``dd_step`` (lambda/256), ``num_gamma``, ``var_dd_step`` (lambda/64),
    ``var_num_gamma``, as Python numbers: the keyword arguments of
    :meth:`TabulatedGPModel.tabulate` but ``chunk``.

    Raises:
        ValueError: a step or ``max_path_difference`` not a finite number > 0, one that does
            not cover the UE region (2 min(z_max, max_m z_m)), a node count not an int >= 2.
    """
    lam = float(scene.wavelength)
    h = lam / 256 if dd_step is None else float(dd_step)
    hv = lam / 64 if var_dd_step is None else float(var_dd_step)
    top_ap = float(np.max(np.asarray(scene.ap_positions)[:, 2]))
    dd_max = (
        2 * top_ap + 4 * max(h, hv) if max_path_difference is None else float(max_path_difference)
    )
    for name, v in (("max_path_difference", dd_max), ("dd_step", h), ("var_dd_step", hv)):
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {v}")
    needed = 2 * min(float(scene.ue_high[2]), top_ap)
    if dd_max < needed:
        raise ValueError(
            f"max_path_difference = {dd_max:g} m does not cover the UE region: a UE at its "
            f"top below an AP has Delta d up to {needed:g} m (2 min(z_max, z_AP))"
        )
    for name, n in (("num_gamma", num_gamma), ("var_num_gamma", var_num_gamma)):
        if not (isinstance(n, int) and n >= 2):
            raise ValueError(f"{name} must be an int >= 2, got {n!r}")
    return dict(
        max_path_difference=dd_max,
        dd_step=h,
        num_gamma=num_gamma,
        var_dd_step=hv,
        var_num_gamma=var_num_gamma,
    )


def _grid_values(model, dd_max, h, num_gamma, chunk, rows):
    dd = jnp.arange(int(np.ceil(dd_max / h)) + 1) * h
    gamma = jnp.linspace(0.0, jnp.pi / 2, num_gamma)
    values = rows(model, dd, gamma, chunk)
    return values, jnp.stack([jnp.asarray(h, gamma.dtype), gamma[1] - gamma[0]])


@partial(jax.jit, static_argnames=("chunk",))
def _mean_rows(model: GPPhaseModel, dd: Array, gamma: Array, chunk: int) -> Array:
    # eq. (25a) on the grid: with the separable kernel (kernel_factors) the cross-covariance
    # of node (dd_i, gamma_j) with training input n is a_in b_jn, so the table is
    # (a * alpha) b^T, a matrix product per block of Delta d rows
    k_dd, k_gamma = kernel_factors(model.params, model.scene.wavelength)
    x = model.cond_kernel.X
    b = k_gamma(gamma, x[:, 1]) * model.alpha[None, :]  # (num_gamma, L M)
    row = lambda d: k_dd(d[None], x[:, 0])[0] @ b.T
    # lax.map's own chunks (full ones and a remainder), not pytree.map_in_chunks' equal ones:
    # a row sums L M terms of large alternating weights (alpha), so its rounding follows the
    # chunk's shape; with these chunks the tiles' tables made in one program (tiles.fit_tiles)
    # equal those made one at a time to the slow test's 1e-10 rad, with equal ones they do
    # not (test_fit_tiles_in_one_program_is_one_tile_at_a_time; the CHANGELOG has the numbers)
    return jax.lax.map(row, dd, batch_size=max(1, chunk // gamma.shape[0]))


@partial(jax.jit, static_argnames=("chunk",))
def _var_rows(model: GPPhaseModel, dd: Array, gamma: Array, chunk: int) -> Array:
    # eq. (25b) in blocks: k(f, f) - |L^{-1} k(X, f)|^2 with one triangular solve per block
    f = jnp.stack(jnp.meshgrid(dd, gamma, indexing="ij"), axis=-1).reshape(-1, 1, 2)
    values = jax.lax.map(model._var_g, f, batch_size=chunk)[:, 0]  # chunks: see _mean_rows
    return values.reshape(dd.shape[0], gamma.shape[0])


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
        """The deployment the model describes."""
        return self.gp.scene

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.gp.num_aps

    def mean(self, x: ArrayLike) -> Array:
        """Eq. (26) without the CPO, unwrapped (M,): the exact GP mean."""
        return self.gp.mean(x)

    def variance(self, x: ArrayLike) -> Array:
        """LoS phase-noise variance (M,), rad^2."""
        return los_noise_var(x, self.gp.scene)
