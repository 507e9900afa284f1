r"""The MLP benchmark (Sec. IV-B, first benchmark) and the dense layers the HI classifier shares.

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
from flax import nnx

from dmimo_jax.learning.nets import (
    PositionRegressor,
    Standardizer,
    differential_inputs,
    dropout,
    dropout_keys,
    network_input,
)


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


def check_reference(reference: int, num_aps: int) -> None:
    """``ValueError`` unless ``reference`` indexes one of the ``num_aps`` APs."""
    if not 0 <= reference < num_aps:
        raise ValueError(f"reference must index one of the {num_aps} APs, got {reference}")


class MLPRegressor(PositionRegressor, nnx.Module):
    """The MLP benchmark: differential phases -> position (..., 3) in metres, MAE-trained."""

    config_type = MLPConfig

    def __init__(self, num_aps: int, config: MLPConfig, *, low: Any, high: Any, rngs: nnx.Rngs):
        check_reference(config.reference, num_aps)
        self.num_aps = num_aps
        self.config = config
        self.mlp = MLP(2 * (num_aps - 1), config.hidden, 3, config.dropout, rngs=rngs)
        self.standardizer = Standardizer(low, high)

    def standardized(self, r: Any, *, key: jax.Array | None = None) -> jax.Array:
        r = network_input(r, self.num_aps)
        return self.mlp(differential_inputs(r, self.config.reference), key)

    kind = "mlp"  # model-file kind (dmimo_jax.learning.io)

    # the offline stage's kind of estimator (EstimatorNetwork, learning.io.ESTIMATORS)
    estimator_kind = "mlp"

    @classmethod
    def for_training(
        cls, scene: Any, preset: Any, network: Any = None, *, rngs: nnx.Rngs
    ) -> MLPRegressor:
        """A fresh network for ``scene``: ``network`` (a config) or the ``preset``'s."""
        config = network or MLPConfig()
        return cls(scene.num_aps, config, low=scene.ue_low, high=scene.ue_high, rngs=rngs)
