r"""The Fisher information and the position error bound of all APs: eqs. (10)-(14) and the
Appendix (the route is :mod:`dmimo_jax.bounds`' docstring), and of complex snapshots
(:func:`complex_fim`)."""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_finite,
    check_num_aps,
    check_positions,
    is_concrete,
    warn_if_float32,
)
from dmimo_jax.antenna import is_isotropic
from dmimo_jax.physics import (
    PhaseModel,
    TwoRayModel,
    as_phase_model,
    check_in_domain,
    effective_amplitude,
    geometry,
    reflection_coefficient,
    unwrapped_phase,
    zeta_term,
)
from dmimo_jax.pytree import jit_or_eager, map_in_chunks
from dmimo_jax.receivers import Receivers, channel, check_receivers
from dmimo_jax.scene import Scene


def channel_fim(x: ArrayLike, scene: Scene) -> Array:
    r"""Channel FIM of :math:`\boldsymbol\eta = [\phi, \alpha_1..\alpha_M, \theta_1..\theta_M]`, eq. (10).

    :math:`[\mathbf{J}]_{kl} = \frac{2}{\sigma_w^2}\sum_m \Re\{\partial_k \bar y_m^* \,\partial_l \bar y_m\}`
    with :math:`\bar y_m = \sqrt{P}\alpha_m e^{-j(\theta_m+\phi)}`, differentiated by
    ``jax.jacfwd`` (real and imaginary parts). The value of :math:`\phi` does not enter.

    Returns:
        (2M+1, 2M+1) symmetric, rank-deficient by one (phases and CPO are coupled).
    """
    check_positions("x", x, batched=False)
    m = scene.num_aps
    alpha = effective_amplitude(x, scene)
    theta = unwrapped_phase(x, scene)
    eta = jnp.concatenate([jnp.zeros((1,), alpha.dtype), alpha, theta])

    def noise_free(eta: Array) -> Array:
        phi, a, t = eta[0], eta[1 : m + 1], eta[m + 1 :]
        y = jnp.sqrt(scene.tx_power) * a * jnp.exp(-1j * (t + phi))
        return jnp.stack([jnp.real(y), jnp.imag(y)])  # (2, M)

    d = jax.jacfwd(noise_free)(eta)  # (2, M, 2M+1)
    return 2.0 / scene.noise_power * jnp.einsum("cmk,cml->kl", d, d)


def efim_schur(fim: ArrayLike) -> Array:
    r"""EFIM of the phases by Schur complement, eq. (13a).

    :math:`\mathbf{J}(\boldsymbol\theta) = \mathbf{J}_{\theta\theta} -
    \mathbf{J}_{\nu\theta}^\top\mathbf{J}_{\nu\nu}^{-1}\mathbf{J}_{\nu\theta}`, nuisance
    :math:`\boldsymbol\nu = [\phi, \boldsymbol\alpha]` (the first M+1 entries of
    :math:`\boldsymbol\eta`).

    Args:
        fim: (2M+1, 2M+1) channel FIM from :func:`channel_fim`.

    Returns:
        (M, M) EFIM.
    """
    fim = jnp.asarray(fim)
    n = fim.shape[-1]
    if fim.shape != (n, n) or n % 2 != 1:
        raise ValueError(f"fim must be square with odd size 2M+1, got {fim.shape}")
    m = (n - 1) // 2
    j_nn, j_nt, j_tt = fim[: m + 1, : m + 1], fim[: m + 1, m + 1 :], fim[m + 1 :, m + 1 :]
    return j_tt - j_nt.T @ jnp.linalg.solve(j_nn, j_nt)


def efim_from_variance(variance: ArrayLike) -> Array:
    r"""Closed-form EFIM from the phase variances: :math:`\mathrm{diag}(\mathbf w) - \mathbf w\mathbf w^\top/\sum w`.

    With :math:`w_m = 1/\sigma_m^2 = 2P\alpha_m^2/\sigma_w^2` this is eq. (13b). (M, M).

    An infinite variance (an AP with no signal) gives :math:`w_m = 0`: that AP drops out.

    Raises:
        ValueError: a concrete variance that is NaN, not positive, or infinite for every AP.
    """
    if is_concrete(variance):
        v = np.asarray(variance)
        if not np.all((v > 0) & ~np.isnan(v)) or not np.any(np.isfinite(v)):
            raise ValueError(
                "variance must be positive (rad^2; +inf for an AP with no signal, not for "
                f"all), got {v.tolist()!r}"
            )
    w = 1.0 / jnp.asarray(variance)
    return jnp.diag(w) - jnp.outer(w, w) / jnp.sum(w)


