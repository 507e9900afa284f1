"""Pieces shared by the learned estimators: target standardization, inputs, pure apply.

Every network here is a Flax NNX module (the API the Flax docs recommend for new code)
in float32. Each turns wrapped phases (..., M) into its output and owns three things the
training loop relies on:

* ``__call__(r, *, key=None)``: the estimate; ``key`` switches dropout on (training).
* ``loss(r, x, key)``: the training loss on a minibatch (float32 scalar).
* ``error(r, x)``: a per-sample validation error (m for position regressors).

:func:`functional` turns any of them into a pure ``apply(state, r) -> out`` for
jit/vmap/grad; :func:`jit_method` runs one of a module's methods as one jitted program of
its current state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dmimo_jax._checks import check_phases


class Stat(nnx.Variable):
    """A fixed (not trained) array stored with the model: target mean and scale."""


class Standardizer(nnx.Module):
    """Positions to zero-mean, unit-scale coordinates and back (targets of the regressors).

    Args:
        low, high: the UE region box (3,), m: mean (low + high)/2, scale = the std of a
            uniform distribution on the box, (high - low)/sqrt(12).
    """

    def __init__(self, low: Any, high: Any):
        low, high = jnp.asarray(low, jnp.float32), jnp.asarray(high, jnp.float32)
        self.mean = Stat(0.5 * (low + high))
        self.scale = Stat((high - low) / jnp.sqrt(12.0).astype(jnp.float32))

    def forward(self, x: jax.Array) -> jax.Array:
        return (x - jnp.broadcast_to(self.mean[...], x.shape)) / jnp.broadcast_to(
            self.scale[...], x.shape
        )

    def box(self) -> dict[str, list[float]]:
        """The UE region it was built from: ``{"low": [...], "high": [...]}`` (m)."""
        mean, scale = np.asarray(self.mean[...]), np.asarray(self.scale[...])
        return dict(
            low=(mean - np.sqrt(3) * scale).tolist(), high=(mean + np.sqrt(3) * scale).tolist()
        )

    def inverse(self, z: jax.Array) -> jax.Array:
        return z * jnp.broadcast_to(self.scale[...], z.shape) + jnp.broadcast_to(
            self.mean[...], z.shape
        )


def network_input(r: Any, num_aps: int) -> jax.Array:
    """Phases (..., M) as the float32 network input, validated by
    :func:`dmimo_jax._checks.check_phases` (``ValueError`` for the wrong M or non-finite
    values of concrete inputs)."""
    check_phases("r", r, num_aps, batched="any")
    return jnp.asarray(r).astype(jnp.float32)


def phase_tokens(r: jax.Array) -> jax.Array:
    r"""POPT tokens :math:`\mathbf t_m = [\sin r_m, \cos r_m]` (Sec. IV-A-1): (..., M, 2)."""
    return jnp.stack([jnp.sin(r), jnp.cos(r)], axis=-1)


def differential_inputs(r: jax.Array, reference: int = 0) -> jax.Array:
    r"""CPO-free inputs of the benchmarks: sin/cos of :math:`r_m - r_{\mathrm{ref}}`, m != ref.

    The common phase offset cancels in the difference, so the network does not have to
    learn the invariance. Output (..., 2 (M - 1)).
    """
    others = [m for m in range(r.shape[-1]) if m != reference]
    d = r[..., others] - r[..., reference : reference + 1]
    return jnp.concatenate([jnp.sin(d), jnp.cos(d)], axis=-1)


def functional(model: nnx.Module) -> tuple[Callable[..., Any], nnx.State]:
    """A pure ``apply(state, r, *, key=None)`` and the model's state (all variables).

    >>> from flax import nnx
    >>> from dmimo_jax.learning.popt import POPT, POPTConfig
    >>> net = POPT(17, POPTConfig.tiny(), low=[0, 0, 0], high=[1, 1, 1], rngs=nnx.Rngs(0))
    >>> apply, state = functional(net)
    >>> apply(state, jnp.zeros((5, 17))).shape
    (5, 3)
    """
    graphdef, state = nnx.split(model)

    def apply(state: nnx.State, r: Any, *, key: jax.Array | None = None) -> Any:
        return nnx.merge(graphdef, state)(r, key=key)

    return apply, state


def inference_fn(model: nnx.Module) -> Callable[[Any], Any]:
    """A jitted ``r -> model(r)`` with the weights baked in as constants (inference only).

    Closing over the weights instead of passing the state skips flattening the state's
    leaves on every call (the latency this saves: ``benchmarks/popt_latency.py``,
    docs/learning_measurements.md). The function sees the weights as they are now; rebuild it after
    further training.
    """
    graphdef, state = nnx.split(model)
    return jax.jit(lambda r: nnx.merge(graphdef, state)(r))


def jit_method(model: nnx.Module, method: str, *args: Any, **static: Any) -> Any:
    """``getattr(model, method)(*args, **static)`` run as one jitted program of the model's
    current state (op by op, every operation of an eager call dispatches, and compiles at a
    new shape, on its own).

    The state is split on every call and passed as an argument, so further training is
    always seen; JAX's compilation cache is keyed by the model's structure, ``method`` and
    the ``static`` keyword values (hashable, e.g. an int ``k``), never by the weights.
    """
    graphdef, state = nnx.split(model)
    return _jit_method(graphdef, state, method, tuple(sorted(static.items())), *args)


@partial(jax.jit, static_argnums=(0, 2, 3))
def _jit_method(graphdef: Any, state: Any, method: str, static: tuple, *args: Any) -> Any:
    return getattr(nnx.merge(graphdef, state), method)(*args, **dict(static))


class EstimatorNetwork:
    """What the offline stage needs of a network class (a mixin of an NNX module): its
    ``estimator_kind`` (the key of :data:`~dmimo_jax.learning.io.ESTIMATORS`) and
    ``for_training(scene, preset, network, *, rngs)``, a fresh network for a scene; these
    defaults for the rest: the preset's training settings, the trained network itself as the
    online stage's coarse estimator."""

    estimator_kind: str

    @staticmethod
    def training_config(preset: Any) -> Any:
        """The training loop's settings in ``preset``."""
        return preset.train

    @staticmethod
    def as_estimator(net: Any, scene: Any) -> Any:
        """The online stage's coarse estimator of the trained ``net``."""
        return net


