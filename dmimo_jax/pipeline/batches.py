"""The batch sizes the online program is compiled for: a batch is padded to the next of a few
sizes (:data:`BUCKETS`), so a handful of programs serve any batch (serving systems pad
requests the same way)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import Array

BUCKETS = (1, 4, 16, 64, 256, 1024, 4096)
"""The batch sizes the Locator's call compiles: a batch is padded to the next (a larger one
runs in parts of the last), so any batch runs one of seven programs."""


def bucket_for(n: int, sizes: tuple[int, ...] = BUCKETS) -> int:
    """The smallest of ``sizes`` (ascending; default :data:`BUCKETS`) that holds ``n`` rows.

    Raises:
        ValueError: ``n`` above the largest (split the batch: :func:`padded_parts`).
    """
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"n={n} rows exceed the largest batch size {sizes[-1]}: split them")


def padded_parts(r: Array | np.ndarray, sizes: tuple[int, ...] = BUCKETS):
    """``r`` (B, M) in parts of at most the largest of ``sizes``, each padded to the next
    size by repeats of its last row: yields ``(n, padded)`` with ``n`` its real rows. What
    the Locator's call and a loaded export run, so a few programs serve any batch. A NumPy
    ``r`` is split and padded on the host (no device dispatch), a JAX array on its device;
    a part that fills its size is yielded as it is."""
    xp = np if isinstance(r, np.ndarray) else jnp
    top = sizes[-1]
    for start in range(0, r.shape[0], top):
        part = r[start : start + top]
        n = part.shape[0]
        pad = bucket_for(n, sizes) - n
        yield n, xp.concatenate([part, xp.repeat(part[-1:], pad, axis=0)]) if pad else part
