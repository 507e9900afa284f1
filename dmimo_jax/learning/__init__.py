"""Learning-based positioning (Sec. III-C, IV): synthetic datasets, POPT and its
benchmarks, one training loop, presets and model files.

* :mod:`~dmimo_jax.learning.data`: synthetic sets from any PhaseModel (resumable on disk);
* :mod:`~dmimo_jax.learning.nets`: shared pieces (standardizer, inputs, pure apply);
* :mod:`~dmimo_jax.learning.popt`: POPT; :mod:`~dmimo_jax.learning.mlp`: the MLP benchmark;
* :mod:`~dmimo_jax.learning.hi`: the HI benchmark (classifier + estimator);
* :mod:`~dmimo_jax.learning.train`: the loop (one network, or many of one graph at once:
  ``train_many``); :mod:`~dmimo_jax.learning.presets`;
  :mod:`~dmimo_jax.learning.io`: model files.
"""

from dmimo_jax.learning.cells import CellClassifier, CellConfig
from dmimo_jax.learning.data import SyntheticBatch, load_dataset, synthesize, write_dataset
from dmimo_jax.learning.hi import AmbiguityClassifier, HIEstimator
from dmimo_jax.learning.io import (
    ESTIMATORS,
    NETWORKS,
    build_model,
    check_saved_shapes,
    load_model,
    model_spec,
    save_model,
)
from dmimo_jax.learning.mlp import MLPConfig, MLPRegressor
from dmimo_jax.learning.popt import POPT, POPTConfig
from dmimo_jax.learning.presets import PRESETS, Preset, get_preset
from dmimo_jax.learning.train import TrainConfig, TrainResult, train, train_many

__all__ = [
    "ESTIMATORS",
    "NETWORKS",
    "POPT",
    "PRESETS",
    "AmbiguityClassifier",
    "CellClassifier",
    "CellConfig",
    "HIEstimator",
    "MLPConfig",
    "MLPRegressor",
    "POPTConfig",
    "Preset",
    "SyntheticBatch",
    "TrainConfig",
    "TrainResult",
    "build_model",
    "check_saved_shapes",
    "get_preset",
    "load_dataset",
    "load_model",
    "model_spec",
    "save_model",
    "synthesize",
    "train",
    "train_many",
    "write_dataset",
]
