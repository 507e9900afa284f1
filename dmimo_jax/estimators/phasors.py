r"""The phasor screen shared by the grid search, the window and cell screens (eq. 18's certificate).

Every screen of the package ranks points :math:`\mathbf x` by the *coherence*
:math:`|\sum_m e^{j(r_m - \theta_m(\mathbf x))}|` of a snapshot against the model phases:
for any CPO :math:`\phi` the LS cost of eq. (18) is at least
:math:`2(M - |\sum_m e^{j(r_m-\theta_m)}|)`, so the most coherent points are the best
candidates, and the bound certifies the screen (:func:`~dmimo_jax.estimators.egs`).
The model's phasors are stored once as float32 rows :math:`[\cos\theta, \sin\theta]`
(2M); a snapshot becomes the real 2M x 2 matrix
:math:`[[\cos r, \sin r], [\sin r, -\cos r]]`, whose product with a row is the real and
imaginary part of :math:`\sum_m e^{j r_m} e^{-j\theta_m}`. Unchecked, traceable helpers:
the public searches validate their inputs and call these. The points of a cell table's
cells are laid out here too (:class:`CellPoints`, :func:`cell_points`): the cell screens
read one table or the tiles' joined tables by them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike


def phasor_rows(theta: ArrayLike) -> Array:
    r"""Float32 rows :math:`[\cos\theta_1..\cos\theta_M, \sin\theta_1..\sin\theta_M]` (..., 2M)
    of model phases ``theta`` (..., M) (eq. 7b without the CPO)."""
    theta = jnp.asarray(theta)
    return jnp.concatenate([jnp.cos(theta), jnp.sin(theta)], axis=-1).astype(jnp.float32)


def coherence_weights(r: ArrayLike) -> Array:
    r"""The snapshots ``r`` (B, M) as one float32 matrix (2M, 2B): column ``b`` gives
    :math:`\mathrm{Re}\sum_m e^{j(r_{bm}-\theta_m)}` and column ``B + b`` its imaginary part
    when a phasor row multiplies it (:math:`[[\cos r, \sin r], [\sin r, -\cos r]]^\top`)."""
    r = jnp.asarray(r)
    c, s = jnp.cos(r).astype(jnp.float32), jnp.sin(r).astype(jnp.float32)
    return jnp.concatenate(
        [jnp.concatenate([c, s], axis=1), jnp.concatenate([s, -c], axis=1)], axis=0
    ).T


SKINNY_BATCH = 16
"""Up to this many snapshots, :func:`squared_coherence` multiplies ``rows @ weights``
(tall and skinny), above it ``weights^T rows^T``: on each side the orientation measured
faster on the CPU (docs/performance.md, "The screen's product";
``benchmarks/screen_product.py`` measures it again)."""


def squared_coherence(rows: Array, weights: Array) -> Array:
    r"""Squared coherences :math:`|\sum_m e^{j(r_{bm} - \theta_{nm})}|^2` (B, N) of phasor
    ``rows`` (N, 2M) (:func:`phasor_rows`) against ``weights`` (2M, 2B)
    (:func:`coherence_weights`): one real matrix product, oriented by B
    (:data:`SKINNY_BATCH`; the same sums, to float32 rounding)."""
    batch = weights.shape[1] // 2
    if batch <= SKINNY_BATCH:
        z = rows @ weights  # (N, 2B)
        return (z[:, :batch] ** 2 + z[:, batch:] ** 2).T
    z = jnp.einsum("mb,cm->bc", weights, rows)  # (2B, N)
    return z[:batch] ** 2 + z[batch:] ** 2


def cube_offsets(axis: ArrayLike) -> np.ndarray:
    """All (n^3, 3) offsets of a cube whose points along each axis are ``axis`` (n,), C order."""
    axis = np.asarray(axis, float)
    return np.stack(np.meshgrid(axis, axis, axis, indexing="ij"), axis=-1).reshape(-1, 3)


def cell_points(cell: Array, cells: tuple, grid: tuple, per_edge: int) -> Array:
    """The flat indices (..., P) into a table of grid shape ``grid`` of the points of cells
    ``cell`` (...,) of a cell grid of shape ``cells`` with ``per_edge`` spacings per cell
    edge (:class:`CellTable`'s layout), in the order of :attr:`CellTable.offsets`; traced."""
    n = per_edge + 2
    i, j, k = jnp.unravel_index(jnp.asarray(cell, jnp.int32), cells)
    first = ((i * grid[1] + j) * grid[2] + k) * per_edge  # its first point, flat
    a, b, c = np.unravel_index(np.arange(n**3), (n, n, n))
    block = jnp.asarray((a * grid[1] + b) * grid[2] + c, jnp.int32)  # (P,) static
    return first[..., None] + block.reshape((1,) * first.ndim + (-1,))


class CellPoints:
    """The points of a cell table's cells (an n x n x n block a cell, n = ``per_edge`` + 2,
    ``spacing`` apart), from a class's ``per_edge``, ``spacing`` and ``corner_dtype``."""

    @property
    def points_per_side(self) -> int:
        """n of the n x n x n points of each cell."""
        return self.per_edge + 2

    @property
    def points_per_cell(self) -> int:
        """Points per cell, n**3."""
        return self.points_per_side**3

    @property
    def offsets(self) -> Array:
        """(P, 3) the points' offsets from a cell's lower corner, m, C order."""
        axis = self.spacing * (np.arange(self.points_per_side) - 0.5)
        return jnp.asarray(cube_offsets(axis), self.corner_dtype)
