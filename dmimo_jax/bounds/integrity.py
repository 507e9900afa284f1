r"""Bounds with APs left out and integrity: the PEB of a subset of the APs
(:func:`subset_peb`, the others at infinite variance), the protection level of an answer
(:func:`protection_level`) and the chance that noise alone fits the phases with k APs left
out (:func:`noise_fit_probability`)."""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import (
    check_num_aps,
    check_positions,
    check_probability,
    check_scalar,
    is_concrete,
)
from dmimo_jax.bounds.information import (
    check_position,
    fim_from_jacobian,
    information_floor,
    linearize,
    peb_from_fim,
)
from dmimo_jax.physics import (
    PhaseModel,
    as_phase_model,
)
from dmimo_jax.scene import Scene


def subset_peb(x: ArrayLike, model: PhaseModel | Scene, excluded: ArrayLike) -> Array:
    r"""The PEB of the APs that are left: eq. (14) with the APs of the (M,) bool mask
    ``excluded`` at infinite variance (their rows and columns of the EFIM, eq. 13b, are
    zero: the bound of a deployment without them; the CPO is still estimated from the
    rest). ``inf`` when fewer than four APs are left or the rest cannot see a direction.

    Raises:
        ValueError: as :func:`peb`, and ``excluded`` not an (M,) bool mask.
    """
    model, mask = _checked_subset(x, model, excluded)
    return subset_peb_unchecked(jnp.asarray(x), model, mask)


def _checked_subset(x: ArrayLike, model: PhaseModel | Scene, excluded: ArrayLike):
    """``(model, excluded)`` as a PhaseModel and an array, checked (``ValueError``): the
    checks of :func:`peb` and ``excluded`` an (M,) bool mask."""
    model = as_phase_model(model)
    check_num_aps(model.num_aps)
    check_position(x, model)
    mask = np.asarray(excluded) if is_concrete(excluded) else excluded
    if excluded is None or np.shape(mask) != (model.num_aps,) or mask.dtype != bool:
        got = "None" if excluded is None else f"{mask.dtype} {np.shape(mask)}"
        raise ValueError(
            f"excluded must be a bool mask of shape ({model.num_aps},) (all False: no AP "
            f"left out), got {got}"
        )
    return model, jnp.asarray(mask)


def subset_fim_unchecked(x: Array, model: PhaseModel, excluded: Array) -> Array:
    r"""The (3, 3) position FIM (eq. 14's :math:`\mathbf H^\top\mathbf J_e\mathbf H`) of the
    APs not ``excluded`` (M,) bool (theirs at infinite variance: eq. 13b without their rows
    and columns). Traced, unchecked; one position (batch with ``jax.vmap``)."""
    _, h, variance = linearize(x, model)
    return fim_from_jacobian(h, jnp.where(excluded, 0.0, 1.0 / jnp.where(excluded, 1.0, variance)))


def move_statistic_unchecked(x: Array, y: Array, model: PhaseModel, excluded: Array) -> Array:
    r"""The move from ``x`` to ``y`` (3,) in the information of the APs not ``excluded`` at
    ``x``: :math:`(y - x)^\top \mathbf F(x)\,(y - x)`, ``F`` the subset FIM
    (:func:`subset_fim_unchecked`, eq. 14). Two efficient estimates of one position, ``x``
    from the APs not excluded and ``y`` from more, differ by about
    :math:`\mathcal N(0, \mathbf F^{-1} - \mathbf F_y^{-1})`, so the statistic is at most
    chi-square with 3 degrees of freedom (:func:`position_chi2_quantile`); a larger one
    says the added APs pulled ``y`` away. Traced, unchecked; one position."""
    d = y - x
    return d @ subset_fim_unchecked(x, model, excluded) @ d


def position_chi2_quantile(risk: float) -> float:
    r"""The ``1 - risk`` quantile of chi-square with 3 degrees of freedom (a position's
    squared Mahalanobis distance): the ``q`` whose tail
    :math:`\operatorname{erfc}(\sqrt{q/2}) + \sqrt{2q/\pi}\,e^{-q/2}` is ``risk``, by
    bisection (host float).

    Raises:
        ValueError: ``risk`` not in (0, 1).
    """
    check_probability("risk", risk)
    tail = lambda q: math.erfc(math.sqrt(q / 2)) + math.sqrt(2 * q / math.pi) * math.exp(-q / 2)
    low, high = 0.0, 1.0
    while tail(high) > risk:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if tail(mid) > risk else (low, mid)
    return high


