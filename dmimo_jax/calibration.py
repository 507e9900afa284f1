r"""Calibrate the reflecting surfaces from a few labeled snapshots (beyond the paper).

The paper answers the MLE's sensitivity to the permittivity (Sec. VI, the :math:`\beta`
curves) with a GP that ignores the physics. Here the physics is kept and its unknown
parameters are learned from the same L labeled snapshots the GP is trained on: positions
:math:`\mathbf x_l` known, CPOs :math:`\phi_l` unknown. The likelihood of eq. (8) with the
CPOs profiled out in closed form (eq. (15) per snapshot, as the MLE does) is

.. math::

    \log p(\mathbf r\,|\,\varepsilon) = -\tfrac12\sum_{l,m}\Big[
    \frac{\mathrm{wrap}(r_{lm} - \theta_m(\mathbf x_l;\varepsilon) - \hat\phi_l)^2}{\sigma^2_{lm}}
    + \log 2\pi\sigma^2_{lm}\Big],

maximized by the package's Levenberg-Marquardt (autodiff Jacobian) over
:math:`\varepsilon_r = \varepsilon' - j\varepsilon''` of every surface being calibrated,
parametrized as :math:`\varepsilon' = 1 + \mathrm{softplus}(a)`,
:math:`\varepsilon'' = \mathrm{softplus}(b)` so that it stays physical, from several starts
(the ITU-R P.2040 materials, all surfaces alike), the best likelihood winning. The
polarization is static in the model, so ``polarization=None`` fits both and keeps the
likelier. Standard errors of :math:`\varepsilon'` and :math:`\varepsilon''` come from the
observed information :math:`\mathbf J^\top\mathbf J` of the whitened, CPO-profiled residuals.

* :func:`fit_material`: the ground of the two-ray model (:class:`TwoRayModel`).
* :func:`fit_surfaces`: any subset of the surfaces of an :class:`ImageSourceModel`.
* :func:`material_posterior`: the numpyro NUTS posterior of the ground's :math:`\varepsilon_r`.

It sits above :mod:`dmimo_jax.estimators` (it reuses the one Levenberg-Marquardt and the CPO
compression of eq. (15)), beside :mod:`dmimo_jax.learning`.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_int, warn_if_float32
from dmimo_jax.estimators.lm import levenberg_marquardt
from dmimo_jax.estimators.mle import compressed_residuals, cpo_estimate
from dmimo_jax.gp.kernel import check_training_data
from dmimo_jax.materials import is_perfect_conductor, relative_permittivity
from dmimo_jax.phase import wrap
from dmimo_jax.physics import ImageSourceModel, PhaseModel, TwoRayModel
from dmimo_jax.physics.image_source import MOUNT_TOLERANCE
from dmimo_jax.pytree import pytree_dataclass, static_field
from dmimo_jax.scene import Scene

__all__ = [
    "CALIBRATION_STARTS",
    "MaterialFit",
    "MaterialPosterior",
    "fit_material",
    "fit_surfaces",
    "log_likelihood",
    "material_posterior",
    "with_permittivities",
]

CALIBRATION_STARTS = ("concrete", "brick", "plasterboard", "wood", "glass")
"""ITU-R P.2040 materials used as starting points (Table I of the paper, metal excepted)."""


@pytree_dataclass
class MaterialFit:
    r"""Result of :func:`fit_material` / :func:`fit_surfaces`.

    Attributes:
        eps_r: calibrated :math:`\varepsilon_r` (complex), () for the ground, (K,) for surfaces.
        stderr_real: standard error of :math:`\mathrm{Re}\,\varepsilon_r`, same shape.
        stderr_imag: standard error of :math:`\mathrm{Im}\,\varepsilon_r`, same shape.
        log_likelihood: () profiled log-likelihood at the estimate.
        cpo: (L,) CPO estimates of the labeled snapshots, wrapped, rad.
        model: the calibrated PhaseModel (plugs into the MLE, the PEB, the pipeline).
        log_likelihood_by_polarization: (2,) best log-likelihood for TE and TM (``-inf``
            for a polarization that was not fitted).
        polarization: the chosen polarization (static).
        surfaces: names of the calibrated surfaces (static).
    """

    eps_r: Array
    stderr_real: Array
    stderr_imag: Array
    log_likelihood: Array
    cpo: Array
    model: Any
    log_likelihood_by_polarization: Array
    polarization: str = static_field()
    surfaces: tuple[str, ...] = static_field()


def with_permittivities(model: PhaseModel, eps_r: ArrayLike, surfaces: Sequence[int]) -> Any:
    """``model`` with the permittivity of the surfaces at indices ``surfaces`` replaced.

    For a :class:`TwoRayModel` the only surface is the ground (index 0); for an
    :class:`ImageSourceModel` the indices run over its reflectors. Works on tracers.
    """
    eps_r = jnp.atleast_1d(jnp.asarray(eps_r))
    if isinstance(model, TwoRayModel):
        return TwoRayModel(model.scene.replace(eps_r=eps_r[0]))
    if isinstance(model, ImageSourceModel):
        refl = list(model.reflectors)
        for j, k in enumerate(surfaces):
            refl[k] = refl[k].with_permittivity(eps_r[j])
        return ImageSourceModel(model.scene, refl, model.order)
    raise ValueError(
        f"model must be a TwoRayModel or an ImageSourceModel, got {type(model).__name__}"
    )


def log_likelihood(model: PhaseModel, x: ArrayLike, r: ArrayLike, noise_var: ArrayLike) -> Array:
    """The CPO-profiled Gaussian log-likelihood of L labeled snapshots (module docstring)."""
    x, r, noise_var = jnp.asarray(x), jnp.asarray(r), jnp.asarray(noise_var)
    return _log_likelihood_of_mean(jax.vmap(model.mean)(x), r, noise_var)


def _log_likelihood_of_mean(mean, r, noise_var):
    e = _whiten(mean, r, noise_var)
    return -0.5 * (jnp.sum(e * e) + jnp.sum(jnp.log(2 * jnp.pi * noise_var)))


def _whiten(mean, r, noise_var):
    return (compressed_residuals(r, mean, noise_var) / jnp.sqrt(noise_var)).reshape(-1)


def _whitened_residuals(model, x, r, noise_var):
    return _whiten(jax.vmap(model.mean)(x), r, noise_var)


def _softplus_inv(y):
    return y + jnp.log(-jnp.expm1(-y))


def _to_eps(u):
    k = u.shape[-1] // 2
    return (1.0 + jax.nn.softplus(u[..., :k])) - 1j * jax.nn.softplus(u[..., k:])


def _to_u(eps):
    eps = jnp.asarray(eps)
    # keep starts strictly inside the parametrization (eps' > 1, eps'' > 0)
    re = jnp.maximum(jnp.real(eps) - 1.0, 1e-6)
    im = jnp.maximum(-jnp.imag(eps), 1e-6)
    return jnp.concatenate([_softplus_inv(re), _softplus_inv(im)], axis=-1)


@partial(jax.jit, static_argnames=("surfaces", "num_steps"))
def _fit_starts(model, x, r, noise_var, u0, surfaces, num_steps):
    def residuals(u, _):
        return _whitened_residuals(
            with_permittivities(model, _to_eps(u), surfaces), x, r, noise_var
        )

    def one(u):
        res = levenberg_marquardt(residuals, u, num_steps=num_steps, damping=1e-2)
        return res.x, res.cost

    u, cost = jax.vmap(one)(u0)
    best = jnp.argmin(jnp.where(jnp.isfinite(cost), cost, jnp.inf))
    u_best = u[best]
    eps = _to_eps(u_best)

    def residuals_eps(parts):  # the same residuals in (eps', eps'') for the information
        k = parts.shape[0] // 2
        e = parts[:k] - 1j * parts[k:]
        return _whitened_residuals(with_permittivities(model, e, surfaces), x, r, noise_var)

    parts = jnp.concatenate([jnp.real(eps), -jnp.imag(eps)])
    jac = jax.jacfwd(residuals_eps)(parts)
    cov = jnp.linalg.pinv(jac.T @ jac)
    se = jnp.sqrt(jnp.clip(jnp.diagonal(cov), 0.0))
    mean = jax.vmap(with_permittivities(model, eps, surfaces).mean)(x)
    ll = _log_likelihood_of_mean(mean, r, noise_var)
    return eps, se[: eps.shape[0]], se[eps.shape[0] :], ll, wrap(cpo_estimate(r, mean, noise_var))


def _starts(frequency_hz: float, starts: Sequence[complex | str] | None, num: int) -> Array:
    starts = CALIBRATION_STARTS if starts is None else tuple(starts)
    if not starts:
        raise ValueError("starts must name at least one material or permittivity")
    values = []
    for s in starts:
        if isinstance(s, str):
            if is_perfect_conductor(s):
                raise ValueError(f"starts: {s!r} is a perfect conductor, not a permittivity")
            s = relative_permittivity(s, frequency_hz)
        values.append(complex(s))
    eps = np.repeat(np.asarray(values)[:, None], num, axis=1)  # (S, K): all surfaces alike
    return _to_u(jnp.asarray(eps))


def _polarizations(polarization: str | None) -> tuple[str, ...]:
    if polarization is None:
        return ("TE", "TM")
    if polarization not in ("TE", "TM"):
        raise ValueError(f"polarization must be 'TE', 'TM' or None, got {polarization!r}")
    return (polarization,)


def _fit(model, x, r, noise_var, surfaces, polarization, starts, num_steps, names, squeeze):
    check_training_data(x, r, noise_var, model.num_aps)
    check_int("num_steps", num_steps, minimum=1)
    warn_if_float32("calibration")
    dtype = model.scene.ap_positions.dtype
    x, r, noise_var = (jnp.asarray(v, dtype) for v in (x, r, noise_var))
    u0 = _starts(float(model.scene.frequency), starts, len(surfaces))
    pols = _polarizations(polarization)
    best, lls = None, {"TE": -np.inf, "TM": -np.inf}
    for pol in pols:
        m = _with_polarization(model, pol)
        out = _fit_starts(m, x, r, noise_var, u0, tuple(surfaces), num_steps)
        lls[pol] = float(out[3])
        if best is None or lls[pol] > float(best[1][3]):
            best = (pol, out, m)
    pol, (eps, se_re, se_im, ll, cpo), m = best
    fitted = with_permittivities(m, eps, tuple(surfaces))
    if squeeze:
        eps, se_re, se_im = eps[0], se_re[0], se_im[0]
    return MaterialFit(
        eps_r=eps,
        stderr_real=se_re,
        stderr_imag=se_im,
        log_likelihood=ll,
        cpo=cpo,
        model=fitted,
        log_likelihood_by_polarization=jnp.asarray([lls["TE"], lls["TM"]]),
        polarization=pol,
        surfaces=tuple(names),
    )


def _with_polarization(model, pol):
    if model.scene.polarization == pol:
        return model
    scene = model.scene.replace(polarization=pol)
    if isinstance(model, TwoRayModel):
        return TwoRayModel(scene)
    return ImageSourceModel(scene, model.reflectors, model.order)


def fit_material(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    *,
    key: Array | None = None,
    polarization: str | None = None,
    starts: Sequence[complex | str] | None = None,
    num_steps: int = 40,
) -> MaterialFit:
    r"""Maximum-likelihood :math:`\varepsilon_r` (and polarization) of the ground, two-ray model.

    Args:
        x: (L, 3) labeled UE positions, m.
        r: (L, M) wrapped phases measured there.
        noise_var: (L, M) phase-noise variances, rad^2 (eq. 9 at the measurement SNR).
        scene: geometry, wavelength and powers; its ``eps_r`` is not used (it is what is
            estimated). A perfect-conductor ground has nothing to calibrate.
        key: unused (the starts are deterministic); accepted for a uniform signature.
        polarization: ``"TE"``, ``"TM"``, or ``None`` to select by likelihood.
        starts: materials or permittivities to start from (default :data:`CALIBRATION_STARTS`).
        num_steps: Levenberg-Marquardt steps per start.

    Returns:
        A :class:`MaterialFit` with scalar ``eps_r`` and its ``model`` a :class:`TwoRayModel`.

    Raises:
        ValueError: L < 2, shapes that do not match (L, M), non-finite input, a non-positive
            noise variance, a perfect-conductor scene, an unknown polarization or start.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> jax.config.update("jax_enable_x64", True)
        >>> import dmimo_jax as dj
        >>> scene = dj.paper_scene(-20.0, convention="itu")
        >>> x = dj.sample_positions(jax.random.key(0), 10, scene)
        >>> r = dj.simulate_phases_batch(jax.random.key(1), scene, x, jnp.zeros(10))
        >>> var = jax.vmap(dj.phase_noise_var, (0, None))(x, scene)
        >>> fit = fit_material(x, r, var, scene)
        >>> fit.polarization, bool(abs(fit.eps_r / scene.eps_r - 1) < 0.05)
        ('TE', True)
    """
    del key
    if not isinstance(scene, Scene):
        raise ValueError(f"scene must be a Scene, got {type(scene).__name__}")
    if scene.perfect_conductor:
        raise ValueError("scene has a perfect-conductor ground: there is no eps_r to calibrate")
    return _fit(
        TwoRayModel(scene),
        x,
        r,
        noise_var,
        (0,),
        polarization,
        starts,
        num_steps,
        ("ground",),
        True,
    )


def fit_surfaces(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    model: ImageSourceModel,
    *,
    surfaces: Sequence[str] | None = None,
    polarization: str | None = None,
    starts: Sequence[complex | str] | None = None,
    num_steps: int = 40,
) -> MaterialFit:
    r"""Maximum-likelihood :math:`\varepsilon_r` of several surfaces of a room at once.

    The room's geometry (its planes) is known; the materials are not: every surface named in
    ``surfaces`` (default: all that are not perfect conductors) is estimated jointly, the
    others keep the model's values.

    Args:
        x, r, noise_var: as in :func:`fit_material`.
        model: an :class:`ImageSourceModel` whose ``eps_r`` values are only placeholders for
            the surfaces being fitted.
        surfaces: reflector names to calibrate.
        polarization, starts, num_steps: as in :func:`fit_material`.

    Returns:
        A :class:`MaterialFit` with ``eps_r`` (K,) in the order of ``surfaces``.
    """
    if not isinstance(model, ImageSourceModel):
        raise ValueError(f"model must be an ImageSourceModel, got {type(model).__name__}")
    names = [r_.name for r_ in model.reflectors]
    seen = _seen_surfaces(model)
    if surfaces is None:
        surfaces = [
            r_.name
            for r_, ok in zip(model.reflectors, seen, strict=True)
            if ok and not r_.perfect_conductor
        ]
    idx = []
    for s in surfaces:
        if s not in names:
            raise ValueError(f"surfaces: no reflector named {s!r} (the model has {names})")
        k = names.index(s)
        if model.reflectors[k].perfect_conductor:
            raise ValueError(f"surfaces: {s!r} is a perfect conductor, it has no eps_r to fit")
        if not seen[k]:
            raise ValueError(
                f"surfaces: every AP is mounted on {s!r}, so no path bounces off it (order "
                f"{model.order}) and its eps_r does not enter the phases"
            )
        idx.append(k)
    if not idx:
        raise ValueError("surfaces: nothing to calibrate")
    return _fit(
        model, x, r, noise_var, tuple(idx), polarization, starts, num_steps, surfaces, False
    )


def _seen_surfaces(model: ImageSourceModel) -> list[bool]:
    """Whether some path bounces off each reflector: an AP in front of it, or (order 2) any
    reflector at all, since a double bounce can reach a plane the APs are mounted on."""
    ap = np.asarray(model.scene.ap_positions)
    out = []
    for r_ in model.reflectors:
        in_front = bool(np.any(np.asarray(r_.height(ap)) > MOUNT_TOLERANCE))
        out.append(in_front or model.order >= 2)
    return out


class MaterialPosterior(NamedTuple):
    r"""Output of :func:`material_posterior`: NUTS draws of the ground's :math:`\varepsilon_r`."""

    eps_r: Array  # (S,) complex draws
    diverging: Array  # (S,) bool

    def interval(self, level: float = 0.95) -> tuple[Array, Array]:
        """Equal-tailed credible intervals ``(low, high)`` of (Re, Im), each shape (2,)."""
        parts = jnp.stack([jnp.real(self.eps_r), jnp.imag(self.eps_r)], axis=-1)
        a = (1.0 - level) / 2.0
        return jnp.quantile(parts, a, axis=0), jnp.quantile(parts, 1.0 - a, axis=0)


