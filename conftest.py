"""Test configuration (also picked up by the doctests in dmimo_jax/ and docs/).

Physics, bounds and estimation are tested in float64; implicit rank promotion is an
error so that a silent (M,) vs (M, 1) broadcast cannot hide a bug.
"""

import os

# XLA's CPU fusion emitters cost ~50 ms per (tiny) compile on this 2-core machine, the
# older elemental emitter about half that, and most of this suite's time is compilation
# (one compile per new shape of every eager op): 15% off tests/test_mle.py +
# tests/test_candidates.py measured side by side (209 s vs 244 s). Tests only; the package
# never sets XLA flags. GPU runs: one process per xdist worker, so no preallocation.
os.environ["XLA_FLAGS"] = " ".join(
    [os.environ.get("XLA_FLAGS", ""), "--xla_cpu_use_fusion_emitters=false"]
).strip()
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
