"""Position estimators: the model-based MLE (Sec. II-D), its grid searches, the safeguard
window, the one Levenberg-Marquardt solver and the HI geometry (Sec. IV-B).

* :mod:`~dmimo_jax.estimators.mle`: CPO compression, ML/LS costs, refinement;
* :mod:`~dmimo_jax.estimators.lm`: the Levenberg-Marquardt solver (MLE and HI);
* :mod:`~dmimo_jax.estimators.phasors`: phasor rows, the coherence screen, cube offsets;
* :mod:`~dmimo_jax.estimators.grid`: grids, their sharding over devices, the phasor table;
* :mod:`~dmimo_jax.estimators.search`: EGS (eq. 18) and ``coarse_to_fine``;
* :mod:`~dmimo_jax.estimators.window`: the online safeguard ``window_search``, and
  ``recheck_costly``, the cost gate's dense local search;
* :mod:`~dmimo_jax.estimators.exact`: the exact MLE (EGS + refinement + the gate's recheck)
  as one program, ``exact_mle``;
* :mod:`~dmimo_jax.estimators.rows`: the rare rows of a batch on a fixed capacity inside
  one program, ``on_rows``;
* :mod:`~dmimo_jax.estimators.hyperbola`: hyperboloid residuals and their intersection;
* :mod:`~dmimo_jax.estimators.coherent`: the coherent search with expected phasors and
  measured amplitudes, and k-NN fingerprinting (for measured data, beyond the paper).
"""

from dmimo_jax.estimators import hyperbola
from dmimo_jax.estimators.candidates import (
    CandidateResult,
    CellGrid,
    CellTable,
    candidate_search,
    cell_grid,
    cell_table,
)
from dmimo_jax.estimators.coherent import (
    CoherentResult,
    CoherentTable,
    coherent_peaks,
    coherent_refine,
    coherent_search,
    coherent_table,
    complex_search,
    expected_phasor,
    knn_locate,
)
from dmimo_jax.estimators.exact import MLEResult, exact_mle
from dmimo_jax.estimators.faults import ExclusionResult, exclude_faults, trimmed_coherence
from dmimo_jax.estimators.grid import (
    Grid,
    PhasorTable,
    check_table_of,
    grid_points,
    phasor_table,
    search_grid,
)
from dmimo_jax.estimators.lm import LMResult, levenberg_marquardt
from dmimo_jax.estimators.mle import (
    MultiStartResult,
    RefineResult,
)
from dmimo_jax.estimators.rows import capacity_for, chunk_for, on_rows
from dmimo_jax.estimators.search import CoarseToFineResult, EgsResult
from dmimo_jax.estimators.window import recheck_costly, window_covers_table

# isort: split
# At the top of the package (their home is `dmimo_jax`, e.g. `dj.make_grid`): kept here so the
# older paths keep working; they are not in this module's __all__.
from dmimo_jax.estimators.grid import make_grid  # noqa: F401
from dmimo_jax.estimators.mle import refine, refine_batch, refine_multistart  # noqa: F401
from dmimo_jax.estimators.search import coarse_to_fine, egs  # noqa: F401
from dmimo_jax.estimators.window import window_search  # noqa: F401

__all__ = [
    "CandidateResult",
    "CoherentResult",
    "CoherentTable",
    "coherent_peaks",
    "coherent_refine",
    "coherent_search",
    "complex_search",
    "coherent_table",
    "expected_phasor",
    "knn_locate",
    "CellGrid",
    "CellTable",
    "candidate_search",
    "cell_grid",
    "cell_table",
    "CoarseToFineResult",
    "EgsResult",
    "Grid",
    "LMResult",
    "MultiStartResult",
    "PhasorTable",
    "RefineResult",
    "grid_points",
    "hyperbola",
    "levenberg_marquardt",
    "phasor_table",
    "search_grid",
    "recheck_costly",
    "window_covers_table",
    "MLEResult",
    "exact_mle",
    "capacity_for",
    "chunk_for",
    "on_rows",
    "ExclusionResult",
    "exclude_faults",
    "trimmed_coherence",
    "check_table_of",
]