def efim(x: ArrayLike, scene: Scene | PhaseModel) -> Array:
    r"""Closed-form EFIM, eq. (13b): :math:`\frac{2P}{\sigma_w^2}(\boldsymbol\Lambda - \boldsymbol\alpha_{sq}\boldsymbol\alpha_{sq}^\top/\sum_m\alpha_m^2)`. (M, M).

    ``scene``: a Scene or a :class:`~dmimo_jax.physics.TwoRayModel` (the two-ray
    amplitudes); any other PhaseModel gives :func:`efim_from_variance` of its variance.
    """
    if isinstance(scene, TwoRayModel):
        scene = scene.scene
    elif not isinstance(scene, Scene):
        model = as_phase_model(scene)
        check_positions("x", x, batched=False)
        return efim_from_variance(model.variance(jnp.asarray(x)))
    check_positions("x", x, batched=False)
    a_sq = effective_amplitude(x, scene) ** 2
    scale = 2.0 * scene.tx_power / scene.noise_power
    return scale * (jnp.diag(a_sq) - jnp.outer(a_sq, a_sq) / jnp.sum(a_sq))


def phase_jacobian(x: ArrayLike, model: PhaseModel | Scene) -> Array:
    r""":math:`\mathbf{H} = \partial\boldsymbol\theta/\partial\mathbf{x}` by ``jax.jacfwd`` of the mean phase, (M, 3)."""
    model = as_phase_model(model)
    check_positions("x", x, batched=False)
    return jax.jacfwd(model.mean)(jnp.asarray(x))