@jax.jit
def subset_peb_unchecked(x: Array, model: PhaseModel, excluded: Array) -> Array:
    """:func:`subset_peb`'s traced core (one position; batch with ``jax.vmap``)."""
    bound = peb_from_fim(subset_fim_unchecked(x, model, excluded))
    return jnp.where(jnp.sum(~excluded) >= 4, bound, jnp.inf)


def protection_level(
    x: ArrayLike,
    model: PhaseModel | Scene,
    excluded: ArrayLike,
    risk: float = 1e-3,
    cost: ArrayLike | None = None,
) -> Array:
    r"""An error bound at integrity risk ``risk`` for an answer ``x`` located with the APs
    not ``excluded`` (beyond the paper; GNSS integrity monitoring's protection level made
    for carrier phases), m:

    .. math::
        \mathrm{PL} = s\,\sqrt{\lambda_{\max}(\mathbf J_S^{-1})\,
        F^{-1}_{\chi^2_3}(1 - \alpha)},\qquad
        s = \max\Bigl(1, \sqrt{c / (M - k - 4)}\Bigr)

    with :math:`\mathbf J_S` the position FIM of the APs left (:func:`subset_fim_unchecked`,
    the bound of :func:`subset_peb`). An efficient estimate on the right lobe has
    :math:`\mathbf e\sim\mathcal N(0, \mathbf J_S^{-1})`, so
    :math:`\|\mathbf e\|^2 \le \lambda_{\max}\,\mathbf e^\top\mathbf J_S\mathbf e` with the
    latter :math:`\chi^2_3`: :math:`P(\|\mathbf e\| > \mathrm{PL}) \le \alpha`. The factor
    :math:`s` is weighted least squares' a-posteriori variance factor from the answer's ML
    cost ``cost`` (eq. 17; omitted: 1): where the model misfits (a learned mean phase's
    error) the residuals show it and the bound widens with them. What it cannot cover is an
    answer on the wrong lobe: that is the cost gate's risk (measured in
    ``benchmarks/fault_tolerance.py``, where the bound itself is checked). ``inf`` when fewer
    than four APs are left or a direction is unobservable.

    Args:
        x: (3,) the answer, m.
        model: the model it was located under (a Scene or any PhaseModel).
        excluded: (M,) bool, the APs left out (:attr:`LocatorResult.excluded` of the row).
        risk: the integrity risk :math:`\alpha`, in (0, 1).
        cost: () the answer's ML cost over the APs left, or None.

    Raises:
        ValueError: as :func:`subset_peb`, ``risk`` outside (0, 1), ``cost`` negative or
            not finite.
    """
    check_probability("risk", risk)
    if cost is not None:
        check_scalar("cost", cost)
        if is_concrete(cost) and not np.asarray(cost) >= 0:
            raise ValueError(f"cost must be >= 0, got {np.asarray(cost).item()!r}")
    model, mask = _checked_subset(x, model, excluded)
    return protection_level_unchecked(jnp.asarray(x), model, mask, float(risk), cost)


@partial(jax.jit, static_argnames="risk")
def protection_level_unchecked(
    x: Array, model: PhaseModel, excluded: Array, risk: float, cost: Array | None = None
) -> Array:
    """:func:`protection_level`'s traced core (one answer; batch with ``jax.vmap``);
    ``risk`` static."""
    import scipy.stats

    fim = subset_fim_unchecked(x, model, excluded)
    lowest = jnp.linalg.eigvalsh(fim)[0]
    dof = jnp.sum(~excluded) - 4
    scale = 1.0 if cost is None else jnp.sqrt(jnp.maximum(1.0, cost / jnp.maximum(dof, 1)))
    level = scale * jnp.sqrt(scipy.stats.chi2.isf(risk, 3) / lowest)
    return jnp.where((dof >= 0) & (lowest > information_floor(fim)), level, jnp.inf)


