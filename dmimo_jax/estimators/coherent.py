r"""Coherent grid search with expected phasors and measured amplitudes, and k-NN fingerprinting.

Beyond the paper, for measured data. The paper's EGS maximizes the CPO-compressed ML cost of
eq. (17) with the model's mean; when the model's error is not small against :math:`2\pi` the
matched filter of a wrapped-normal phase is its *expected* phasor
:math:`\mathbb E\,e^{j\theta_m} = e^{-\sigma_m^2/2}\,e^{j\mu_m}`, so an AP the model is unsure
of (large ``variance``) is weighted down smoothly, and a snapshot's measured amplitudes
:math:`a_m` weight the APs as eq. (9) does (phase noise variance :math:`\propto 1/a_m^2`):

.. math:: \hat{\mathbf x} = \arg\max_{\mathbf x} \Big|\sum_m a_m\, e^{j r_m}\,
          e^{-\sigma_m^2(\mathbf x)/2}\, e^{-j\mu_m(\mathbf x)}\Big|,

the modulus profiling the CPO out as eq. (15) does. With unit amplitudes and equal variances
it is the paper's EGS. :func:`coherent_peaks` lists the K most coherent local maxima of the
grid score instead of the best one (the lobes a snapshot leaves ambiguous) and
:func:`coherent_refine` runs the local stage from positions chosen among them.
:func:`knn_locate` is the model-free fingerprinting baseline: the labeled snapshots whose
phase differences are closest (the same CPO-free coherence).
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import check_int, check_phases, check_positions
from dmimo_jax.estimators.grid import Grid, grid_points
from dmimo_jax.estimators.lm import levenberg_marquardt
from dmimo_jax.estimators.phasors import squared_coherence
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.pytree import map_in_chunks, pytree_dataclass
from dmimo_jax.receivers import ReceiverModel, profiled_residuals


class CoherentResult(NamedTuple):
    """Positions (N, 3) and their normalized coherence score (N,) in [0, 1] (from
    :func:`coherent_peaks`: (N, K, 3) and (N, K))."""

    x: Array
    score: Array


def expected_phasor(model: PhaseModel, x: ArrayLike) -> Array:
    r"""The matched filter :math:`e^{-\sigma_m^2/2} e^{-j\mu_m(\mathbf x)}` (M,) complex;
    for a :class:`~dmimo_jax.receivers.ReceiverModel` its normalized conjugate channel
    :math:`\mathbf v^*/\|\mathbf v\|` (the complex least-squares score)."""
    if isinstance(model, ReceiverModel):
        return model.matched_filter(x)
    return jnp.exp(-0.5 * model.variance(x) - 1j * model.mean(x))


@pytree_dataclass
class CoherentTable:
    """The grid stage's matched filters, computed once (:func:`coherent_table`): the EGS
    phasor table (:class:`~dmimo_jax.estimators.PhasorTable`, Sec. II-D) for the expected
    phasors of any model.

    Attributes:
        grid: the grid the table covers.
        rows: (chunks, chunk_size, 2M) float32 ``[Re, Im]`` of :func:`expected_phasor` at the
            grid points in order, padded with zero rows to whole chunks.
    """

    grid: Grid
    rows: Array


CHUNK_SIZE = 4096  # grid points per matrix product of the grid stage (the default)


def coherent_table(model: PhaseModel, grid: Grid, *, chunk_size: int = CHUNK_SIZE) -> CoherentTable:
    """Tabulate the grid stage of :func:`coherent_search` once: for a model that is costly
    to evaluate (e.g. a residual field on many snapshots) and many calls on one grid. The
    table holds ``grid.size x 2M`` float32 numbers (20 MB for 60,000 points and 42 APs).

    Raises:
        ValueError: ``grid`` not a ``Grid``, bad ``chunk_size``.
    """
    model = as_phase_model(model)
    _check_grid(grid)
    check_int("chunk_size", chunk_size, minimum=1)
    return _tabulate(model, grid, min(chunk_size, grid.size))


@partial(jax.jit, static_argnames=("chunk_size",))
def _tabulate(model, grid: Grid, chunk_size: int) -> CoherentTable:
    def chunk(c):
        return _rows(model, grid, c * chunk_size + jnp.arange(chunk_size))

    num_chunks = -(-grid.size // chunk_size)
    return CoherentTable(grid, jax.lax.map(chunk, jnp.arange(num_chunks)))


def _rows(model, grid: Grid, idx: Array) -> Array:
    """(chunk, 2M) float32 [Re, Im] matched filters at grid indices ``idx`` (0 beyond)."""
    idx = idx.astype(jnp.int32)
    pts = grid_points(grid, jnp.minimum(idx, grid.size - 1))
    rows = jax.vmap(partial(expected_phasor, model))(pts)  # (chunk, M)
    rows = jnp.where((idx < grid.size)[:, None], rows, 0.0)
    return jnp.concatenate([rows.real, rows.imag], axis=1).astype(jnp.float32)


def _check_grid(grid) -> None:
    if not isinstance(grid, Grid):
        raise ValueError(f"grid must be a Grid (make_grid), got {type(grid).__name__}")


def _snapshots(r: Array, amplitudes: Array | None) -> Array:
    w = jnp.ones_like(r) if amplitudes is None else amplitudes
    return (w * jnp.exp(1j * r)) / jnp.sum(w, axis=1, keepdims=True)


def _checked_snapshots(model: PhaseModel, r: ArrayLike, amplitudes: ArrayLike | None):
    """(r (N, M), its amplitude-weighted unit phasors (N, M)) after the input checks."""
    check_phases("r", r, model.num_aps)
    r = jnp.atleast_2d(jnp.asarray(r))
    a = None
    if amplitudes is not None:
        a_np = np.atleast_2d(np.asarray(amplitudes, float))
        if a_np.shape != r.shape:
            raise ValueError(f"amplitudes must have the shape of r {r.shape}, got {a_np.shape}")
        if not np.all(np.isfinite(a_np)) or np.any(a_np < 0) or np.any(a_np.sum(1) <= 0):
            raise ValueError("amplitudes must be finite, >= 0 and not all zero in a snapshot")
        a = jnp.asarray(a_np, r.dtype)
    return r, _snapshots(r, a)


def _squared_scores(rows: Array, e: Array) -> Array:
    """Squared float32 grid scores (n, P) of snapshot phasors ``e`` (n, M) against matched
    filter ``rows`` (P, 2M) ``[Re t, Im t]``: :func:`~dmimo_jax.estimators.phasors.squared_coherence`
    with the snapshots as ``[[Re e, Im e], [-Im e, Re e]]`` (its columns give Re te, Im te)."""
    weights = jnp.block([[e.real.T, e.imag.T], [-e.imag.T, e.real.T]]).astype(jnp.float32)
    return squared_coherence(rows, weights)


@partial(jax.jit, static_argnames=("chunk_size",))
def _grid_argmax(model, grid: Grid, e: Array, chunk_size: int, table=None) -> tuple[Array, Array]:
    """Best grid cell per snapshot, scored in float32 like the paper's phasor table (the
    float64 local stage re-scores around the winner): one real matrix product per chunk
    (:func:`_squared_scores`). The rows come from ``table`` (a :class:`CoherentTable` of
    ``chunk_size`` rows per chunk) when given, else from ``model``."""
    num_chunks = -(-grid.size // chunk_size)
    n = e.shape[0]

    def body(carry, c):
        best, arg = carry
        idx = (c * chunk_size + jnp.arange(chunk_size)).astype(jnp.int32)
        a = _rows(model, grid, idx) if table is None else table.rows[c]
        s = jnp.where((idx < grid.size)[None, :], _squared_scores(a, e), -1.0)  # (N, chunk)
        i = jnp.argmax(s, axis=1)
        v = jnp.max(s, axis=1)
        better = v > best
        return (jnp.where(better, v, best), jnp.where(better, idx[i], arg)), None

    init = (jnp.full((n,), -2.0, jnp.float32), jnp.zeros((n,), jnp.int32))
    (best, arg), _ = jax.lax.scan(body, init, jnp.arange(num_chunks, dtype=jnp.int32))
    return arg, jnp.sqrt(jnp.maximum(best, 0.0))


def _refine_around(model, grid: Grid, x: Array, e: Array, refine_steps: int):
    """The float64 local stage around positions ``x`` (N, 3): (positions, scores)."""
    offsets = jnp.asarray(local_offsets(grid, refine_steps), x.dtype)
    return _local_refine(model, x, e, offsets)


@jax.jit
def _local_refine(model, centres: Array, e: Array, offsets: Array):
    def one(c, ei):
        pts = c[None, :] + offsets
        s = jnp.abs(jax.vmap(partial(expected_phasor, model))(pts) @ ei)
        return pts[jnp.argmax(s)], jnp.max(s)

    return map_in_chunks(lambda a: one(*a), (centres, e), 64)


def local_offsets(grid: Grid, steps: int) -> np.ndarray:
    """The local stage's offsets (K, 3): ``steps`` points per axis over +-one grid spacing,
    along the axes where ``grid`` has more than one cell."""
    t = np.linspace(-grid.spacing, grid.spacing, steps)
    axes = [t if n > 1 else np.zeros(1) for n in grid.shape]
    return np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)


def coherent_search(
    model: PhaseModel,
    grid: Grid,
    r: ArrayLike,
    amplitudes: ArrayLike | None = None,
    *,
    refine_steps: int = 11,
    chunk_size: int = CHUNK_SIZE,
    table: CoherentTable | None = None,
) -> CoherentResult:
    r"""Maximize the coherent score (module docstring) over ``grid``, then locally.

    The grid stage scores in float32 (the paper's phasor-table precision: score errors
    ~1e-6 against lobe differences ~1e-2); the local stage, in float64, searches a
    ``refine_steps``-point-per-axis grid of half-width one grid spacing around each winner
    (along the axes the grid has more than one cell), so the final resolution is
    ``2 * grid.spacing / (refine_steps - 1)``. With ``refine_steps=1`` the score returned is
    the float32 one.

    Args:
        model: any PhaseModel (its variance weights the APs; float64).
        grid: the search grid (e.g. :func:`~dmimo_jax.estimators.make_grid`).
        r: (N, M) or (M,) wrapped phases.
        amplitudes: optional (N, M) or (M,) non-negative measured amplitudes (weights).
        refine_steps: points per axis of the local stage (1: no local stage).
        chunk_size: grid points per matrix product (ignored with ``table``).
        table: the grid stage tabulated beforehand (:func:`coherent_table` of ``model`` on
            ``grid``): the same positions, without evaluating the model at every grid point
            in every call.

    Returns:
        :class:`CoherentResult` (N, 3) positions and the coherence in [0, 1].

    Raises:
        ValueError: phases of the wrong shape or non-finite, negative or all-zero amplitudes,
            bad ``refine_steps``/``chunk_size``.
    """
    model = as_phase_model(model)
    _check_grid(grid)
    check_int("refine_steps", refine_steps, minimum=1)
    check_int("chunk_size", chunk_size, minimum=1)
    r, e = _checked_snapshots(model, r, amplitudes)
    if table is None:
        arg, score = _grid_argmax(model, grid, e, min(chunk_size, grid.size))
    else:
        _check_table(table, grid, model)
        arg, score = _grid_argmax(None, grid, e, table.rows.shape[1], table)
    x = grid_points(grid, arg)
    if refine_steps > 1:
        x, score = _refine_around(model, grid, x, e, refine_steps)
    return CoherentResult(x, score)


def coherent_peaks(
    model: PhaseModel,
    grid: Grid,
    r: ArrayLike,
    amplitudes: ArrayLike | None = None,
    *,
    num_peaks: int = 8,
    separation: int = 3,
    batch_size: int = 32,
    table: CoherentTable | None = None,
) -> CoherentResult:
    r"""The ``num_peaks`` most coherent local maxima of :func:`coherent_search`'s grid score
    per snapshot: the lobes a snapshot leaves ambiguous, for a later stage to choose among
    (e.g. :func:`dmimo_jax.tracking.most_likely_path` along a trajectory), then
    :func:`coherent_refine` the chosen one.

    A grid point is a local maximum when no point of the :math:`(2s+1)^3` cube of cells
    around it (:math:`s` = ``separation``) scores higher. Positions are grid points and scores the grid
    stage's float32 ones (:func:`coherent_search` with ``refine_steps=1`` is the first column).

    Args:
        model: as in :func:`coherent_search`.
        grid: see ``model``.
        r: see ``model``.
        amplitudes: see ``model``.
        table: see ``model``.
        num_peaks: maxima per snapshot, K.
        separation: half-width of the local-maximum window, grid cells (>= 1).
        batch_size: snapshots scored over the whole grid at once (memory: the grid size x
            2 x ``batch_size`` float32 scores).

    Returns:
        :class:`CoherentResult` with ``x`` (N, K, 3) and ``score`` (N, K), best first; where
        a snapshot has fewer than K maxima the missing entries repeat its best position with
        score ``-inf``.

    Raises:
        ValueError: as :func:`coherent_search`; ``num_peaks`` above the grid size, bad
            ``separation`` or ``batch_size``.
    """
    model = as_phase_model(model)
    _check_grid(grid)
    check_int("num_peaks", num_peaks, minimum=1, maximum=grid.size)
    check_int("separation", separation, minimum=1)
    check_int("batch_size", batch_size, minimum=1)
    r, e = _checked_snapshots(model, r, amplitudes)
    if table is None:
        table = _tabulate(model, grid, min(CHUNK_SIZE, grid.size))
    else:
        _check_table(table, grid, model)
    n = e.shape[0]
    if n == 0:  # as coherent_search: an empty batch of answers
        return CoherentResult(
            jnp.zeros((0, num_peaks, 3), r.dtype), jnp.zeros((0, num_peaks), r.dtype)
        )
    batch = min(batch_size, n)
    padded = jnp.concatenate([e, jnp.repeat(e[-1:], -n % batch, axis=0)])
    arg, score = _peaks(table, padded.reshape(-1, batch, e.shape[1]), num_peaks, separation)
    arg, score = arg.reshape(-1, num_peaks)[:n], score.reshape(-1, num_peaks)[:n]
    arg = jnp.where(jnp.isfinite(score), arg, arg[:, :1])
    return CoherentResult(grid_points(grid, arg), score.astype(r.dtype))


def coherent_refine(
    model: PhaseModel,
    grid: Grid,
    x: ArrayLike,
    r: ArrayLike,
    amplitudes: ArrayLike | None = None,
    *,
    refine_steps: int = 11,
) -> CoherentResult:
    """:func:`coherent_search`'s float64 local stage from given positions ``x`` (N, 3) (e.g.
    the maxima of :func:`coherent_peaks` a later stage chose): the best of a
    ``refine_steps``-point-per-axis grid of half-width one ``grid`` spacing around each.

    Raises:
        ValueError: as :func:`coherent_search`; ``x`` not (N, 3) finite positions, one per
            snapshot.
    """
    model = as_phase_model(model)
    _check_grid(grid)
    check_int("refine_steps", refine_steps, minimum=2)
    r, e = _checked_snapshots(model, r, amplitudes)
    check_positions("x", x, batched=True)
    x = jnp.asarray(x, r.dtype)
    if x.shape[0] != r.shape[0]:
        raise ValueError(f"x must hold one position per snapshot ({r.shape[0]}), got {x.shape[0]}")
    return CoherentResult(*_refine_around(model, grid, x, e, refine_steps))


@partial(jax.jit, static_argnames=("num_peaks", "separation"))
def _peaks(table: CoherentTable, e: Array, num_peaks: int, separation: int):
    """Top local maxima of the grid score, for batches ``e`` (B, n, M): (B, n, K) flat
    indices and float32 scores (``-inf`` where fewer than K maxima)."""
    grid = table.grid
    rows = table.rows.reshape(-1, table.rows.shape[-1])[: grid.size]  # (P, 2M)
    w = 2 * separation + 1

    def one(eb: Array):
        n = eb.shape[0]
        s = jnp.sqrt(_squared_scores(rows, eb)).reshape((n, *grid.shape))
        top = s
        for axis in range(1, 4):  # the window's maximum, one axis at a time (separable)
            if s.shape[axis] > 1:
                win = tuple(w if a == axis else 1 for a in range(4))
                top = jax.lax.reduce_window(top, -jnp.inf, jax.lax.max, win, (1,) * 4, "SAME")
        v, i = jax.lax.top_k(jnp.where(s >= top, s, -jnp.inf).reshape(n, -1), num_peaks)
        return i.astype(jnp.int32), v

    return jax.lax.map(one, e)


def _check_table(table, grid: Grid, model: PhaseModel) -> None:
    num_aps = model.num_aps
    if not isinstance(table, CoherentTable):
        raise ValueError(f"table must be a CoherentTable (coherent_table), got {type(table)}")
    t = table.grid
    same = (
        t.shape == grid.shape
        and np.allclose(np.asarray(t.low), np.asarray(grid.low))
        and float(t.spacing) == float(grid.spacing)
    )
    if not same or table.rows.shape[2] != 2 * num_aps:
        raise ValueError(
            "table must be coherent_table(model, grid) of this grid and model's "
            f"{num_aps} APs, got a table of grid {t.shape} and {table.rows.shape[2] // 2} APs"
        )
    # a table of another model on the same grid: its first row disagrees (float32 rows)
    first = _rows(model, grid, jnp.zeros(1, jnp.int32))[0]
    if not np.allclose(np.asarray(first), np.asarray(table.rows[0, 0]), atol=1e-5):
        raise ValueError("table must be coherent_table(model, grid) of this model: its rows differ")


def knn_locate(x_labeled: ArrayLike, r_labeled: ArrayLike, r: ArrayLike, *, k: int = 1) -> Array:
    r"""Fingerprinting: the mean position of the ``k`` labeled snapshots most coherent with each
    snapshot, :math:`|\sum_m e^{j(r_m - r_{lm})}|` (CPO-free), (N, 3).

    Raises:
        ValueError: mismatched shapes, or ``k`` not in [1, L].
    """
    check_positions("x_labeled", x_labeled, batched=True)
    x_labeled = jnp.asarray(x_labeled)
    num_aps = np.shape(r_labeled)[-1] if np.ndim(r_labeled) == 2 else 0
    check_phases("r_labeled", r_labeled, num_aps, batched=True)
    check_phases("r", r, num_aps)
    if np.shape(r_labeled)[0] != x_labeled.shape[0]:
        raise ValueError(
            f"x_labeled and r_labeled must hold the same snapshots, got {x_labeled.shape[0]} "
            f"and {np.shape(r_labeled)[0]}"
        )
    check_int("k", k, minimum=1)
    if k > x_labeled.shape[0]:
        raise ValueError(f"k must be at most the {x_labeled.shape[0]} labeled snapshots, got {k}")
    s = jnp.abs(
        jnp.exp(1j * jnp.atleast_2d(jnp.asarray(r))) @ jnp.exp(-1j * jnp.asarray(r_labeled)).T
    )
    _, idx = jax.lax.top_k(s, k)
    return jnp.mean(x_labeled[idx], axis=1)


def complex_search(
    model: ReceiverModel,
    grid: Grid,
    h: ArrayLike,
    *,
    refine_steps: int = 11,
    lm_steps: int = 10,
    table: CoherentTable | None = None,
) -> CoherentResult:
    r"""Positions of complex snapshots ``h`` (N, M) under a
    :class:`~dmimo_jax.receivers.ReceiverModel`: the receivers' constants removed, the
    coherent search of :math:`\mathbf h - \mathbf b` (its grid stage, then the local stage)
    with the matched filter :math:`\mathbf v^*/\|\mathbf v\|`, i.e. the maximum of the
    complex least-squares score :math:`|\mathbf v^H(\mathbf h - \mathbf b)|^2/
    \|\mathbf v\|^2` (the snapshot factor profiled), then ``lm_steps`` steps of the
    package's Levenberg-Marquardt on the profiled complex residuals
    (:func:`~dmimo_jax.receivers.profiled_residuals`) in the axes the grid spans.

    Returns:
        :class:`CoherentResult`: positions (N, 3) and the normalized score
        :math:`|\mathbf v^H\mathbf y|/(\|\mathbf v\|\|\mathbf y\|)` in [0, 1].

    Raises:
        ValueError: ``model`` not a ReceiverModel, ``h`` not (N, M) finite complex, a
            snapshot without pilot (``h`` equal to the constants), bad settings (as
            :func:`coherent_search`).
    """
    if not isinstance(model, ReceiverModel):
        raise ValueError(f"model must be a ReceiverModel, got {type(model).__name__}")
    h = jnp.atleast_2d(jnp.asarray(h))
    if h.ndim != 2 or h.shape[1] != model.num_aps or not jnp.iscomplexobj(h):
        raise ValueError(
            f"h must be complex snapshots of shape (N, {model.num_aps}), got {h.dtype} {h.shape}"
        )
    check_int("lm_steps", lm_steps)
    y = np.asarray(h) - np.asarray(model.receivers.constants)[None, :]
    if not np.all(np.isfinite(y)):
        raise ValueError("h must be finite")
    a = np.abs(y)
    empty = np.flatnonzero(np.all(a == 0, axis=1))
    if empty.size:
        raise ValueError(
            f"h: snapshot(s) {empty.tolist()[:10]} carry no pilot (equal to the receivers' "
            "constants at every AP): they have no position"
        )
    coarse = coherent_search(
        model, grid, np.angle(y), np.where(a > 0, a, 1e-300), refine_steps=refine_steps, table=table
    )
    if lm_steps == 0:
        return coarse
    mask = jnp.asarray([float(n > 1) for n in grid.shape], coarse.x.dtype)
    x = _complex_lm(model, coarse.x, jnp.asarray(y), mask, lm_steps)
    v = jax.vmap(model.channel)(x)
    score = jnp.abs(jnp.sum(jnp.conj(v) * y, axis=1)) / (
        jnp.linalg.norm(v, axis=1) * jnp.linalg.norm(y, axis=1)
    )
    return CoherentResult(x, score)


@partial(jax.jit, static_argnames=("num_steps",))
def _complex_lm(model, x0, y, mask, num_steps):
    def one(x, yn):
        def res(d, _):
            v = model.channel(x + d * mask)
            e, _ = profiled_residuals(yn, v, jnp.zeros_like(yn))
            return jnp.concatenate([jnp.real(e), jnp.imag(e)])

        out = levenberg_marquardt(res, jnp.zeros_like(x), num_steps=num_steps, damping=1e-3)
        return x + out.x * mask

    return jax.vmap(one)(x0, y)