def jacobian_analytic(x: ArrayLike, scene: Scene, *, paper_sign: bool = False) -> Array:
    r"""The Appendix's analytic Jacobian :math:`\partial\theta_m/\partial\mathbf{x}`, (M, 3).

    Implements eqs. (A1)-(A6): path-amplitude and path-phase derivatives, the
    derivative of :math:`\Gamma` through the incidence angle, and

    .. math::

        \frac{\partial\theta_m}{\partial\mathbf x} = -\Im\Big\{\frac{\sum_i(\partial\alpha^{(i)}_m
        - j\alpha^{(i)}_m\partial\theta^{(i)}_m)e^{-j\theta^{(i)}_m}}{\sum_i h^{(i)}_m}\Big\}.

    Two deliberate departures from the printed Appendix, both checked by the tests:

    * **Sign.** Eq. (A1) prints :math:`+\Im\{\cdot\}`. Since :math:`\sum_i h^{(i)}_m =
      \alpha_m e^{-j\theta_m}`, :math:`\Im\{\partial\log\sum_i h^{(i)}_m\} =
      -\partial\theta_m`, so the correct sign is minus (with a LoS path alone the printed
      form gives :math:`-\partial\theta^{(1)}`). The sign cancels in the position FIM
      :math:`\mathbf H^\top\mathbf J\mathbf H`, so the paper's PEB is unaffected.
      ``paper_sign=True`` returns the printed form.
    * **No 0/0 below an AP.** The Appendix writes
      :math:`\partial\Gamma = \frac{2(1-\varepsilon_r)\sin\gamma}{\zeta(\cos\gamma+\zeta)^2}\partial\gamma`
      with :math:`\partial\gamma` carrying :math:`1/\sin\gamma`; here
      :math:`\sin\gamma\,\partial\gamma = -\partial\cos\gamma` is substituted, which is
      finite straight below an AP.

    TM polarization uses :math:`\partial\Gamma_{TM}/\partial\cos\gamma =
    2\varepsilon_r(\varepsilon_r-1)/(\zeta(\varepsilon_r\cos\gamma+\zeta)^2)` (same
    derivation); a perfect conductor has :math:`\partial\Gamma = 0`. The Appendix is for
    isotropic APs (an antenna pattern raises ``ValueError``: use :func:`phase_jacobian`); the
    APs' phase offsets do not depend on ``x`` and drop out.
    """
    if not is_isotropic(scene.antenna):
        raise ValueError(
            "jacobian_analytic implements the Appendix for isotropic APs; the scene has a "
            f"{type(scene.antenna).__name__}: use phase_jacobian (autodiff) instead"
        )
    check_positions("x", x, batched=False)
    x = jnp.asarray(x, scene.ap_positions.dtype)
    ap = scene.ap_positions
    lam = scene.wavelength
    k = 2 * jnp.pi / lam
    geo = geometry(x, scene)
    d1, d2, c = geo.d1[:, None], geo.d2[:, None], geo.cos_gamma
    delta = ap - x[None, :]
    delta_t = ap * jnp.asarray([1.0, 1.0, -1.0], ap.dtype)[None, :] - x[None, :]
    e3 = jnp.asarray([0.0, 0.0, 1.0], ap.dtype)[None, :]

    # LoS path (A2)
    alpha1 = lam / (4 * jnp.pi * d1)
    theta1 = k * d1
    dalpha1 = lam / (4 * jnp.pi) * delta / d1**3
    dtheta1 = -k * delta / d1

    # Reflection coefficient and its derivative (A4)-(A6), via d cos(gamma)/dx
    gamma = reflection_coefficient(c, scene.eps_r, scene.polarization, scene.perfect_conductor)
    dcos = ((x[2] + ap[:, 2])[:, None] * delta_t + d2**2 * e3) / d2**3
    cc = c.astype(gamma.dtype)
    eps = scene.eps_r
    zeta = zeta_term(cc, eps)
    if scene.perfect_conductor:
        dgamma_dcos = jnp.zeros_like(gamma)
    elif scene.polarization == "TE":
        dgamma_dcos = 2 * (eps - 1) / (zeta * (cc + zeta) ** 2)
    else:
        dgamma_dcos = 2 * eps * (eps - 1) / (zeta * (eps * cc + zeta) ** 2)
    dgamma = dgamma_dcos[:, None] * dcos
    # (A5): d|G| = Re{G*/|G| dG}, d angle(G) = Im{dG/G}. Only |G| d angle(G) = Im{G*/|G| dG}
    # enters (A1) (through alpha2 * dtheta2), so both use the unit phasor G/|G|, which is
    # finite where G = 0 (vacuum ground, TM at the Brewster angle).
    abs_g = jnp.abs(gamma)
    nonzero = abs_g > 0
    unit = jnp.where(nonzero, gamma / jnp.where(nonzero, abs_g, 1.0), 1.0)[:, None]
    dabs_g = jnp.real(jnp.conj(unit) * dgamma)
    abs_g_dang_g = jnp.imag(jnp.conj(unit) * dgamma)
    abs_g = abs_g[:, None]

    # Reflected path (A3)
    spread2 = lam / (4 * jnp.pi * d2)
    alpha2 = abs_g * spread2
    theta2 = k * d2 - jnp.angle(gamma)[:, None]
    dalpha2 = spread2 * (abs_g * delta_t / d2**2 + dabs_g)
    alpha2_dtheta2 = alpha2 * (-k * delta_t / d2) - spread2 * abs_g_dang_g

    # (A1); a common factor exp(-j theta1) is removed from numerator and denominator so
    # that no ~170 rad phase enters the complex exponentials.
    rot2 = jnp.exp(-1j * (theta2 - theta1))
    num = (dalpha1 - 1j * alpha1 * dtheta1) + (dalpha2 - 1j * alpha2_dtheta2) * rot2
    den = alpha1 + alpha2 * rot2
    h = jnp.imag(num / den)
    return h if paper_sign else -h


def position_fim(x: ArrayLike, model: PhaseModel | Scene) -> Array:
    r"""Position FIM :math:`\mathbf{J}(\mathbf{x}) = \mathbf{H}^\top\mathbf{J}(\boldsymbol\theta)\mathbf{H}`, eq. (14), (3, 3), 1/m^2.

    Args:
        x: UE position (3,), metres.
        model: a Scene (two-ray model, eq. 13b) or any PhaseModel.
    """
    model = as_phase_model(model)
    check_position(x, model)
    return _position_fim(jnp.asarray(x), model)


def check_position(x: ArrayLike, model: PhaseModel) -> None:
    """``ValueError`` unless ``x`` is one finite position (3,) in ``model``'s domain (inside
    its room, off its APs): the check of every bound at one position."""
    check_positions("x", x, batched=False)
    check_in_domain("x", x, model)