class PositionRegressor(EstimatorNetwork):
    """The regression head shared by POPT and the MLP benchmark (a mixin of an NNX module).

    A subclass sets ``num_aps``, ``config`` (a dataclass of type ``config_type``) and
    ``standardizer`` (:class:`Standardizer`) and defines ``standardized(r, *, key)``, the
    network output in standardized coordinates (..., 3); this class turns it into
    positions, the training loss (MAE on standardized targets, Sec. VI-A), the validation
    error and the model-file spec.
    """

    config_type: type

    def __call__(self, r: Any, *, key: jax.Array | None = None) -> jax.Array:
        """Positions (..., 3), m (float32); ``key`` switches dropout on (training)."""
        return self.standardizer.inverse(self.standardized(r, key=key))

    def loss(self, r: Any, x: Any, key: jax.Array | None) -> jax.Array:
        """MAE on standardized targets (Sec. VI-A): mean over the batch of the L1 norm."""
        z = self.standardizer.forward(jnp.asarray(x, jnp.float32))
        return jnp.mean(jnp.sum(jnp.abs(self.standardized(r, key=key) - z), axis=-1))

    def error(self, r: Any, x: Any) -> jax.Array:
        """Euclidean position error per sample, m."""
        return jnp.linalg.norm(self(r) - jnp.asarray(x, jnp.float32), axis=-1)

    def spec(self) -> dict:
        """JSON-able architecture: what :meth:`from_spec` rebuilds."""
        return dict(
            num_aps=self.num_aps, config=dataclasses.asdict(self.config), **self.standardizer.box()
        )

    @classmethod
    def from_spec(cls, spec: dict, *, rngs: nnx.Rngs) -> Any:
        """A freshly initialized network of the architecture in ``spec``."""
        cfg = cls.config_type(**spec["config"])
        return cls(spec["num_aps"], cfg, low=spec["low"], high=spec["high"], rngs=rngs)


def dropout_keys(key: jax.Array | None, num: int) -> list[jax.Array | None]:
    """``num`` independent dropout keys, or ``None`` each (deterministic) when key is None."""
    return [None] * num if key is None else list(jax.random.split(key, num))


def dropout(layer: nnx.Dropout, h: jax.Array, key: jax.Array | None) -> jax.Array:
    return h if key is None else layer(h, deterministic=False, rngs=key)
