r"""Complex snapshots from real receivers: per-AP gains and additive constants (beyond the paper).

The paper's receivers measure a phase. Real ones measure a complex channel, and add
impairments of their own. The measurement model of this module, for one snapshot at
:math:`\mathbf x`,

.. math::

    h_m = s\,G_m\,c_m(\mathbf x) + b_m + w_m,\qquad w_m\sim\mathcal{CN}(0, \sigma_w^2),

with

* :math:`c_m(\mathbf x) = \sqrt{P}\alpha_m(\mathbf x)\,e^{j\mu_m(\mathbf x)}` the model's
  channel (any PhaseModel: its mean phase :math:`\mu_m` and, through eq. (9), its amplitude
  :math:`\sqrt{P}\alpha_m = \sqrt{\sigma_w^2 / (2\sigma_m^2)}` from its variance; so patterns,
  rooms and the GP all give one);
* :math:`G_m` a complex gain per receiver (its phase a static offset beyond the model's own
  ``ap_phase_offsets``, its modulus the receiver's gain);
* :math:`b_m` an additive complex constant per receiver (a DC offset or reference leakage:
  it does not move with the UE or with the snapshot's transmit factor);
* :math:`s` one complex factor per snapshot: the CPO :math:`e^{j\phi}` and the transmit gain
  together.

Sign convention: the phase convention of the rest of the package, :math:`\arg h_m = \mu_m +
\phi` (the phase grows with distance, as the Techtile files store it); the paper's received
signal of eq. (6) is the conjugate (:func:`~dmimo_jax.measure.received_signal`). With ideal
receivers (:math:`G = 1, b = 0`) and :math:`s = e^{j\phi}`, :math:`\arg h` is the paper's
wrapped phase of eq. (8) at high SNR: the phase-only model is the special case.

The snapshot factor is profiled out in closed form, :math:`\hat s = \mathbf v^H(\mathbf h -
\mathbf b)/\|\mathbf v\|^2` with :math:`\mathbf v = \mathbf G\odot\mathbf c(\mathbf x)` (as
the CPO is in eq. 15), which leaves the complex least-squares cost
:math:`\|\mathbf h - \mathbf b\|^2 - |\mathbf v^H(\mathbf h - \mathbf b)|^2/\|\mathbf v\|^2`
(:func:`profiled_residuals`), and its Fisher information the Schur complement of the
snapshot factor (:func:`dmimo_jax.bounds.complex_fim`, :func:`dmimo_jax.bounds.complex_peb`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_finite, check_positions, check_scalar, is_concrete
from dmimo_jax.physics import PhaseModel, as_phase_model, check_in_domain
from dmimo_jax.pytree import pytree_dataclass

__all__ = [
    "ReceiverModel",
    "channel",
    "check_noise_variances",
    "check_receivers",
    "expected_snapshot",
    "ideal_receivers",
    "profiled_residuals",
    "random_receivers",
    "simulate_snapshots",
    "whiten",
]


@pytree_dataclass(init=False)
class Receivers:
    """The receivers' impairments (a pytree).

    Attributes:
        gains: (M,) complex :math:`G_m` (relative to the model's own phase offsets).
        constants: (M,) complex :math:`b_m`, in the units of the snapshots
            (:math:`\\sqrt{\\text{W}}`, as :func:`channel`).

    Raises:
        ValueError: shapes that differ or are not (M,), non-finite values, a zero gain.
    """

    gains: Array
    constants: Array

    def __init__(self, gains: ArrayLike, constants: ArrayLike | None = None):
        g = jnp.asarray(gains, jnp.result_type(complex))
        b = jnp.zeros_like(g) if constants is None else jnp.asarray(constants, g.dtype)
        if g.ndim != 1 or b.shape != g.shape:
            raise ValueError(
                f"gains and constants must both have shape (M,), got {g.shape} and {b.shape}"
            )
        for name, v in (("gains", g), ("constants", b)):
            if is_concrete(v) and not np.all(np.isfinite(np.asarray(v))):
                bad = np.flatnonzero(~np.isfinite(np.asarray(v))).tolist()
                raise ValueError(
                    f"{name} must be finite, got NaN or inf for AP(s) {bad[:10]} (a receiver "
                    "that heard nothing has no gain to estimate: leave that AP out)"
                )
        if is_concrete(g) and np.any(np.abs(np.asarray(g)) == 0):
            raise ValueError("gains must be non-zero (a receiver with gain 0 measures nothing)")
        object.__setattr__(self, "gains", g)
        object.__setattr__(self, "constants", b)

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.gains.shape[0]


@pytree_dataclass
class ReceiverModel:
    r"""A PhaseModel seen through receivers: the complex measurement model of the module
    (a pytree; ``scene`` and ``num_aps`` are the model's).

    It is a PhaseModel itself: ``mean`` the phases of :math:`G_m c_m` (the model's plus the
    gains'), ``variance`` the model's over :math:`|G_m|^2` (a gain scales the SNR), and its
    matched filter (:func:`~dmimo_jax.estimators.expected_phasor`) is the normalized
    conjugate channel :math:`\mathbf v^*/\|\mathbf v\|`, so the coherent search of the
    snapshots with :math:`\mathbf b` removed maximizes the complex least-squares score
    :math:`|\mathbf v^H(\mathbf h - \mathbf b)|^2/\|\mathbf v\|^2`
    (:func:`~dmimo_jax.estimators.complex_search`).

    Attributes:
        model: the PhaseModel of the channel (not itself a ReceiverModel).
        receivers: the :class:`Receivers`, one per AP of ``model``.

    Raises:
        ValueError: a ``model`` that is not a PhaseModel (or is a ReceiverModel: its gains
            would apply twice), ``receivers`` that are not :class:`Receivers` for its M APs.
    """

    model: Any
    receivers: Receivers

    def __post_init__(self) -> None:  # the constructor's checks (unflattening skips them)
        if isinstance(self.model, ReceiverModel):
            raise ValueError(
                "model is already a ReceiverModel: its gains would apply twice; pass its .model"
            )
        as_phase_model(self.model)
        check_receivers(self.receivers, self.model)

    @property
    def scene(self) -> Any:
        """The deployment the model describes."""
        return self.model.scene

    @property
    def num_aps(self) -> int:
        """The number of APs, M."""
        return self.model.num_aps

    # ------------------------------ CalibratableModel: the channel model's, receivers kept

    @property
    def surface_names(self) -> tuple[str, ...]:
        """The names of the model's surfaces (one permittivity each)."""
        return self.model.surface_names

    @property
    def piecewise(self) -> bool:
        """Whether the phases jump across boundaries (shadows): a piecewise model."""
        return self.model.piecewise

    def with_scene(self, scene: Any) -> ReceiverModel:
        return ReceiverModel(self.model.with_scene(scene), self.receivers)

    def with_permittivities(self, eps_r: Array, indices: tuple[int, ...]) -> ReceiverModel:
        return ReceiverModel(self.model.with_permittivities(eps_r, indices), self.receivers)

    def mounted(self) -> list[list[Any]]:
        return self.model.mounted()

    def calibration_surfaces(self, surfaces: Any = None) -> tuple[list[int], list[str]]:
        return self.model.calibration_surfaces(surfaces)

    def channel(self, x: ArrayLike) -> Array:
        r""":math:`\mathbf v(\mathbf x) = \mathbf G\odot\mathbf c(\mathbf x)` (M,) complex."""
        return self.receivers.gains * channel(self.model, x)

    def mean(self, x: ArrayLike) -> Array:
        r"""Phases of :math:`G_m c_m(\mathbf x)`, (M,) rad, unwrapped."""
        return self.model.mean(x) + jnp.angle(self.receivers.gains)

    def variance(self, x: ArrayLike) -> Array:
        """Phase-noise variance through the gains, (M,) rad^2."""
        return self.model.variance(x) / jnp.abs(self.receivers.gains) ** 2

    def matched_filter(self, x: ArrayLike) -> Array:
        r""":math:`\mathbf v^*(\mathbf x)/\|\mathbf v(\mathbf x)\|` (M,) complex."""
        v = self.channel(x)
        return jnp.conj(v) / jnp.sqrt(jnp.sum(jnp.abs(v) ** 2))


def ideal_receivers(num_aps: int, dtype: Any = None) -> Receivers:
    """:math:`G = 1, b = 0`: the paper's receivers."""
    dtype = jnp.result_type(complex) if dtype is None else dtype
    return Receivers(jnp.ones(num_aps, dtype), jnp.zeros(num_aps, dtype))


def random_receivers(
    key: Array, model: PhaseModel, *, gain_db_std: float = 1.0, constant_ratio: float = 1.0
) -> Receivers:
    """Receivers as a deployment may have them: gains of uniform phase and log-normal modulus
    (``gain_db_std`` dB), and constants of uniform phase whose modulus is ``constant_ratio``
    times the median pilot amplitude over the UE region's centre (1: as strong as the pilot,
    as measured on the Techtile receivers).

    Raises:
        ValueError: ``gain_db_std`` or ``constant_ratio`` negative or not finite.
    """
    for name, value in (("gain_db_std", gain_db_std), ("constant_ratio", constant_ratio)):
        check_scalar(name, value)
        if is_concrete(value) and value < 0:
            raise ValueError(f"{name} must be >= 0, got {value!r}")
    model = as_phase_model(model)
    m = model.num_aps
    k_ph, k_mod, k_b = jax.random.split(key, 3)
    dtype = model.scene.ap_positions.dtype
    phase = jax.random.uniform(k_ph, (m,), dtype, -jnp.pi, jnp.pi)
    modulus = 10 ** (gain_db_std * jax.random.normal(k_mod, (m,), dtype) / 20)
    centre = (model.scene.ue_low + model.scene.ue_high) / 2
    pilot = jnp.median(jnp.abs(channel(model, centre)))
    b_phase = jax.random.uniform(k_b, (m,), dtype, -jnp.pi, jnp.pi)
    return Receivers(modulus * jnp.exp(1j * phase), constant_ratio * pilot * jnp.exp(1j * b_phase))


def channel(model: PhaseModel, x: ArrayLike) -> Array:
    r""":math:`c_m(\mathbf x) = \sqrt{\sigma_w^2/(2\sigma_m^2)}\,e^{j\mu_m(\mathbf x)}` (M,)
    complex: eq. (9) read backwards for the amplitude (an AP with no signal, infinite
    variance, gives 0, with a zero forward-mode derivative: its phase and variance have
    none). Traceable; one position."""
    var = model.variance(x)
    heard = jnp.isfinite(var)
    amp = jnp.sqrt(model.scene.noise_power / (2.0 * jnp.where(heard, var, 1.0)))
    return jnp.where(heard, amp * jnp.exp(1j * model.mean(x)), 0.0)


def expected_snapshot(
    model: PhaseModel, x: ArrayLike, receivers: Receivers, s: ArrayLike = 1.0
) -> Array:
    r"""Noise-free :math:`s\,\mathbf G\odot\mathbf c(\mathbf x) + \mathbf b` (M,) complex."""
    return s * receivers.gains * channel(model, x) + receivers.constants


def simulate_snapshots(
    key: Array, model: PhaseModel, xs: ArrayLike, receivers: Receivers, s: ArrayLike
) -> Array:
    r"""Complex snapshots :math:`\mathbf h_n` (N, M) at positions ``xs`` (N, 3) with snapshot
    factors ``s`` (N,) complex (e.g. :math:`e^{j\phi_n}` for random CPOs): the module's
    model with :math:`\mathcal{CN}(0, \sigma_w^2)` noise, :math:`\sigma_w^2` the scene's
    noise power.

    Raises:
        ValueError: positions not (N, 3) inside the model's domain, ``s`` not (N,) finite,
            receivers for another number of APs, a ``model`` that is a ReceiverModel (its
            gains would apply twice: pass its ``.model`` and ``.receivers``).
    """
    if isinstance(model, ReceiverModel):
        raise ValueError(
            "model is a ReceiverModel: its gains would apply twice with receivers; pass "
            "model.model and model.receivers"
        )
    model = as_phase_model(model)
    check_positions("xs", xs, batched=True)
    check_in_domain("xs", xs, model)
    xs = jnp.asarray(xs)
    s = jnp.asarray(s, jnp.result_type(xs.dtype, complex))
    if s.shape != xs.shape[:1]:
        raise ValueError(
            f"s must have shape ({xs.shape[0]},) (one factor per snapshot), got {s.shape}"
        )
    check_finite("s", s)
    check_receivers(receivers, model)
    return _simulate(key, model, xs, receivers, s)


@jax.jit
def _simulate(key, model, xs, receivers, s):
    mean = jax.vmap(lambda x, sn: expected_snapshot(model, x, receivers, sn))(xs, s)
    std = jnp.sqrt(model.scene.noise_power / 2.0)
    w = std * jax.random.normal(key, (2,) + mean.shape, xs.dtype)
    return mean + (w[0] + 1j * w[1])


def check_receivers(receivers: Any, model: PhaseModel) -> None:
    """``ValueError`` unless ``receivers`` is a :class:`Receivers` for ``model``'s M APs."""
    if not isinstance(receivers, Receivers):
        raise ValueError(f"receivers must be a Receivers, got {type(receivers).__name__}")
    if receivers.num_aps != model.num_aps:
        raise ValueError(
            f"receivers are for {receivers.num_aps} APs, the model has {model.num_aps}"
        )


def profiled_residuals(
    h: ArrayLike, v: ArrayLike, b: ArrayLike, noise_var: ArrayLike | None = None
) -> tuple[Array, Array]:
    r"""Residuals :math:`\mathbf h - \mathbf b - \hat s\mathbf v` (..., M) with the snapshot
    factor profiled out, :math:`\hat s = \mathbf v^H(\mathbf h - \mathbf b)/\|\mathbf v\|^2`
    (...,): the complex least-squares analogue of eq. (15)-(16). With ``noise_var``
    (broadcastable to ``h``: each receiver's, or each snapshot's and receiver's, variance
    :math:`\sigma_m^2`) the weighted one, :math:`\hat s = \mathbf v^H\Sigma^{-1}(\mathbf h
    - \mathbf b)/\mathbf v^H\Sigma^{-1}\mathbf v`: the maximum-likelihood factor under
    unequal variances, whose profiled residuals whitened by :math:`\sigma_m` are those of
    :func:`whiten`'s pair. The residuals are returned unwhitened. Traceable.

    Raises:
        ValueError: (concrete input) ``h`` and ``v`` of different shapes or a ``b`` that does
            not broadcast to them, a ``noise_var`` that is complex, not finite, not positive
            or does not broadcast to ``h``.
    """
    h, v = jnp.asarray(h), jnp.asarray(v)
    if h.shape != v.shape:
        raise ValueError(f"h and v must have the same shape (..., M), got {h.shape} and {v.shape}")
    try:
        b_shape = np.broadcast_shapes(np.shape(b), h.shape)
    except ValueError:
        b_shape = None
    if b_shape != h.shape:
        raise ValueError(f"b must broadcast to h's shape {h.shape}, got {np.shape(b)}")
    if noise_var is not None:
        check_noise_variances("noise_var", noise_var, h.shape)
    y = h - jnp.broadcast_to(jnp.asarray(b), h.shape)
    w = 1.0 if noise_var is None else 1.0 / jnp.asarray(noise_var)
    s = jnp.sum(w * jnp.conj(v) * y, axis=-1) / jnp.sum(w * jnp.abs(v) ** 2, axis=-1)
    return y - s[..., None] * v, s


def check_noise_variances(name: str, var: Any, shape: tuple[int, ...]) -> None:
    """``ValueError`` unless ``var`` is real, broadcasts to ``shape`` and (when concrete) is
    finite and positive: a variance of 0 would divide by zero, a complex one lose its
    imaginary part."""
    if jnp.iscomplexobj(jnp.asarray(var)):
        raise ValueError(f"{name} must be real variances, got complex values")
    try:
        broadcast = np.broadcast_shapes(np.shape(var), shape)
    except ValueError:
        broadcast = None
    if broadcast != tuple(shape):
        raise ValueError(f"{name} must broadcast to {tuple(shape)}, got shape {np.shape(var)}")
    check_finite(name, var)
    if is_concrete(var) and np.any(np.asarray(var) <= 0):
        raise ValueError(f"{name} must be positive, got min {float(np.min(np.asarray(var)))!r}")


def whiten(model: ReceiverModel, h: ArrayLike, noise_var: ArrayLike) -> tuple[ReceiverModel, Array]:
    r"""The model and snapshots ``h`` (..., M) scaled by :math:`1/\sigma_m` per receiver, for
    receivers whose noise (or misfit) variances :math:`\sigma_m^2` differ.

    The complex least-squares score of the whitened pair is the weighted one,
    :math:`|\mathbf v^H\Sigma^{-1}(\mathbf h - \mathbf b)|^2/(\mathbf v^H\Sigma^{-1}
    \mathbf v)` with :math:`\Sigma = \mathrm{diag}(\sigma_m^2)`, and its profiled residuals
    are the whitened ones: every search and refinement of the module's model
    (:func:`~dmimo_jax.estimators.complex_search`, the coherent search of
    :math:`\mathbf h - \mathbf b`) becomes the maximum-likelihood one under unequal
    variances. Gains and constants are scaled, the channel's geometry is not: positions mean
    what they meant. Equal variances change no position.

    Args:
        model: a :class:`ReceiverModel`.
        h: (..., M) complex snapshots.
        noise_var: (M,) positive variances :math:`\sigma_m^2` (any common scale).

    Returns:
        ``(whitened model, whitened snapshots)``.

    Raises:
        ValueError: ``model`` not a ReceiverModel, ``h`` not complex (..., M), ``noise_var``
            not (M,) finite and positive.
    """
    if not isinstance(model, ReceiverModel):
        raise ValueError(f"model must be a ReceiverModel, got {type(model).__name__}")
    m = model.num_aps
    h = jnp.asarray(h)
    if h.ndim < 1 or h.shape[-1] != m or not jnp.iscomplexobj(h):
        raise ValueError(
            f"h must be complex snapshots of shape (..., {m}), got {h.dtype} {h.shape}"
        )
    if np.shape(noise_var) != (m,):
        raise ValueError(
            f"noise_var must have shape ({m},) (one per receiver), got {np.shape(noise_var)}"
        )
    check_noise_variances("noise_var", noise_var, (m,))
    var = jnp.asarray(noise_var, model.scene.ap_positions.dtype)
    scale = 1.0 / jnp.sqrt(var)
    rx = model.receivers
    whitened = ReceiverModel(model.model, Receivers(rx.gains * scale, rx.constants * scale))
    return whitened, h * jnp.broadcast_to(scale, h.shape)