def fim_from_jacobian(h: Array, weights: Array) -> Array:
    r"""Eq. (14) with the EFIM of eq. (13b) never formed: the (3, 3) position FIM
    :math:`\mathbf H^\top(\mathrm{diag}(\mathbf w) - \mathbf w\mathbf w^\top/\textstyle
    \sum w)\mathbf H = \sum_m w_m\mathbf h_m\mathbf h_m^\top - \mathbf g\mathbf g^\top/
    \sum_m w_m` with :math:`\mathbf g = \mathbf H^\top\mathbf w`, from the Jacobian ``h``
    (M, 3) and the weights :math:`w_m = 1/\sigma_m^2` (M,) (0 for an AP left out). O(M)
    time and memory, where the (M, M) EFIM costs O(M^2): a building of a thousand APs is a
    few thousand operations per position. Traced, unchecked."""
    g = h.T @ weights
    return (h * weights[:, None]).T @ h - jnp.outer(g, g) / jnp.sum(weights)


def _fim(x: Array, model: PhaseModel) -> Array:
    """Eq. (14), unchecked (O(M): :func:`fim_from_jacobian`)."""
    _, h, variance = linearize(x, model)
    return fim_from_jacobian(h, 1.0 / variance)


def _peb(x: Array, model: PhaseModel) -> Array:
    return peb_from_fim(_fim(x, model))


# one compiled program per model and shape for a call outside jit (not an eager dispatch
# per operation of the forward-mode trace)
_position_fim = jit_or_eager(_fim)
_peb_compiled = jit_or_eager(_peb)


def linearize(x: Array, model: PhaseModel) -> tuple[Array, Array, Array]:
    r"""Mean phase :math:`\boldsymbol\mu(\mathbf x)` (M,), its Jacobian
    :math:`\mathbf H = \partial\boldsymbol\mu/\partial\mathbf x` (M, 3) and the variance
    :math:`\boldsymbol\sigma^2(\mathbf x)` (M,) of eq. (9), in one forward-mode trace.

    The core of eq. (14): :func:`position_fim` and the tracking filters'
    measurement update (:mod:`dmimo_jax.tracking`) both linearize here, so the PEB and the
    posterior bound share one measurement model. Unchecked (traceable): ``x`` (3,) and a
    PhaseModel, as :func:`position_fim` validates them.
    """
    # one trace for H and the variances, so their shared primal work (path lengths,
    # Fresnel coefficients) is computed once
    h, (mean, variance) = jax.jacfwd(
        lambda y: (m := model.mean(y), (m, model.variance(y))), has_aux=True
    )(x)
    return mean, h, variance


def peb(x: ArrayLike, model: PhaseModel | Scene) -> Array:
    r"""Position error bound :math:`\sqrt{\mathrm{tr}(\mathbf{J}(\mathbf{x})^{-1})}` in metres.

    Args:
        x: UE position (3,), metres.
        model: a Scene or any PhaseModel.

    Returns:
        Scalar PEB in metres; ``inf`` where the position FIM is singular (a direction the
        phases cannot see, e.g. a UE in the vertical plane of collinear APs).

    Raises:
        ValueError: fewer than 4 APs (3 coordinates and a CPO), or a bad position.

    Examples:
        >>> import jax.numpy as jnp
        >>> from dmimo_jax import paper_scene
        >>> p = peb(jnp.array([6.5, 5.0, 2.0]), paper_scene(power_dbm=-10.0))
        >>> bool(1e-6 < float(p) < 1e-4)  # tens of micrometres
        True
    """
    model = as_phase_model(model)
    check_num_aps(model.num_aps)
    warn_if_float32("peb")
    check_position(x, model)
    return _peb_compiled(jnp.asarray(x), model)


def information_floor(fim: Array) -> Array:
    """The information below which a direction of a (3, 3) FIM counts as unobservable:
    :math:`10^3\\epsilon\\max_i J_{ii}` (a rounding artefact, not information).
    ``ValueError`` for a matrix that is not square (its shape is static: checked traced too)."""
    fim = jnp.asarray(fim)
    if fim.ndim < 2 or fim.shape[-1] != fim.shape[-2]:
        raise ValueError(f"fim must be a square matrix, got shape {fim.shape}")
    return 1e3 * jnp.finfo(fim.dtype).eps * jnp.max(jnp.diagonal(fim))


