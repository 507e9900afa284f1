r"""How a calibration ended and what its numbers mean: the chi-square band of a fit that
explains the data to the noise (:func:`chi2_band`), the four ends of a fit
(:func:`fit_status`), the scale of its standard errors (:func:`error_scale`), the warnings
that name a misfit's APs or an unidentified direction, and the log-likelihood's
normalizer."""

from __future__ import annotations

import warnings

import jax.numpy as jnp
import numpy as np
from jax import Array


def log_normalizer(noise_var: Array, complex_data: bool) -> float:
    r""":math:`\sum\log 2\pi\sigma^2` over the real residuals (two per complex entry, each
    of variance :math:`\sigma_w^2/2`)."""
    heard = jnp.isfinite(noise_var)  # an AP that hears nothing (inf) has no residual there
    if complex_data:
        return 2.0 * float(jnp.sum(jnp.where(heard, jnp.log(jnp.pi * noise_var), 0.0)))
    return float(jnp.sum(jnp.where(heard, jnp.log(2 * jnp.pi * noise_var), 0.0)))


def chi2_band(dof: int) -> tuple[float, float]:
    r"""The reduced chi-square's band for a model that explains the data to the noise:
    :math:`1 \pm 5\sqrt{2/\nu}` (five standard deviations of :math:`\chi^2_\nu/\nu`)."""
    half = 5.0 * float(np.sqrt(2.0 / dof))
    return 1.0 - half, 1.0 + half


def fit_status(reduced_chi2: float, dof: int, converged: bool) -> str:
    """What a fit's end says of it (:attr:`Calibration.status`):

    * ``"not_converged"``: the solver was still lowering the cost when its steps ran out;
    * ``"misfit"``: converged, reduced chi-square above :func:`chi2_band` (the model misses
      something the data show);
    * ``"noise_overstated"``: converged, reduced chi-square below the band (the stated noise
      variances are too large);
    * ``"converged"``: converged, reduced chi-square inside the band.
    """
    lo, hi = chi2_band(dof)
    if not converged:
        return "not_converged"
    if reduced_chi2 > hi:
        return "misfit"
    if reduced_chi2 < lo:
        return "noise_overstated"
    return "converged"


def error_scale(reduced_chi2: float, dof: int) -> float:
    r"""The factor on the Gauss-Newton standard errors: :math:`\sqrt{\max(1, \chi^2_\nu)}`,
    or :math:`\sqrt{\chi^2_\nu}` below :func:`chi2_band` (overstated noise variances made
    the information too small by that factor)."""
    lo, _ = chi2_band(dof)
    return float(np.sqrt(reduced_chi2 if reduced_chi2 < lo else max(1.0, reduced_chi2)))


def warn_status(status, chi2, dof, chi2_by_ap, max_steps) -> None:
    lo, hi = chi2_band(dof)
    if status == "not_converged":
        msg = (
            f"calibrate did not converge in max_steps={max_steps} Levenberg-Marquardt steps "
            f"(reduced chi-square {chi2:.3g} and still falling): raise max_steps or start "
            "closer; the values are not an optimum"
        )
    elif status == "noise_overstated":
        msg = (
            f"calibrate: reduced chi-square {chi2:.3g}, below its band [{lo:.3g}, {hi:.3g}]: "
            f"noise_var overstates the noise (by about {1 / max(chi2, 1e-300):.3g}x); "
            f"standard errors are scaled by sqrt({chi2:.3g})"
        )
    else:
        # APs far above the others (a misfit one AP carries leaks into every AP through
        # the snapshots' CPOs, so the others can sit above the band too)
        out = np.flatnonzero(chi2_by_ap > max(hi, 5.0 * float(np.median(chi2_by_ap))))
        worst = out[np.argsort(chi2_by_ap[out])[::-1]][:3]
        where = (
            "concentrated on AP(s) "
            + ", ".join(f"{int(m)} ({chi2_by_ap[m]:.3g})" for m in worst)
            + " (their phase centre, pattern or surroundings)"
            if len(out)
            else "spread over every AP (the room or the propagation, not one AP)"
        )
        msg = (
            f"calibrate: reduced chi-square {chi2:.3g} (expected 1 +- "
            f"{np.sqrt(2.0 / dof):.2g} for a model that explains the data to the noise): the "
            f"model misses something, {where}; standard errors are inflated by "
            f"sqrt({chi2:.3g})"
        )
    # at the caller of calibrate (or calibrate_many): through _report and their shell
    warnings.warn(msg, UserWarning, stacklevel=5)


def warn_unidentified(stderr: dict[str, Array]) -> None:
    """Warn, naming them, about values the data leave unconstrained (an infinite error)."""
    names = []
    for group, err in stderr.items():
        e = np.asarray(err)  # complex for eps, gains, constants: Re and Im errors
        for idx in np.argwhere(~np.isfinite(e.real) | ~np.isfinite(e.imag)):
            names.append(f"{group}{list(map(int, idx))}")
    if names:
        shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
        warnings.warn(
            f"calibrate: the labeled snapshots do not constrain {shown} (infinite standard "
            "error): spread the labels over the region (in 3-D for AP positions) or fix "
            "those values",
            UserWarning,
            stacklevel=5,  # at the caller of calibrate, as warn_status
        )
