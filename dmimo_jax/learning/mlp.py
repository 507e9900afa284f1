r"""The MLP benchmark (Sec. IV-B, first benchmark) and the HI benchmark's ambiguity classifier.

**Inputs.** Both take the CPO-free differential phases :math:`\sin/\cos(r_m - r_{\mathrm{ref}})`,
m != ref (:func:`~dmimo_jax.learning.nets.differential_inputs`), 2(M - 1) numbers: the CPO
cancels exactly, so no capacity is spent on learning invariance to it (POPT gets the raw
phases, as in the paper). We chose this over raw sin/cos phases for that reason.

**Size.** ``MLPRegressor`` with hidden widths (512, 512, 512) and GELU costs
2 (32 * 512 + 2 * 512^2 + 512 * 3) = 1.08 M FLOPs per snapshot at M = 17, next to the
paper's 1.38 M for its benchmark MLP (:func:`~dmimo_jax.complexity.mlp_flops`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dmimo_jax.learning.nets import (
    Standardizer,
    check_snapshots,
    differential_inputs,
    dropout,
    dropout_keys,
)

__all__ = ["MLPConfig", "MLP", "MLPRegressor", "AmbiguityClassifier"]


@dataclasses.dataclass(frozen=True)
class MLPConfig:
    """Hidden widths, dropout and the reference AP of the differential inputs."""

    hidden: tuple[int, ...] = (512, 512, 512)
    dropout: float = 0.0
    reference: int = 0

    def __post_init__(self):
        object.__setattr__(self, "hidden", tuple(self.hidden))
        if not self.hidden or not all(isinstance(w, int) and w >= 1 for w in self.hidden):
            raise ValueError(f"hidden must be positive ints, got {self.hidden!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")

    @classmethod
    def tiny(cls) -> MLPConfig:
        return cls(hidden=(32, 32))


class MLP(nnx.Module):
    """Dense GELU layers ``in -> hidden... -> out`` with dropout after each hidden layer."""

    def __init__(self, d_in: int, hidden: Sequence[int], d_out: int, rate: float, *, rngs):
        widths = [d_in, *hidden]
        self.layers = nnx.List(
            [nnx.Linear(a, b, rngs=rngs) for a, b in zip(widths[:-1], widths[1:], strict=True)]
        )
        self.out = nnx.Linear(widths[-1], d_out, rngs=rngs)
        self.drop = nnx.Dropout(rate)

    def __call__(self, h: jax.Array, key: jax.Array | None = None) -> jax.Array:
        for layer, k in zip(self.layers, dropout_keys(key, len(self.layers)), strict=True):
            h = dropout(self.drop, jax.nn.gelu(layer(h), approximate=False), k)
        return self.out(h)


def _check_reference(reference: int, num_aps: int) -> None:
    if not 0 <= reference < num_aps:
        raise ValueError(f"reference must index one of the {num_aps} APs, got {reference}")


class MLPRegressor(nnx.Module):
    """The MLP benchmark: differential phases -> position (..., 3) in metres, MAE-trained."""

    def __init__(self, num_aps: int, config: MLPConfig, *, low: Any, high: Any, rngs: nnx.Rngs):
        _check_reference(config.reference, num_aps)
        self.num_aps = num_aps
        self.config = config
        self.mlp = MLP(2 * (num_aps - 1), config.hidden, 3, config.dropout, rngs=rngs)
        self.standardizer = Standardizer(low, high)

    def standardized(self, r: Any, *, key: jax.Array | None = None) -> jax.Array:
        r = check_snapshots(r, self.num_aps)
        return self.mlp(differential_inputs(r, self.config.reference), key)

    def __call__(self, r: Any, *, key: jax.Array | None = None) -> jax.Array:
        return self.standardizer.inverse(self.standardized(r, key=key))

    def loss(self, r: Any, x: Any, key: jax.Array | None) -> jax.Array:
        z = self.standardizer.forward(jnp.asarray(x, jnp.float32))
        return jnp.mean(jnp.sum(jnp.abs(self.standardized(r, key=key) - z), axis=-1))

    def error(self, r: Any, x: Any) -> jax.Array:
        return jnp.linalg.norm(self(r) - jnp.asarray(x, jnp.float32), axis=-1)


class AmbiguityClassifier(nnx.Module):
    r"""The HI benchmark's ambiguity estimator: one softmax over Q = 2 n_max + 1 integers per
    non-reference AP (Sec. IV-B, second benchmark).

    ``__call__`` returns logits (..., M - 1, Q); the label of AP m is
    :math:`n_m + n_{\max}` with :math:`n_m` from
    :func:`~dmimo_jax.estimators.hyperbola.ambiguities`.

    Args:
        num_aps: M.
        config: widths/dropout/reference.
        ap_positions: (M, 3) AP positions: they fix the label of a training position.
        wavelength: carrier wavelength, m.
        n_max: the largest |integer| the classifier can output.
    """

    def __init__(
        self,
        num_aps: int,
        config: MLPConfig,
        *,
        ap_positions: Any,
        wavelength: float,
        n_max: int,
        rngs: nnx.Rngs,
    ):
        _check_reference(config.reference, num_aps)
        if not (isinstance(n_max, int) and n_max >= 1):
            raise ValueError(f"n_max must be a positive int, got {n_max!r}")
        self.num_aps = num_aps
        self.config = config
        self.n_max = n_max
        self.ap_positions = nnx.Variable(jnp.asarray(ap_positions, jnp.float32))
        self.wavelength = float(wavelength)
        q = 2 * n_max + 1
        self.mlp = MLP(
            2 * (num_aps - 1), config.hidden, (num_aps - 1) * q, config.dropout, rngs=rngs
        )

    @property
    def num_classes(self) -> int:
        return 2 * self.n_max + 1

    def __call__(self, r: Any, *, key: jax.Array | None = None) -> jax.Array:
        r = check_snapshots(r, self.num_aps)
        out = self.mlp(differential_inputs(r, self.config.reference), key)
        return out.reshape(*out.shape[:-1], self.num_aps - 1, self.num_classes)

    def labels(self, r: Any, x: Any) -> jax.Array:
        """Class labels (..., M - 1) of the true positions x (float64 geometry, then clipped)."""
        from dmimo_jax.estimators.hyperbola import ambiguities

        n = ambiguities(r, x, self.ap_positions[...], self.wavelength, self.config.reference)
        return jnp.clip(n + self.n_max, 0, self.num_classes - 1)

    def predict(self, r: Any) -> jax.Array:
        """Most likely integers n_m (..., M - 1)."""
        return jnp.argmax(self(r), axis=-1) - self.n_max

    def loss(self, r: Any, x: Any, key: jax.Array | None) -> jax.Array:
        """Cross-entropy, averaged over APs and the batch."""
        logits = self(r, key=key)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, self.labels(r, x)))

    def error(self, r: Any, x: Any) -> jax.Array:
        """Fraction of wrong integers per sample (0 = every ambiguity right)."""
        return jnp.mean((jnp.argmax(self(r), axis=-1) != self.labels(r, x)).astype(jnp.float32), -1)