def noise_fit_probability(
    model: PhaseModel | Scene,
    low: ArrayLike,
    high: ArrayLike,
    gate: float,
    *,
    num_points: int = 6,
) -> np.ndarray:
    r"""An upper bound on the chance that phases with no relation to the model (uniform
    noise on every AP: a dead deployment, a jammer, a wrong frequency plan) pass the cost
    gate at some position of the region with k APs left out, for k = 0 .. M - 4: (M - 3,)
    float64 in [0, 1] (beyond the paper: the look-elsewhere effect of a search over
    positions, lobes and subsets of APs).

    With the APs :math:`S` kept (:math:`|S| = M - k`), the phase vectors that pass the gate
    :math:`g\,d`, :math:`d = \max(M - k - 4, 1)`, are those within Mahalanobis distance
    :math:`\rho = \sqrt{g d}` of the 4-dimensional manifold
    :math:`\{\boldsymbol\mu_S(\mathbf x) + \phi\}` (the cost of eq. 17 is the squared
    distance). By Weyl's tube formula their share of the torus is

    .. math::
        P_S \approx 2\pi\!\int_R\!\sqrt{\det\mathbf J_S(\mathbf x)\textstyle\sum_{m\in S}
        \sigma_m^{-2}}\;\prod_{m\in S}\sigma_m\,d\mathbf x\;
        \frac{V_d(\rho)}{(2\pi)^{M-k}},\qquad
        V_d(\rho) = \frac{\pi^{d/2}\rho^d}{\Gamma(d/2 + 1)}

    (the square root is the volume element of (position, CPO): the full FIM's determinant,
    :math:`\mathbf J_S` of eq. 14 times the CPO's information). The union over the
    :math:`\binom{M}{k}` subsets bounds the chance of any: :math:`P_k \le \binom{M}{k}
    \max_S P_S`, and ``max_S`` is bounded with every AP's information
    (:math:`\det\mathbf J_S \le \det\mathbf J`) and the :math:`M - k` largest
    :math:`\sigma_m` at each position. The integral over the box ``low`` .. ``high`` is
    the mean over ``num_points`` cubed cell centres times its volume. With 17 APs at
    -10 dBm it is about 1 with one redundant AP left: any five phases fit somewhere
    (tested in ``tests/test_rescues.py``).

    Args:
        model: the model the gate's cost is under (a Scene or any PhaseModel).
        low: (3,) the region's lower corner, m.
        high: (3,) its upper corner, m.
        gate: the cost gate :math:`g` per degree of freedom (``Locator``'s ``cost_gate``).
        num_points: grid points per axis of the integral.

    Raises:
        ValueError: fewer than 4 APs, a bad region, ``gate`` not positive.
    """
    model = as_phase_model(model)
    check_num_aps(model.num_aps)
    check_scalar("gate", gate, positive=True)
    check_positions("low", low, batched=False)
    check_positions("high", high, batched=False)
    lo, hi = np.asarray(low, np.float64), np.asarray(high, np.float64)
    if not np.all(hi > lo):
        raise ValueError(f"high must exceed low on every axis, got low={lo}, high={hi}")
    if int(num_points) != num_points or num_points < 1:
        raise ValueError(f"num_points must be a positive int, got {num_points!r}")
    t = (np.arange(num_points) + 0.5) / num_points
    grid = np.stack(np.meshgrid(t, t, t, indexing="ij"), -1).reshape(-1, 3)
    xs = jnp.asarray(lo + grid * (hi - lo))
    m = model.num_aps
    # (P, M - 3) log of the integrand's position-dependent part, for k = 0 .. M - 4
    log_term = np.asarray(_log_tube_integrand(xs, model), np.float64)
    top = np.max(log_term, axis=0)
    log_mean = top + np.log(np.mean(np.exp(log_term - top), axis=0))
    k = np.arange(m - 3)
    d = np.maximum(m - k - 4, 1)
    log_ball = 0.5 * d * np.log(np.pi) + 0.5 * d * np.log(gate * d)
    log_ball -= np.array([math.lgamma(v / 2 + 1) for v in d])
    log_choose = np.array(
        [math.lgamma(m + 1) - math.lgamma(i + 1) - math.lgamma(m - i + 1) for i in k]
    )
    log_volume = np.sum(np.log(hi - lo))
    log_p = log_choose + np.log(2 * np.pi) + log_volume + log_mean + log_ball
    log_p -= (m - k) * np.log(2 * np.pi)
    return np.minimum(np.exp(np.minimum(log_p, 0.0)), 1.0)


@jax.jit
def _log_tube_integrand(xs: Array, model: PhaseModel) -> Array:
    """(P, M - 3): for k = 0 .. M - 4, log of sqrt(det J(x) sum_m w_m) times the product of
    the M - k largest sigma_m at each position x of ``xs`` (P, 3)."""

    def one(x: Array) -> Array:
        _, h, variance = linearize(x, model)
        fim = fim_from_jacobian(h, 1.0 / variance)
        logdet = jnp.linalg.slogdet(fim)[1] + jnp.log(jnp.sum(1.0 / variance))
        # a phase is never wider than the circle (an AP that hears nothing: inf variance)
        log_sigma = jnp.sort(jnp.minimum(0.5 * jnp.log(variance), jnp.log(jnp.pi)))[::-1]
        kept = jnp.cumsum(log_sigma)[::-1][: variance.shape[0] - 3]  # M - k largest, k = 0..
        return 0.5 * logdet + kept

    return jax.vmap(one)(xs)
