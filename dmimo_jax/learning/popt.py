r"""POPT: the phase-only positioning transformer (Sec. IV-A, Fig. 3), in Flax NNX, float32.

Preprocessing: tokens :math:`\mathbf t_m = [\sin r_m, \cos r_m]`, a bias-free projection
:math:`\mathbf T\mathbf E_{\mathrm T}` to :math:`D_{\mathrm{emb}}`, plus learnable AP
embeddings :math:`\mathbf E_{\mathrm{AP}}` (dropout on the sum). Encoder: N_enc pre-LayerNorm
blocks (multi-head self-attention, GELU MLP :math:`D_{\mathrm{emb}}\to D_{\mathrm{ff}}\to
D_{\mathrm{emb}}`, residuals, dropout on each branch). Output head: LayerNorm, global
average pooling over the M tokens, LayerNorm, :math:`D_{\mathrm{emb}}\to D_h\to 3` with GELU
(eqs. 28-29 of the head). The 3 outputs are standardized coordinates, mapped back to metres
by the model's :class:`~dmimo_jax.learning.nets.Standardizer`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dmimo_jax.learning.nets import (
    PositionRegressor,
    Standardizer,
    dropout,
    dropout_keys,
    network_input,
    phase_tokens,
)


@dataclasses.dataclass(frozen=True)
class POPTConfig:
    """POPT hyperparameters (Sec. VI-A). ``paper()`` is the paper's configuration."""

    d_emb: int = 256
    n_enc: int = 3
    n_head: int = 4
    d_ff: int = 1024
    d_h: int = 128
    dropout: float = 0.01
    # None: tokens of the raw phases (the paper). An AP index m0: tokens of
    # wrap(r_m - r_m0), which removes the CPO before the network sees it (beyond the paper;
    # the token format is unchanged, token m0 becomes constant)
    reference: int | None = None

    def __post_init__(self):
        for name in ("d_emb", "n_enc", "n_head", "d_ff", "d_h"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.d_emb % self.n_head:
            raise ValueError(f"d_emb ({self.d_emb}) must be a multiple of n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.reference is not None and not (
            isinstance(self.reference, int) and self.reference >= 0
        ):
            raise ValueError(f"reference must be None or an AP index, got {self.reference!r}")

    @classmethod
    def paper(cls) -> POPTConfig:
        """D_emb 256, N_enc 3, N_head 4, D_ff 1024, D_h 128, dropout 0.01 (~2.4 M parameters)."""
        return cls()

    @classmethod
    def cpu(cls) -> POPTConfig:
        """The ``cpu`` training preset's network: small enough to train on 2 cores in minutes."""
        return cls(d_emb=64, n_enc=2, n_head=4, d_ff=256, d_h=64, dropout=0.0, reference=0)

    @classmethod
    def tiny(cls) -> POPTConfig:
        """For tests and doctests."""
        return cls(d_emb=16, n_enc=1, n_head=2, d_ff=32, d_h=16, dropout=0.0)


class EncoderBlock(nnx.Module):
    """One pre-LayerNorm transformer encoder block (Sec. IV-A-2)."""

    def __init__(self, cfg: POPTConfig, *, rngs: nnx.Rngs):
        d = cfg.d_emb
        self.ln1 = nnx.LayerNorm(d, rngs=rngs)
        self.attn = nnx.MultiHeadAttention(
            cfg.n_head, d, d, d, decode=False, deterministic=True, rngs=rngs, keep_rngs=False
        )
        self.ln2 = nnx.LayerNorm(d, rngs=rngs)
        self.ff1 = nnx.Linear(d, cfg.d_ff, rngs=rngs)
        self.ff2 = nnx.Linear(cfg.d_ff, d, rngs=rngs)
        self.drop = nnx.Dropout(cfg.dropout)

    def __call__(self, h: jax.Array, key: jax.Array | None = None) -> jax.Array:
        k1, k2 = dropout_keys(key, 2)
        h = h + dropout(self.drop, self.attn(self.ln1(h)), k1)
        ff = self.ff2(jax.nn.gelu(self.ff1(self.ln2(h)), approximate=False))
        return h + dropout(self.drop, ff, k2)


class POPT(PositionRegressor, nnx.Module):
    """POPT for ``num_aps`` APs.

    Args:
        num_aps: M, the number of tokens (one per AP, in the scene's AP order).
        config: :class:`POPTConfig`.
        low: the UE region (3,), m, used to standardize the targets.
        high: see ``low``.
        rngs: ``nnx.Rngs`` for the initialization.

    ``model(r)`` maps wrapped phases (..., M) to positions (..., 3) in metres (float32);
    ``model(r, key=k)`` applies dropout (training).
    """

    config_type = POPTConfig

    def __init__(self, num_aps: int, config: POPTConfig, *, low: Any, high: Any, rngs: nnx.Rngs):
        if not (isinstance(num_aps, int) and num_aps >= 2):
            raise ValueError(f"num_aps must be an int >= 2, got {num_aps!r}")
        if config.reference is not None and config.reference >= num_aps:
            raise ValueError(
                f"config.reference must index one of the {num_aps} APs, got {config.reference}"
            )
        self.num_aps = num_aps
        self.config = config
        d = config.d_emb
        self.project = nnx.Linear(2, d, use_bias=False, rngs=rngs)  # E_T
        # E_AP, N(0, 1) like nnx.Embed: with ViT's 0.02 the embeddings are tiny next to the
        # unit-scale phase tokens, the encoder starts out permutation invariant (it cannot
        # tell the APs apart) and training sat on the mean-position plateau (measured)
        self.ap_embedding = nnx.Param(jax.random.normal(rngs.params(), (num_aps, d), jnp.float32))
        self.drop = nnx.Dropout(config.dropout)
        self.blocks = nnx.List([EncoderBlock(config, rngs=rngs) for _ in range(config.n_enc)])
        self.ln_out = nnx.LayerNorm(d, rngs=rngs)
        self.ln_head = nnx.LayerNorm(d, rngs=rngs)
        self.head1 = nnx.Linear(d, config.d_h, rngs=rngs)
        self.head2 = nnx.Linear(config.d_h, 3, rngs=rngs)
        self.standardizer = Standardizer(low, high)

    def standardized(self, r: Any, *, key: jax.Array | None = None) -> jax.Array:
        """The network output before un-standardizing (..., 3)."""
        r = network_input(r, self.num_aps)
        if self.config.reference is not None:
            m0 = self.config.reference
            r = r - jnp.broadcast_to(r[..., m0 : m0 + 1], r.shape)  # sin/cos make the wrap moot
        keys = dropout_keys(key, 1 + len(self.blocks))
        h = self.project(phase_tokens(r))
        h = h + jnp.broadcast_to(self.ap_embedding[...], h.shape)  # H^(0) = T E_T + E_AP
        h = dropout(self.drop, h, keys[0])
        for block, k in zip(self.blocks, keys[1:], strict=True):
            h = block(h, k)
        g = jnp.mean(self.ln_out(h), axis=-2)  # GAP(LN(H^(N_enc)))
        return self.head2(jax.nn.gelu(self.head1(self.ln_head(g)), approximate=False))

    kind = "popt"  # model-file kind (dmimo_jax.learning.io)

    # the offline stage's kind of estimator (EstimatorNetwork, learning.io.ESTIMATORS)
    estimator_kind = "popt"

    @classmethod
    def for_training(cls, scene: Any, preset: Any, network: Any = None, *, rngs: nnx.Rngs) -> POPT:
        """A fresh network for ``scene``: ``network`` (a config) or the ``preset``'s."""
        return cls(
            scene.num_aps, network or preset.popt, low=scene.ue_low, high=scene.ue_high, rngs=rngs
        )
