"""Healing (beyond the paper): a fault that persists is repaired, not only left out, by
:func:`heal` (``Locator.heal``): an offset jump is estimated in closed form and corrected
before the program; an AP with no one offset is reported dead."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_int, check_scalar
from dmimo_jax.phase import wrap

if TYPE_CHECKING:
    from dmimo_jax.pipeline.locator import Locator, LocatorResult


class HealReport(NamedTuple):
    """What :meth:`Locator.heal` found, per AP (M,)."""

    offsets: Array
    """The phase change estimated and corrected, rad (0 where not healed)."""
    stderr: Array
    """Its circular standard error, rad (inf where not healed)."""
    healed: Array
    """Bool: a persistent offset jump, now corrected (the AP rejoins)."""
    dead: Array
    """Bool: persistently excluded with no one offset (random, stale, blocked)."""
    count: Array
    """Int: the accepted snapshots that excluded it."""


def heal(
    loc: Locator,
    r: ArrayLike,
    out: LocatorResult,
    *,
    min_count: int = 10,
    min_coherence: float = 0.9,
) -> tuple[Locator, HealReport]:
    r"""Repair the faults that persist: for each AP excluded in at least ``min_count``
    of the located snapshots ``r`` (N, M) (their answers ``out``, accepted ones only),
    of the Locator ``loc``, its phase change in closed form, :math:`\hat\delta_m = \arg\sum_n
    e^{j(r_{nm} - \mu_m(\hat{\mathbf x}_n) - \hat\phi_n)}` (the CPO
    :math:`\hat\phi_n` estimated without it), with the circular standard error
    :math:`\sqrt{-2\ln R_m / n_m}` (:math:`R_m` the mean resultant length). Where
    :math:`R_m \ge` ``min_coherence`` the fault is an offset jump: the returned Locator
    subtracts :math:`\hat\delta_m` from AP m's phases before its program (and the AP
    rejoins); elsewhere (random, stale or blocked phases: no one offset) the AP is
    reported ``dead`` and left to the exclusion.

    Returns:
        ``(locator, report)``: the Locator with its phase corrections updated, and a
        :class:`HealReport`.

    Raises:
        ValueError: ``r`` not (N, M) or ``out`` not a LocatorResult of N rows, bad
            ``min_count`` or ``min_coherence``.
    """
    rb = loc._snapshots(r)
    excluded = getattr(out, "excluded", None)
    if not hasattr(out, "rejected") or np.shape(excluded) != rb.shape:
        raise ValueError(
            f"out must be this Locator's LocatorResult for the {rb.shape[0]} snapshots r"
        )
    check_int("min_count", min_count, minimum=1)
    check_scalar("min_coherence", min_coherence)
    if not 0 < min_coherence <= 1:
        raise ValueError(f"min_coherence must be in (0, 1], got {min_coherence!r}")
    rc = loc.corrected(rb)
    use = jnp.asarray(out.excluded) & ~jnp.asarray(out.rejected)[:, None]
    mean = jax.vmap(loc.fine_model.mean)(jnp.asarray(out.x, rb.dtype))
    z = jnp.where(use, jnp.exp(1j * (rc - mean - jnp.asarray(out.cpo)[:, None])), 0.0)
    count = jnp.sum(use, axis=0)
    resultant = jnp.abs(jnp.sum(z, axis=0)) / jnp.maximum(count, 1)
    delta = jnp.angle(jnp.sum(z, axis=0))
    stderr = jnp.sqrt(-2.0 * jnp.log(jnp.clip(resultant, 1e-300, 1.0)) / jnp.maximum(count, 1))
    often = count >= min_count
    healed = often & (resultant >= min_coherence)
    dead = often & ~healed
    c = loc.phase_corrections.astype(rb.dtype)
    corrections = jnp.where(healed, wrap(c + delta), c)
    new = loc._with(phase_corrections=corrections)
    report = HealReport(
        jnp.where(healed, delta, 0.0), jnp.where(healed, stderr, jnp.inf), healed, dead, count
    )
    return new, report
