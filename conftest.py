"""Test configuration (also picked up by the doctests in dmimo_jax/ and docs/).

Physics, bounds and estimation are tested in float64; implicit rank promotion is an
error so that a silent (M,) vs (M, 1) broadcast cannot hide a bug.
"""

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_rank_promotion", "raise")