def peb_from_fim(fim: ArrayLike) -> Array:
    r""":math:`\sqrt{\mathrm{tr}\,\mathbf J^{-1}}` of a (3, 3) position FIM, ``inf`` when it is
    singular to working precision.

    Via the Cholesky factor :math:`\mathbf J = \mathbf L\mathbf L^\top`:
    :math:`\mathrm{tr}\,\mathbf J^{-1} = \|\mathbf L^{-1}\|_F^2`. A pivot
    :math:`L_{ii}^2` below :math:`10^3\epsilon\max_i J_{ii}` (or a failed factorization)
    means a direction without information: the bound is infinite, not a rounding artefact.
    """
    fim = jnp.asarray(fim)
    chol = jnp.linalg.cholesky(fim)
    pivots = jnp.diagonal(chol) ** 2
    singular = ~jnp.all(jnp.isfinite(chol)) | (jnp.min(pivots) <= information_floor(fim))
    eye = jnp.eye(3, dtype=fim.dtype)
    safe = jnp.where(singular, eye, chol)
    inv_l = jax.scipy.linalg.solve_triangular(safe, eye, lower=True)
    return jnp.where(singular, jnp.inf, jnp.sqrt(jnp.sum(inv_l**2)))


def peb_map(xs: ArrayLike, model: PhaseModel | Scene, *, batch_size: int = 4096) -> Array:
    """PEB at many positions, (N,), evaluated in jitted chunks of ``batch_size``.

    Args:
        xs: (N, 3) positions in metres.
        model: a Scene or any PhaseModel.
        batch_size: positions per vmapped chunk (memory bound).
    """
    model = as_phase_model(model)
    check_positions("xs", xs, batched=True)
    check_in_domain("xs", xs, model)
    check_num_aps(model.num_aps)
    warn_if_float32("peb_map")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    return _peb_map(jnp.asarray(xs), model, batch_size)


@partial(jax.jit, static_argnames=("batch_size",))
def _peb_map(xs: Array, model: PhaseModel, batch_size: int) -> Array:
    return map_in_chunks(lambda x: _peb(x, model), xs, batch_size)


def complex_fim(x: ArrayLike, model: PhaseModel, receivers: Receivers, s: ArrayLike = 1.0) -> Array:
    r"""Position Fisher information (3, 3) of one complex snapshot of
    :mod:`dmimo_jax.receivers` with the snapshot factor :math:`s` unknown (profiled: the
    Schur complement of its two real parameters).

    For :math:`\mathbf h\sim\mathcal{CN}(\boldsymbol\nu(\boldsymbol\eta), \sigma_w^2\mathbf I)`,
    :math:`\mathbf J = \frac{2}{\sigma_w^2}\mathrm{Re}(\mathbf D^H\mathbf D)` with
    :math:`\mathbf D = \partial\boldsymbol\nu/\partial\boldsymbol\eta`,
    :math:`\boldsymbol\eta = (\mathbf x, \mathrm{Re}\,s, \mathrm{Im}\,s)`,
    :math:`\boldsymbol\nu = s\,\mathbf G\odot\mathbf c(\mathbf x)`. A known
    :math:`\mathbf b` does not enter. :func:`position_fim` is the information of the phases
    alone; this one adds the amplitudes'.

    Raises:
        ValueError: receivers for another number of APs; (concrete input) ``x`` not one
            finite position (3,) in the model's domain (above the ground, off the APs, in
            the room's air), ``s`` not a finite non-zero scalar.
    """
    model = as_phase_model(model)
    check_num_aps(model.num_aps)
    check_receivers(receivers, model)
    check_position(x, model)
    if np.ndim(s) != 0:
        raise ValueError(f"s must be one snapshot factor (a scalar), got shape {np.shape(s)}")
    check_finite("s", s)
    if is_concrete(s) and s == 0:
        raise ValueError("s must be non-zero (a snapshot without pilot has no information)")
    x = jnp.asarray(x)
    s = jnp.asarray(s, jnp.result_type(x.dtype, complex))

    def nu(eta):  # [Re, Im] of the mean snapshot, one trace for both
        v = (eta[3] + 1j * eta[4]) * receivers.gains * channel(model, eta[:3])
        return jnp.concatenate([jnp.real(v), jnp.imag(v)])

    eta = jnp.concatenate([x, jnp.stack([jnp.real(s), jnp.imag(s)])])
    d = jax.jacfwd(nu)(eta)  # (2M, 5)
    full = 2.0 / model.scene.noise_power * (d.T @ d)
    a, b, c = full[:3, :3], full[:3, 3:], full[3:, 3:]
    return a - b @ jnp.linalg.solve(c, b.T)


def complex_peb(x: ArrayLike, model: PhaseModel, receivers: Receivers, s: ArrayLike = 1.0) -> Array:
    r""":func:`peb_from_fim` of :func:`complex_fim`, m (``inf`` for a singular FIM)."""
    return peb_from_fim(complex_fim(x, model, receivers, s))
