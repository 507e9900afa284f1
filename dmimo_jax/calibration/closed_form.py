r"""The closed-form starts of a calibration: what needs no basin.

Uniformly random offsets or gain phases are no start for a local method, so the groups
:class:`~dmimo_jax.calibration.groups.Offsets`, :class:`~dmimo_jax.calibration.groups.ReceiverGains`
and :class:`~dmimo_jax.calibration.groups.ReceiverConstants` start from these:

* :func:`offsets_closed_form`: per-AP phase offsets from the circular means of the residuals,
* :func:`receivers_closed_form`: receivers' gains and constants by alternating least squares
  on complex snapshots.

Both take a model that :func:`check_calibratable` accepts: a physical model that knows its
surfaces, mounts and scene (:class:`~dmimo_jax.physics.CalibratableModel`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_finite, check_int, check_phases, check_positions
from dmimo_jax.phase import wrap
from dmimo_jax.physics import CalibratableModel
from dmimo_jax.pytree import jit_or_eager
from dmimo_jax.receivers import ReceiverModel, Receivers, channel, ideal_receivers


def check_calibratable(model: Any) -> None:
    """``ValueError`` unless ``model`` is a physical model calibration can fit (a
    :class:`~dmimo_jax.physics.CalibratableModel` that is not a
    :class:`~dmimo_jax.receivers.ReceiverModel`: the receivers are calibrate's own argument,
    and a ReceiverModel would carry them twice)."""
    if isinstance(model, ReceiverModel) or not isinstance(model, CalibratableModel):
        raise ValueError(
            "model must be a TwoRayModel, an ImageSourceModel, a MeshModel or another "
            "CalibratableModel (a physical model that knows its surfaces, mounts and scene: "
            f"dmimo_jax.physics.CalibratableModel), got {type(model).__name__}"
        )


def offsets_closed_form(
    model: Any, x: ArrayLike, r: ArrayLike, *, num_iterations: int = 10
) -> Array:
    r"""Per-AP phase offsets from the residuals of ``model`` at L labeled snapshots, (M,).

    Start: :math:`\delta_m = \delta^{\rm model}_m + \arg\sum_l e^{j(e_{lm}-e_{l0})}` with
    :math:`e_{lm} = \mathrm{wrap}(r_{lm} - \mu_m(\mathbf x_l))`: the circular mean of each
    AP's residual relative to AP 0's, which removes the snapshots' CPOs. Then
    ``num_iterations`` rounds of coordinate ascent of :math:`\sum_{lm}\cos(e_{lm} - \delta_m
    - \phi_l)`: each snapshot's CPO :math:`\phi_l` is the circular mean over the APs (eq. 15),
    each offset the circular mean over the snapshots; so AP 0's own residual no longer enters
    every offset (on measured data with ~1 rad model error that halves the offsets' error).
    AP 0 keeps its offset (the gauge). Valid whatever the offsets (no local basin), the start
    of :func:`~dmimo_jax.calibration.calibrating.calibrate`.

    Raises:
        ValueError: a model :func:`calibrate` does not take, x not (L, 3) with L >= 2, r not
            (L, M) or not finite, ``num_iterations`` not an int >= 0.
    """
    check_calibratable(model)
    check_int("num_iterations", num_iterations)
    check_positions("x", x, batched=True)
    num_l = np.shape(x)[0]
    if num_l < 2:
        raise ValueError(f"x must hold at least L = 2 labeled positions, got shape {np.shape(x)}")
    check_phases("r", r, model.num_aps, batched=True)
    if np.shape(r)[0] != num_l:
        raise ValueError(f"r must have shape ({num_l}, {model.num_aps}) (L, M), got {np.shape(r)}")
    dtype = model.scene.ap_positions.dtype
    return _offsets(num_iterations, model, jnp.asarray(x, dtype), jnp.asarray(r, dtype))


def _offsets_closed_form(num_iterations: int, model: Any, x: Array, r: Array) -> Array:
    mean = jax.vmap(model.mean)(x)
    e = wrap(r - mean)
    rel = jnp.angle(jnp.sum(jnp.exp(1j * (e - e[:, :1])), axis=0))
    for _ in range(num_iterations):
        cpo = jnp.angle(jnp.sum(jnp.exp(1j * (e - rel[None, :])), axis=1, keepdims=True))
        rel = jnp.angle(jnp.sum(jnp.exp(1j * (e - cpo)), axis=0))
        rel = wrap(rel - rel[0])
    return model.scene.ap_phase_offsets + rel


# one compiled program per model and shape (not an eager dispatch per operation)
_offsets = jit_or_eager(_offsets_closed_form, static_argnums=(0,))


def receivers_closed_form(
    model: Any,
    x: ArrayLike,
    h: ArrayLike,
    receivers: Receivers | None = None,
    *,
    gains: bool = True,
    constants: bool = True,
    num_iterations: int = 50,
) -> Receivers:
    r"""Receivers' gains and constants from complex labeled snapshots under ``model``'s
    geometry: :math:`h_{lm} = s_l G_m c_m(\mathbf x_l) + b_m` is linear in :math:`(G_m, b_m)`
    given the snapshot factors :math:`s_l` and in :math:`s_l` given them, so alternating least
    squares (``num_iterations`` rounds) from the gains' phases of the closed form of
    :func:`offsets_closed_form` applied to :math:`\arg h` (uniform random phases are no
    start for a local method). With ``gains`` or ``constants`` False, those keep
    ``receivers``' values (default ideal). Gauge: :math:`G_0` = 1 (the snapshot factors take
    the common complex scale). The start of
    :func:`~dmimo_jax.calibration.calibrating.calibrate` on complex snapshots (the groups
    :class:`~dmimo_jax.calibration.groups.ReceiverGains` and
    :class:`~dmimo_jax.calibration.groups.ReceiverConstants`).

    Raises:
        ValueError: a model :func:`calibrate` does not take, x not (L, 3) with L >= 2, h not
            (L, M) finite complex, ``gains`` and ``constants`` not bools or both False,
            ``num_iterations`` < 1.
    """
    check_calibratable(model)
    check_int("num_iterations", num_iterations, minimum=1)
    check_positions("x", x, batched=True)
    num_l = np.shape(x)[0]
    if num_l < 2 or np.shape(h) != (num_l, model.num_aps) or not np.iscomplexobj(h):
        raise ValueError(
            f"x must be (L, 3) with L >= 2 and h complex of shape (L, {model.num_aps}), got "
            f"{np.shape(x)} and {np.asarray(h).dtype} {np.shape(h)}"
        )
    check_finite("h", h)
    if not (isinstance(gains, bool) and isinstance(constants, bool) and (gains or constants)):
        raise ValueError(
            f"gains and constants must be bools, at least one True (what to fit), got "
            f"{gains!r} and {constants!r}"
        )
    rx = ideal_receivers(model.num_aps) if receivers is None else receivers
    dtype = model.scene.ap_positions.dtype
    g, b = _receivers_als(
        num_iterations,
        gains,
        constants,
        model,
        jnp.asarray(x, dtype),
        jnp.asarray(h),
        rx.gains,
        rx.constants,
    )
    return Receivers(g, b)


@partial(jax.jit, static_argnums=(0, 1, 2))
def _receivers_als(num_iterations, fit_g, fit_b, model, x, h, g0, b0):
    c = jax.vmap(partial(channel, model))(x)  # (L, M)
    num_l = h.shape[0]
    if fit_g:
        # phases: offsets_closed_form on arg h (relative to the model's own offsets), moduli:
        # the median ratio of |h| to |c|, so the first snapshot factors are right
        rel = _offsets_closed_form(10, model, x, jnp.angle(h)) - model.scene.ap_phase_offsets
        ratio = jnp.median(jnp.abs(h) / jnp.abs(c), axis=0)
        g0 = ratio / ratio[0] * jnp.exp(1j * rel)
        b0 = jnp.zeros_like(b0) if fit_b else b0

    def body(_, gb):
        g, b = gb
        v = g[None, :] * c
        s = jnp.sum(jnp.conj(v) * (h - b[None, :]), axis=1) / jnp.sum(jnp.abs(v) ** 2, axis=1)
        z = s[:, None] * c  # (L, M): h[:, m] = G_m z[:, m] + b_m
        a11 = jnp.sum(jnp.abs(z) ** 2, axis=0)
        a12 = jnp.sum(jnp.conj(z), axis=0)
        r1 = jnp.sum(jnp.conj(z) * h, axis=0)
        r2 = jnp.sum(h, axis=0)
        if fit_g and fit_b:
            det = a11 * num_l - a12 * jnp.conj(a12)
            g_new = (num_l * r1 - a12 * r2) / det
            b_new = (a11 * r2 - jnp.conj(a12) * r1) / det
        elif fit_g:
            g_new, b_new = (r1 - a12 * b) / a11, b
        else:
            g_new, b_new = g, (r2 - jnp.sum(z * g[None, :], axis=0)) / num_l
        return g_new, b_new

    g, b = jax.lax.fori_loop(0, num_iterations, body, (g0.astype(h.dtype), b0.astype(h.dtype)))
    if fit_g:
        g = g / g[0]
    return g, b