def material_posterior(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    *,
    key: Array,
    polarization: str | None = None,
    num_warmup: int = 300,
    num_samples: int = 500,
    init: MaterialFit | None = None,
    progress: bool = False,
) -> MaterialPosterior:
    r"""The numpyro NUTS posterior of the ground's :math:`\varepsilon_r` (CPOs profiled).

    Prior: :math:`\varepsilon' - 1 \sim \mathrm{HalfNormal}(20)`,
    :math:`\varepsilon'' \sim \mathrm{HalfNormal}(5)` (weak, physical); likelihood: the
    profiled likelihood of the module docstring at the polarization of the maximum-likelihood
    fit (``init``, or a fresh :func:`fit_material`), where the chain starts.
    """
    import numpyro
    import numpyro.distributions as dist
    from numpyro.infer import MCMC, NUTS, init_to_value

    start = (
        fit_material(x, r, noise_var, scene, polarization=polarization) if init is None else init
    )
    dtype = scene.ap_positions.dtype
    x, r, noise_var = (jnp.asarray(v, dtype) for v in (x, r, noise_var))
    base = TwoRayModel(scene.replace(polarization=start.polarization))

    def model():
        re_m1 = numpyro.sample("eps_real_minus_1", dist.HalfNormal(20.0))
        im = numpyro.sample("eps_loss", dist.HalfNormal(5.0))
        fitted = with_permittivities(base, (1.0 + re_m1) - 1j * im, (0,))
        numpyro.factor("log_likelihood", log_likelihood(fitted, x, r, noise_var))

    eps0 = complex(start.eps_r)
    values = {
        "eps_real_minus_1": jnp.asarray(max(eps0.real - 1.0, 1e-6), dtype),
        "eps_loss": jnp.asarray(max(-eps0.imag, 1e-6), dtype),
    }
    mcmc = MCMC(
        NUTS(model, init_strategy=init_to_value(values=values)),
        num_warmup=num_warmup,
        num_samples=num_samples,
        progress_bar=progress,
    )
    mcmc.run(key, extra_fields=("diverging",))
    s = mcmc.get_samples()
    eps = (1.0 + s["eps_real_minus_1"]) - 1j * s["eps_loss"]
    return MaterialPosterior(eps, mcmc.get_extra_fields()["diverging"])
