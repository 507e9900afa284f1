"""Dtype-keyed tolerances in one place (as in tinygp's test_utils)."""

import numpy as np

_RTOL = {np.dtype("float32"): 5e-4, np.dtype("float64"): 1e-10}


def assert_allclose(actual, desired, *, rtol=None, atol=0.0, err_msg=""):
    actual = np.asarray(actual)
    desired = np.asarray(desired)
    if rtol is None:
        dt = np.result_type(actual.real.dtype, desired.real.dtype)
        rtol = _RTOL.get(np.dtype(dt), 1e-10)
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol, err_msg=err_msg)
