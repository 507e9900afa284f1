"""dmimo_jax.calibration.status: how a fit ended, and the warnings that say so."""

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from dmimo_jax.calibration.status import (
    chi2_band,
    error_scale,
    fit_status,
    log_normalizer,
    warn_status,
    warn_unidentified,
)


def test_the_band_holds_five_standard_deviations_of_the_reduced_chi_square():
    lo, hi = chi2_band(200)
    assert (lo, hi) == pytest.approx((0.5, 1.5))
    # a model that explains the data: its reduced chi-square leaves the band about never
    dof = 1000
    lo, hi = chi2_band(dof)
    p_out = scipy.stats.chi2.sf(hi * dof, dof) + scipy.stats.chi2.cdf(lo * dof, dof)
    assert p_out < 1e-4


@pytest.mark.parametrize(
    "chi2, converged, want",
    [
        (1.0, True, "converged"),
        (2.0, True, "misfit"),
        (0.2, True, "noise_overstated"),
        (1.0, False, "not_converged"),
        (9.0, False, "not_converged"),
    ],  # fmt: skip
)
def test_fit_status_reads_the_end_of_a_fit(chi2, converged, want):
    assert fit_status(chi2, 200, converged) == want


def test_error_scale_inflates_for_a_misfit_and_shrinks_for_overstated_noise():
    assert error_scale(1.2, 200) == 1.0 * np.sqrt(1.2)
    assert error_scale(0.9, 200) == 1.0  # inside the band, below 1: not shrunk
    assert error_scale(0.04, 200) == pytest.approx(0.2)  # below the band: sqrt(chi2)
    assert error_scale(9.0, 200) == pytest.approx(3.0)


def test_log_normalizer_is_the_gaussians():
    nv = jnp.array([[0.1, 0.2], [0.3, 0.4]])
    want = float(np.sum(np.log(2 * np.pi * np.asarray(nv))))
    assert log_normalizer(nv, False) == pytest.approx(want)
    # complex entries: two real residuals of variance sigma^2 / 2 each
    halves = np.log(2 * np.pi * np.asarray(nv) / 2)
    assert log_normalizer(nv, True) == pytest.approx(float(2 * np.sum(halves)))


def test_warnings_name_what_went_wrong():
    by_ap = np.ones(17)
    by_ap[[3, 11]] = [40.0, 90.0]
    with pytest.warns(UserWarning, match=r"concentrated on AP\(s\) 11 \(90\), 3 \(40\)"):
        warn_status("misfit", 6.0, 500, by_ap, 600)
    with pytest.warns(UserWarning, match="spread over every AP"):
        warn_status("misfit", 6.0, 500, np.full(17, 6.0), 600)
    with pytest.warns(UserWarning, match="max_steps=600"):
        warn_status("not_converged", 1.0, 500, by_ap, 600)
    with pytest.warns(UserWarning, match="overstates the noise"):
        warn_status("noise_overstated", 0.01, 500, by_ap, 600)
    with pytest.warns(UserWarning, match=r"ap_positions\[2, 1\]"):
        err = np.zeros((4, 3))
        err[2, 1] = np.inf
        warn_unidentified({"ap_positions": err, "surfaces": np.array([0.1 + 0.1j])})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_unidentified({"surfaces": np.array([0.1 + 0.1j])})  # every value constrained
