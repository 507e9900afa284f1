r"""Calibrate the reflecting surfaces from a few labeled snapshots (beyond the paper).

:func:`fit_material` and :func:`fit_surfaces` are :func:`~dmimo_jax.calibration.calibrating`
with ``fit=("surfaces", "polarization")``, repackaged; :func:`material_posterior` is the
Bayesian view of the ground alone.

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
parametrized as :math:`\varepsilon' = 1 + |a|`, :math:`\varepsilon'' = |b|` so that it
stays physical (:mod:`~dmimo_jax.calibration.calibrating` says why), from several starts
(the ITU-R P.2040 materials, all surfaces alike), the best likelihood winning. The
polarization is static in the model, so ``polarization=None`` fits both and keeps the
likelier. Standard errors of :math:`\varepsilon'` and :math:`\varepsilon''` come from the
observed information :math:`\mathbf J^\top\mathbf J` of the whitened, CPO-profiled residuals
in :math:`(\varepsilon', \varepsilon'')` themselves (finite at a physical bound).

* :func:`fit_material`: the ground of the two-ray model (:class:`TwoRayModel`).
* :func:`fit_surfaces`: any subset of the surfaces of a room (an
  :class:`~dmimo_jax.physics.ImageSourceModel`, a :class:`~dmimo_jax.physics.MeshModel`).
* :func:`material_posterior`: the numpyro NUTS posterior of the ground's :math:`\varepsilon_r`.

It sits above :mod:`dmimo_jax.estimators` (it reuses the one Levenberg-Marquardt and the CPO
compression of eq. (15)), beside :mod:`dmimo_jax.learning`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax.calibration.calibrating import calibrate, log_likelihood
from dmimo_jax.calibration.groups import Surfaces
from dmimo_jax.calibration.parametrization import with_permittivities
from dmimo_jax.physics import CalibratableModel, TwoRayModel
from dmimo_jax.pytree import pytree_dataclass, static_field
from dmimo_jax.scene import Scene


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
        reduced_chi2: () the fit's goodness of fit (about 1 when the model explains the data
            to the noise; the standard errors are inflated by its square root above 1).
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
    reduced_chi2: Array
    polarization: str = static_field()
    surfaces: tuple[str, ...] = static_field()


def _fit(model, x, r, noise_var, surfaces, polarization, starts, num_steps, squeeze):
    if polarization is not None and polarization not in ("TE", "TM"):
        raise ValueError(f"polarization must be 'TE', 'TM' or None, got {polarization!r}")
    if polarization is not None and model.scene.polarization != polarization:
        model = model.with_scene(model.scene.replace(polarization=polarization))
    surfaces_request = Surfaces(names=surfaces, starts=starts)
    fit = (surfaces_request,) if polarization is not None else (surfaces_request, "polarization")
    cal = calibrate(model, x, r, noise_var, fit=fit, num_steps=num_steps)
    eps, se = cal.values["surfaces"], cal.stderr["surfaces"]
    if squeeze:
        eps, se = eps[0], se[0]
    return MaterialFit(
        eps_r=eps,
        stderr_real=jnp.real(se),
        stderr_imag=jnp.imag(se),
        log_likelihood=cal.log_likelihood,
        cpo=cal.cpo,
        model=cal.model,
        log_likelihood_by_polarization=cal.log_likelihood_by_polarization,
        reduced_chi2=cal.reduced_chi2,
        polarization=cal.polarization,
        surfaces=cal.surfaces,
    )


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
        starts: materials or permittivities to start from (default :data:`~dmimo_jax.calibration.CALIBRATION_STARTS`).
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
        >>> var = jax.vmap(dj.physics.phase_noise_var, (0, None))(x, scene)
        >>> fit = fit_material(x, r, var, scene)
        >>> fit.polarization, bool(abs(fit.eps_r / scene.eps_r - 1) < 0.05)
        ('TE', True)
    """
    del key
    if not isinstance(scene, Scene):
        raise ValueError(f"scene must be a Scene, got {type(scene).__name__}")
    if scene.perfect_conductor:
        raise ValueError("scene has a perfect-conductor ground: there is no eps_r to calibrate")
    return _fit(TwoRayModel(scene), x, r, noise_var, None, polarization, starts, num_steps, True)


def fit_surfaces(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    model: CalibratableModel,
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
        x: as in :func:`fit_material`.
        r: see ``x``.
        noise_var: see ``x``.
        model: a model of named surfaces (an :class:`~dmimo_jax.physics.ImageSourceModel`, a
            :class:`~dmimo_jax.physics.MeshModel`: any
            :class:`~dmimo_jax.physics.CalibratableModel` with ``surface_names``) whose
            permittivities are only placeholders for the surfaces being fitted.
        surfaces: reflector names to calibrate.
        polarization: as in :func:`fit_material`.
        starts: see ``polarization``.
        num_steps: see ``polarization``.

    Returns:
        A :class:`MaterialFit` with ``eps_r`` (K,) in the order of ``surfaces``.
    """
    if not isinstance(model, CalibratableModel) or not model.surface_names:
        raise ValueError(
            "model must be a model of named surfaces (an ImageSourceModel, a MeshModel), got "
            f"{type(model).__name__}"
        )
    return _fit(model, x, r, noise_var, surfaces, polarization, starts, num_steps, False)


class MaterialPosterior(NamedTuple):
    r"""Output of :func:`material_posterior`: NUTS draws of the ground's :math:`\varepsilon_r`."""

    eps_r: Array
    """(S,) complex draws."""
    diverging: Array
    """(S,) bool."""

    def interval(self, level: float = 0.95) -> tuple[Array, Array]:
        """Equal-tailed credible intervals ``(low, high)`` of (Re, Im), each shape (2,).

        Raises:
            ValueError: ``level`` not in (0, 1).
        """
        if not (np.ndim(level) == 0 and 0.0 < float(level) < 1.0):
            raise ValueError(f"level must be a probability in (0, 1), got {level!r}")
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

    if not (isinstance(key, jax.Array) and key.shape in ((), (2,))):
        raise ValueError(
            f"key must be a JAX PRNG key (jax.random.key(seed)), got {type(key).__name__}"
        )
    if init is not None and not (
        isinstance(init, MaterialFit) and init.surfaces == ("ground",) and init.eps_r.shape == ()
    ):
        raise ValueError(
            "init must be a MaterialFit of the ground alone (fit_material), got "
            f"{type(init).__name__}"
            + (f" of surfaces {init.surfaces}" if isinstance(init, MaterialFit) else "")
        )
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
