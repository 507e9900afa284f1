"""The static settings of a :class:`~dmimo_jax.pipeline.Locator` and their checks."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from dmimo_jax._checks import check_int, check_probability, check_scalar
from dmimo_jax.bounds import noise_fit_probability
from dmimo_jax.pipeline.online import ScreenSettings, check_screen_settings
from dmimo_jax.pipeline.rescues import DEFAULT_RESCUES, Rescue
from dmimo_jax.pipeline.stages import CellStage

if TYPE_CHECKING:
    from dmimo_jax.pipeline.locator import Locator


def exclusions_allowed(noise_fit: tuple, fit_risk: float) -> int | None:
    """The largest k whose :func:`~dmimo_jax.bounds.noise_fit_probability` (``noise_fit``,
    k = 0 .. M - 4) summed over 0 .. k is within ``fit_risk``, at most M - 5 (one redundant
    AP); -1 where even k = 0 is not; None for an empty ``noise_fit`` (no cost gate)."""
    if not noise_fit:
        return None
    within = int(np.sum(np.cumsum(noise_fit) <= fit_risk))
    return min(within - 1, len(noise_fit) - 2)


class LocatorSettings(NamedTuple):
    """The static settings of a :class:`Locator` (checked at construction; see there)."""

    kind: str
    num_cells: int
    first_cells: int
    first_mass: float
    min_mass: float
    num_starts: int
    screen_steps: int
    fine_steps: int
    fine: str
    cost_gate: float | None
    capacity: float
    recheck_fraction: float
    max_excluded: int
    rescues: tuple = DEFAULT_RESCUES
    """The cost gate's rescues, in order (pipeline.rescues)."""
    fit_risk: float = 1e-3
    noise_fit: tuple = ()
    """Derived: bounds.noise_fit_probability for k = 0 .. M - 4 APs out."""

    @property
    def most_excluded(self) -> int | None:
        """The most APs an answer may leave out at ``fit_risk`` (:func:`exclusions_allowed`
        of ``noise_fit``); None without a cost gate (no bound)."""
        return exclusions_allowed(self.noise_fit, self.fit_risk)

    @property
    def screen(self) -> ScreenSettings:
        """The candidate screen's settings."""
        return ScreenSettings(
            self.first_cells, self.first_mass, self.min_mass, self.num_starts, self.screen_steps
        )


def checked_settings(loc: Locator, s: dict) -> LocatorSettings:
    """The settings ``s`` (a dict of :class:`LocatorSettings`' fields) with their defaults
    filled in, checked against the Locator's stage and models (``ValueError``)."""
    if s["fine"] not in ("screen", "model"):
        raise ValueError(f"fine must be 'screen' or 'model', got {s['fine']!r}")
    if s["cost_gate"] is not None:
        check_scalar("cost_gate", s["cost_gate"], positive=True)
    for name in ("capacity", "recheck_fraction"):
        check_scalar(name, s[name])
        if not 0 <= s[name] <= 1:
            raise ValueError(f"{name} must be a fraction of the batch in [0, 1], got {s[name]}")
    for name, default in loc.stage.defaults.items():
        if s[name] is None:
            s[name] = default
        check_int(name, s[name], minimum=1)
    check_int("num_cells", s["num_cells"], minimum=1)
    rescues = s["rescues"]
    if not isinstance(rescues, tuple) or not all(isinstance(x, Rescue) for x in rescues):
        raise ValueError(
            f"rescues must be a tuple of pipeline.rescues.Rescue objects, got {rescues!r}"
        )
    # a rescue given twice runs twice on the rows it left pending: the same work again (a
    # rescue is a pure function of the rows), the same answers, one more branch compiled
    repeated = [x for i, x in enumerate(rescues) if x in rescues[:i]]
    if repeated:
        raise ValueError(f"rescues must not repeat a rescue, got {repeated[0]!r} twice")
    _check_exclusions(loc, s)
    if isinstance(loc.stage, CellStage):
        own = loc.stage.cells.num_cells
        if s["num_cells"] > own:
            raise ValueError(f"num_cells={s['num_cells']} exceeds the classifier's {own} cells")
        checked = check_screen_settings(
            loc.screen_model,
            loc.stage.cell_table(loc),
            s["num_cells"],
            first_cells=s["first_cells"],
            first_mass=s["first_mass"],
            min_mass=s["min_mass"],
            num_starts=s["num_starts"],
            screen_steps=s["screen_steps"],
        )
        s["first_cells"] = checked.first_cells
    else:
        s["first_cells"] = s["first_cells"] or 1
        if not loc.stage.whole:
            count = loc.stage.offsets.shape[0]
            check_int("num_starts", s["num_starts"], minimum=1, maximum=count)
    return LocatorSettings(**s)


def _check_exclusions(loc: Locator, s: dict) -> None:
    """Fill in ``noise_fit`` (the cost gate's noise-fit bound, recomputed when the gate
    changes) and ``max_excluded`` (default: 3 or the most ``fit_risk`` allows), and
    refuse a ``max_excluded`` the bound does not allow (``max_excluded``'s doc)."""
    check_probability("fit_risk", s["fit_risk"])
    m = loc.num_aps
    if s["cost_gate"] is None:
        s["noise_fit"] = ()
    elif not s.get("noise_fit"):
        low, high = np.asarray(loc.region_low), np.asarray(loc.region_high)
        p = noise_fit_probability(loc.fine_model, low, high, float(s["cost_gate"]))
        s["noise_fit"] = tuple(float(v) for v in p)
    bound = exclusions_allowed(s["noise_fit"], s["fit_risk"])
    allowed = max(m - 5 if bound is None else bound, 0)
    if s["max_excluded"] is None:
        s["max_excluded"] = min(3, allowed)
        return
    check_int("max_excluded", s["max_excluded"], maximum=max(m - 5, 0))
    if s["max_excluded"] > allowed:
        bound = sum(s["noise_fit"][: s["max_excluded"] + 1])
        raise ValueError(
            f"max_excluded={s['max_excluded']} lets noise pass: with that many of the "
            f"{m} APs left out, phases with no relation to the model pass the cost gate "
            f"with a chance of up to {min(bound, 1.0):.3g} "
            f"(bounds.noise_fit_probability), above fit_risk={s['fit_risk']}; this "
            f"deployment allows at most {allowed} (raise fit_risk to allow more)"
        )
