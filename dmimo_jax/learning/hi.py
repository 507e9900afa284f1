r"""The HI benchmark (Sec. IV-B, second benchmark) in one place: the ambiguity classifier
and the estimator that intersects its hyperboloids.

The geometry (integer ambiguities, hyperboloid residuals, the Levenberg-Marquardt
intersection) lives in :mod:`dmimo_jax.estimators.hyperbola`; this module adds the
learned part and composes the two into a coarse estimator.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.typing import ArrayLike

from dmimo_jax.estimators.hyperbola import ambiguities, default_starts, estimate, max_ambiguity
from dmimo_jax.learning.mlp import MLP, MLPConfig, check_reference
from dmimo_jax.learning.nets import (
    EstimatorNetwork,
    differential_inputs,
    jit_method,
    network_input,
)
from dmimo_jax.scene import Scene


class AmbiguityClassifier(EstimatorNetwork, nnx.Module):
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
        check_reference(config.reference, num_aps)
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
        """The number of ambiguity classes the classifier tells apart."""
        return 2 * self.n_max + 1

    def __call__(self, r: Any, *, key: jax.Array | None = None) -> jax.Array:
        r = network_input(r, self.num_aps)
        out = self.mlp(differential_inputs(r, self.config.reference), key)
        return out.reshape(*out.shape[:-1], self.num_aps - 1, self.num_classes)

    def labels(self, r: Any, x: Any) -> jax.Array:
        """Class labels (..., M - 1) of the true positions x (float64 geometry, then clipped)."""
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

    kind = "hi_classifier"  # model-file kind (dmimo_jax.learning.io)

    # the offline stage's kind of estimator (EstimatorNetwork, learning.io.ESTIMATORS)
    estimator_kind = "hi"

    @classmethod
    def for_training(
        cls, scene: Any, preset: Any, network: Any = None, *, rngs: nnx.Rngs
    ) -> AmbiguityClassifier:
        """A fresh network for ``scene``: ``network`` (a config) or the ``preset``'s."""
        return cls.for_scene(scene, network or MLPConfig(), rngs=rngs)

    @staticmethod
    def as_estimator(net: Any, scene: Any) -> Any:
        """The online stage's coarse estimator of the trained ``net``."""
        return HIEstimator(net, scene)

    def spec(self) -> dict:
        """JSON-able architecture: what :meth:`from_spec` rebuilds."""
        return dict(
            num_aps=self.num_aps,
            config=dataclasses.asdict(self.config),
            ap_positions=np.asarray(self.ap_positions[...]).tolist(),
            wavelength=self.wavelength,
            n_max=self.n_max,
        )

    @classmethod
    def from_spec(cls, spec: dict, *, rngs: nnx.Rngs) -> AmbiguityClassifier:
        """A freshly initialized network of the architecture in ``spec``."""
        return cls(
            spec["num_aps"],
            MLPConfig(**spec["config"]),
            ap_positions=spec["ap_positions"],
            wavelength=spec["wavelength"],
            n_max=spec["n_max"],
            rngs=rngs,
        )

    @classmethod
    def for_scene(cls, scene: Scene, config: MLPConfig, *, rngs: nnx.Rngs) -> AmbiguityClassifier:
        """The classifier of ``scene``'s APs, with n_max from
        :func:`~dmimo_jax.estimators.hyperbola.max_ambiguity`."""
        n_max = max_ambiguity(scene.ap_positions, float(scene.wavelength), config.reference)
        return cls(
            scene.num_aps,
            config,
            ap_positions=scene.ap_positions,
            wavelength=float(scene.wavelength),
            n_max=n_max,
            rngs=rngs,
        )


class HIEstimator:
    """The HI benchmark's coarse stage: ambiguity classifier + hyperboloid intersection.

    Args:
        classifier: a trained :class:`AmbiguityClassifier`.
        scene: gives the UE region (the solver's starts).
    """

    def __init__(self, classifier: AmbiguityClassifier, scene: Scene):
        self.classifier = classifier
        self.num_aps = classifier.num_aps
        self.starts = default_starts(scene.ue_low, scene.ue_high)
        self.low, self.high = jnp.asarray(scene.ue_low), jnp.asarray(scene.ue_high)

    def __call__(self, r: ArrayLike) -> jax.Array:
        """Positions (B, 3), projected onto the UE region: with wrong integers the
        hyperboloids need not meet, and the unconstrained least-squares point can lie
        arbitrarily far away."""
        r = jnp.asarray(r)
        network_input(r, self.num_aps)  # the classifier's input checks, before tracing
        n = jit_method(self.classifier, "predict", r)
        ap = jnp.asarray(self.classifier.ap_positions[...], self.starts.dtype)
        x = estimate(
            r,
            n,
            ap,
            self.classifier.wavelength,
            self.starts,
            reference=self.classifier.config.reference,
        )
        return jnp.clip(x, self.low[None, :], self.high[None, :])
