r"""A learned coarse stage that works at room scale (beyond the paper): cell classification.

POPT regresses the position with an L1 loss; over the paper's 9 x 9 x 3 m UE region the
phases repeat every ~lambda/2, and regression stalls near the mean position
(docs/learning_measurements.md has the numbers). Classifying the position into the cells
of a regular partition (:class:`~dmimo_jax.estimators.CellGrid`, 1 m cubes: 243 cells
here) does not stall: the network only has to say which cell the
phases come from, and the safeguard refines inside its K most likely cells
(:func:`~dmimo_jax.estimators.candidate_search`). The probability mass of those K cells
is the confidence signal: below a threshold the online stage falls back to the
whole-region screen.

Inputs are the CPO-free differential phases :math:`\sin/\cos(r_m - r_{\mathrm{ref}})`
(:func:`~dmimo_jax.learning.nets.differential_inputs`); the body is the MLP of the
benchmarks (GELU); the loss is cross-entropy over the cells, the validation error the
top-K miss rate. Float32, Flax NNX; trained by :func:`~dmimo_jax.learning.train`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dmimo_jax.estimators.candidates import CellGrid, cell_grid
from dmimo_jax.learning.mlp import MLP, MLPConfig, check_reference
from dmimo_jax.learning.nets import EstimatorNetwork, differential_inputs, network_input


@dataclasses.dataclass(frozen=True)
class CellConfig(MLPConfig):
    """:class:`~dmimo_jax.learning.mlp.MLPConfig` (widths, dropout, reference AP, checked
    there) with wider defaults and the K of the validation error."""

    hidden: tuple[int, ...] = (1024, 1024, 1024)
    top_k: int = 8

    def __post_init__(self):
        super().__post_init__()
        if not (isinstance(self.top_k, int) and self.top_k >= 1):
            raise ValueError(f"top_k must be a positive int, got {self.top_k!r}")

    @classmethod
    def tiny(cls) -> CellConfig:
        return cls(hidden=(64, 64), top_k=2)


class CellClassifier(EstimatorNetwork, nnx.Module):
    """Phases (..., M) -> logits over the cells of ``cells`` (..., C).

    Args:
        num_aps: M.
        config: :class:`CellConfig`.
        cells: the partition of the UE region (its geometry is stored with the model).
        rngs: ``nnx.Rngs`` for the initialization.
    """

    kind = "cells"  # model-file kind (dmimo_jax.learning.io)

    # the offline stage's kind of estimator (EstimatorNetwork, learning.io.ESTIMATORS)
    estimator_kind = "cells"

    @classmethod
    def for_training(
        cls, scene: Any, preset: Any, network: Any = None, *, rngs: nnx.Rngs
    ) -> CellClassifier:
        """A fresh network for ``scene``: ``network`` (a config) or the ``preset``'s."""
        cells = cell_grid(scene, preset.cells.cell_size)
        return cls(scene.num_aps, network or preset.cells.network, cells=cells, rngs=rngs)

    @staticmethod
    def training_config(preset: Any) -> Any:
        """The training loop's settings in ``preset``."""
        return preset.cells.train

    def __init__(self, num_aps: int, config: CellConfig, *, cells: CellGrid, rngs: nnx.Rngs):
        check_reference(config.reference, num_aps)
        if config.top_k > cells.num_cells:
            raise ValueError(f"top_k={config.top_k} exceeds the {cells.num_cells} cells")
        self.num_aps = num_aps
        self.config = config
        self.cell_low = tuple(float(v) for v in np.asarray(cells.low))
        self.cell_size = float(cells.cell_size)
        self.cell_shape = tuple(int(n) for n in cells.shape)
        self.mlp = MLP(2 * (num_aps - 1), config.hidden, cells.num_cells, config.dropout, rngs=rngs)

    @property
    def cells(self) -> CellGrid:
        """The partition (float32 corner: the labels are computed in the network's dtype)."""
        return CellGrid(jnp.asarray(self.cell_low, jnp.float32), self.cell_size, self.cell_shape)

    def __call__(self, r: Any, *, key: jax.Array | None = None) -> jax.Array:
        r = network_input(r, self.num_aps)
        return self.mlp(differential_inputs(r, self.config.reference), key)

    def labels(self, x: Any) -> jax.Array:
        """The cell index of each true position (...,)."""
        return self.cells.index(jnp.asarray(x, jnp.float32))

    def loss(self, r: Any, x: Any, key: jax.Array | None) -> jax.Array:
        """Cross-entropy over the cells, averaged over the batch."""
        logits = self(r, key=key)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, self.labels(x)))

    def error(self, r: Any, x: Any) -> jax.Array:
        """1 where the true cell is not among the ``config.top_k`` most likely, else 0."""
        _, idx = jax.lax.top_k(self(r), self.config.top_k)
        hit = jnp.any(idx == self.labels(x)[..., None], axis=-1)
        return 1.0 - hit.astype(jnp.float32)

    def top_cells(self, r: Any, k: int) -> tuple[jax.Array, jax.Array]:
        """The ``k`` most likely cells (..., k), most likely first, and their probabilities
        (..., k)."""
        logp = jax.nn.log_softmax(self(r), axis=-1)
        top, idx = jax.lax.top_k(logp, k)
        return idx, jnp.exp(top)

    def spec(self) -> dict:
        """JSON-able architecture: what :meth:`from_spec` rebuilds."""
        return dict(
            num_aps=self.num_aps,
            config=dataclasses.asdict(self.config),
            cell_low=list(self.cell_low),
            cell_size=self.cell_size,
            cell_shape=list(self.cell_shape),
        )

    @classmethod
    def from_spec(cls, spec: dict, *, rngs: nnx.Rngs) -> CellClassifier:
        """A freshly initialized network of the architecture in ``spec``."""
        cells = CellGrid(
            jnp.asarray(spec["cell_low"]), float(spec["cell_size"]), tuple(spec["cell_shape"])
        )
        return cls(spec["num_aps"], CellConfig(**spec["config"]), cells=cells, rngs=rngs)
