"""Training presets: a POPT network, a loop configuration and a synthetic-set size that go
together (Sec. VI-A for ``paper``; ``cpu`` for this project's 2-core machines)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from dmimo_jax.learning.cells import CellConfig
from dmimo_jax.learning.popt import POPTConfig
from dmimo_jax.learning.train import TrainConfig


@dataclasses.dataclass(frozen=True)
class CellsPreset:
    """The cell classifier's network, loop and synthetic-set size (beyond the paper)."""

    network: CellConfig
    train: TrainConfig
    num_samples: int
    cell_size: float = 1.0


@dataclasses.dataclass(frozen=True)
class Preset:
    """A network, a loop configuration and a synthetic-set size that go together."""

    name: str
    popt: POPTConfig
    train: TrainConfig
    num_samples: int
    cells: CellsPreset


CELLS_CPU = CellsPreset(
    CellConfig(),
    TrainConfig(epochs=3, batch_size=1024, peak_lr=1e-3, pct_start=0.05, val_fraction=0.01),
    1_000_000,
)
CELLS_QUICK = CellsPreset(  # why 3 x 512: docs/learning_measurements.md, the classifier's size
    CellConfig(hidden=(512, 512, 512)),
    TrainConfig(epochs=3, batch_size=1024, peak_lr=1e-3, pct_start=0.05, val_fraction=0.01),
    600_000,
)
CELLS_GPU = CellsPreset(
    CellConfig(),
    TrainConfig(epochs=10, batch_size=1024, peak_lr=1e-3, pct_start=0.05, val_fraction=0.01),
    4_000_000,
)

PRESETS = MappingProxyType(
    {
        # the paper: N_AI = 1.125e6 (1e6 train + 0.125e6 validation), 120 epochs; for a GPU
        "paper": Preset("paper", POPTConfig.paper(), TrainConfig(epochs=120), 1_125_000, CELLS_GPU),
        # this 2-core CPU: see docs/learning_measurements.md for the accuracy it reaches and its time
        "cpu": Preset(
            "cpu", POPTConfig.cpu(), TrainConfig(epochs=15, batch_size=100), 60_000, CELLS_CPU
        ),
        # the quickstart (<= 2 min from an empty cache): the cpu preset's POPT, a smaller
        # cell classifier (3 x 512, 600,000 samples x 3 epochs; docs/learning_measurements.md)
        "quick": Preset(
            "quick", POPTConfig.cpu(), TrainConfig(epochs=15, batch_size=100), 60_000, CELLS_QUICK
        ),
    }
)
"""Name -> :class:`Preset` (read-only): ``"paper"`` (the paper's POPT and training, for a
GPU), ``"cpu"`` (a 2-core CPU), ``"quick"`` (the quickstart's, a smaller cell classifier)."""


def get_preset(preset: str | Preset) -> Preset:
    """The preset named ``preset`` in :data:`PRESETS`, or ``preset`` itself if it is a
    :class:`Preset` of your own (``ValueError`` naming the known ones otherwise)."""
    if isinstance(preset, Preset):
        return preset
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)} or a Preset, got {preset!r}")
    return PRESETS[preset]
