"""Learning-based positioning: synthetic datasets (Sec. III-C), POPT and its benchmarks (Sec. IV)."""

from dmimo_jax.learning.data import SyntheticBatch, load_dataset, synthesize, write_dataset

__all__ = ["SyntheticBatch", "load_dataset", "synthesize", "write_dataset"]
