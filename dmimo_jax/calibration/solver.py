r"""The calibration's fitting core: the whitened residuals of L labeled (and N unlabeled)
snapshots as a function of the groups' unknowns, their normal equations and the
Levenberg-Marquardt rounds over them (:func:`fit_lm`), the Gauss-Newton information and the
standard errors (:func:`standard_errors`).

For a fixed tuple of groups (:mod:`~dmimo_jax.calibration.groups`, pytrees whose layout is
static) :func:`solve` and :func:`information` are jitted pure functions of arrays: one
compiled program serves every calibration of the same shapes. The residuals are those of
the CPO-profiled likelihood of :mod:`~dmimo_jax.calibration.calibrating` (eq. 8 with the CPO
of eq. 15); each unlabeled snapshot's position is profiled out by the package's LM
(:func:`profiled_positions`, variable projection). For complex snapshots whose groups each
move one AP, :func:`per_ap_structure` and :func:`per_ap_normal` give the normal equations by
column compression (7 tangents for any number of APs).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from dmimo_jax.calibration.groups import Deployment, FitGroup
from dmimo_jax.estimators.lm import levenberg_marquardt
from dmimo_jax.likelihood import compressed_residuals
from dmimo_jax.receivers import ReceiverModel, profiled_residuals

CONVERGENCE_TOLERANCE = 1e-2
"""A round of LM steps that lowers the cost (the chi-square, in units of the noise) by less
than this ends the fit as converged: far below the chi-square's own spread."""

UNLABELED_STEPS = 10
"""Levenberg-Marquardt steps that re-locate each unlabeled snapshot at every iterate."""


def whitened(model: Any, x: Array, r: Array, noise_var: Array) -> Array:
    """Whitened residuals, flat: (L M,) of wrapped phases with the CPOs profiled (eq. 15),
    or for a :class:`~dmimo_jax.receivers.ReceiverModel` and complex snapshots ``r`` with
    complex-noise variances ``noise_var``, (L M 2,) [Re, Im] of
    :func:`~dmimo_jax.receivers.profiled_residuals` (each real part of variance
    ``noise_var / 2``; the snapshot factor weighted by the same variances: the
    maximum-likelihood one)."""
    if isinstance(model, ReceiverModel):
        v = jax.vmap(model.channel)(x)
        res, _ = profiled_residuals(r, v, model.receivers.constants, noise_var)
        scale = jnp.sqrt(noise_var / 2.0)
        return jnp.stack([jnp.real(res) / scale, jnp.imag(res) / scale], axis=-1).reshape(-1)
    mean = jax.vmap(model.mean)(x)
    return (compressed_residuals(r, mean, noise_var) / jnp.sqrt(noise_var)).reshape(-1)


def split(groups: Sequence[FitGroup], u: Array) -> list[Array]:
    """``u`` cut into the groups' slices, in their order."""
    out, i = [], 0
    for g in groups:
        out.append(u[i : i + g.size])
        i += g.size
    return out


def apply_groups(model: Any, groups: Sequence[FitGroup], u: Array) -> Any:
    """``model`` with every group's unknowns set from its slice of ``u`` (traceable)."""
    for g, part in zip(groups, split(groups, u), strict=True):
        model = g.apply(model, part)
    return model


def residuals(u: Array, d: Deployment, groups: Sequence[FitGroup], unlabeled: Any = None) -> Array:
    """Whitened residuals of the deployment's labeled snapshots at the groups' unknowns
    ``u``, the groups' priors', then the unlabeled snapshots' (if any: ``(x0, r,
    noise_var)``) at their positions profiled out (:func:`profiled_positions`)."""
    m = apply_groups(d.model, groups, u)
    prior = [g.prior_residuals(p) for g, p in zip(groups, split(groups, u), strict=True)]
    e = jnp.concatenate([whitened(m, d.x, d.r, d.noise_var), *prior])
    if unlabeled is None:
        return e
    x0, r_u, nv_u = unlabeled
    xs = profiled_positions(u, d.model, groups, x0, r_u, nv_u)
    return jnp.concatenate([e, whitened(m, xs, r_u, nv_u)])


def locate_labeled(model: Any, x0: Array, r: Array, noise_var: Array) -> Array:
    """Each snapshot's position under ``model`` by the package's LM from ``x0`` (N, 3)."""

    def one(x, rn, nvn):
        def res(v, _):
            return whitened(model, v[None], rn[None], nvn[None])

        return levenberg_marquardt(res, x, num_steps=UNLABELED_STEPS, damping=1e-3).x

    return jax.vmap(one)(x0, r, noise_var)


@jax.custom_jvp
def profiled_positions(u, model, groups, x0, r, noise_var):
    r"""Positions of unlabeled snapshots at the calibration ``u`` (variable projection).

    Value: :func:`locate_labeled` under the model at ``u``. Derivative (Gauss-Newton implicit
    function): each position moves with ``u`` as
    :math:`d\mathbf x_n = -(\mathbf J_x^\top\mathbf J_x)^{-1}\mathbf J_x^\top
    \mathbf J_u\,d\mathbf u`, so the calibration's Jacobian of an unlabeled snapshot's
    residuals is :math:`(\mathbf I - \mathbf P_x)\mathbf J_u`, the residual form of the
    joint problem's Schur complement. Only ``u`` carries a tangent (the others' are
    ignored: the calibration differentiates in ``u`` alone).
    """
    return locate_labeled(apply_groups(model, groups, u), x0, r, noise_var)


@profiled_positions.defjvp
def profiled_positions_jvp(primals, tangents):
    u, model, groups, x0, r, noise_var = primals
    du = tangents[0]
    xs = profiled_positions(u, model, groups, x0, r, noise_var)

    def one(xn, rn, nvn):
        def res(v, x):
            return whitened(apply_groups(model, groups, v), x[None], rn[None], nvn[None])

        jx = jax.jacfwd(res, argnums=1)(u, xn)
        _, ju = jax.jvp(lambda v: res(v, xn), (u,), (du,))
        return -jnp.linalg.solve(jx.T @ jx, jx.T @ ju)

    return xs, jax.vmap(one)(xs, r, noise_var)


def per_ap_structure(model: Any, groups: Sequence[FitGroup]) -> tuple[Array, Array] | None:
    """For a :class:`~dmimo_jax.receivers.ReceiverModel` whose groups each move one AP's
    channel column or constant per unknown (each group's
    :meth:`~dmimo_jax.calibration.groups.FitGroup.per_ap_layout` says so):
    ``(colours (K, n), aps (M, n))``, one-hot rows. Unknowns of one colour act on different
    APs, so one forward-mode tangent per colour (K <= 7) gives every column of the
    Jacobian (column compression); ``aps`` names each unknown's AP. ``None`` otherwise (a
    surface, a pattern or an offset moves every AP: the plain ``jax.jacfwd``)."""
    if not isinstance(model, ReceiverModel):
        return None
    num = model.num_aps
    ap_of, colour_of = [], []
    for g in groups:
        layout = g.per_ap_layout(num)
        if layout is None:
            return None
        ap_of += layout[0]
        colour_of += layout[1]
    ap_of, colour_of = np.asarray(ap_of, int), np.asarray(colour_of, int)
    colours = np.unique(colour_of)
    onehot = (colour_of[None, :] == colours[:, None]).astype(float)
    aps = (ap_of[None, :] == np.arange(num)[:, None]).astype(float)
    dtype = model.scene.ap_positions.dtype
    return jnp.asarray(onehot, dtype), jnp.asarray(aps, dtype)


def per_ap_normal(
    u: Array, d: Deployment, groups: Sequence[FitGroup], structure: tuple[Array, Array]
) -> tuple[Array, Array]:
    r"""The normal equations :math:`(\mathbf J^\top\mathbf J, \mathbf J^\top\mathbf e)` of
    :func:`residuals` (labeled snapshots, complex) at ``u`` by column compression
    (``per_ap_structure``: the channel columns :math:`\mathbf v` and the constants
    :math:`\mathbf b` differentiated along one tangent per colour) and the profiled
    residual differentiated in closed form, without forming the Jacobian. Every quantity is
    whitened first (:math:`\tilde{\mathbf v} = \Omega^{1/2}\mathbf v`, :math:`\tilde{\mathbf
    y} = \Omega^{1/2}(\mathbf h - \mathbf b)`, their tangents likewise, :math:`\omega =
    2/\sigma^2` per snapshot and AP), so the residual is :math:`\mathbf e = \tilde{\mathbf y}
    - \hat s\tilde{\mathbf v}` with the weighted factor :math:`\hat s = \tilde{\mathbf v}^H
    \tilde{\mathbf y}/\tilde{\mathbf v}^H\tilde{\mathbf v}` (:func:`whitened`'s). For an
    unknown p of AP m(p), :math:`d\hat s = (\overline{d\tilde v_m}\tilde y_m + \bar{\tilde
    v}_m d\tilde y_m - 2\hat s\,\mathrm{Re}(\bar{\tilde v}_m d\tilde v_m))/\tilde{\mathbf
    v}^H\tilde{\mathbf v}` and :math:`d\mathbf e_l = -d\hat s_l\tilde{\mathbf v}_l +
    \mathbf e_{m(p)} w_{lp}`, :math:`w = d\tilde y_m - \hat s\,d\tilde v_m`, so
    :math:`\mathbf J^\top\mathbf J = \mathrm{Re}[d\hat s^H N d\hat s - d\hat s^H C -
    C^H d\hat s + (w^H w)\odot\text{same AP}]` (:math:`N = \|\tilde{\mathbf v}\|^2`,
    :math:`C = \bar{\tilde v}_{m(p)} w`), an O(L n^2) product where the Jacobian's is
    O(L M n^2). Equal to the product (tested)."""
    model, x, r, noise_var = d
    colours, aps = structure

    def columns(v):
        m = apply_groups(model, groups, v)
        return jax.vmap(m.channel)(x), m.receivers.constants

    (vv, b), (dv, db) = jax.vmap(lambda t: jax.jvp(columns, (u,), (t,)), out_axes=(None, 0))(
        colours
    )
    sw = jnp.sqrt(2.0 / noise_var)  # (L, M) the whitening
    sw_p = sw @ aps  # (L, n) that of each unknown's AP
    dv_p = jnp.einsum("klm,kp,mp->lp", dv, colours, aps) * sw_p
    dy_p = -jnp.einsum("km,kp,mp->p", db, colours, aps)[None, :] * sw_p
    vv, y = vv * sw, (r - b[None, :]) * sw
    norm = jnp.sum(jnp.abs(vv) ** 2, axis=1)  # (L,)
    s = jnp.sum(jnp.conj(vv) * y, axis=1) / norm
    v_p, y_p = vv @ aps, y @ aps
    ds = (
        jnp.conj(dv_p) * y_p
        + jnp.conj(v_p) * dy_p
        - 2 * s[:, None] * jnp.real(jnp.conj(v_p) * dv_p)
    ) / norm[:, None]
    w = dy_p - s[:, None] * dv_p  # (L, n) each unknown's own entry
    c = jnp.conj(v_p) * w  # (L, n)
    same = aps.T @ aps  # (n, n) 1 where two unknowns share an AP
    cross = jnp.conj(ds).T @ c  # ds^H C; its transpose-conjugate is the other cross term
    ata = (jnp.conj(ds) * norm[:, None]).T @ ds - cross - jnp.conj(cross.T)
    ata = jnp.real(ata + (jnp.conj(w).T @ w) * same)
    res = y - s[:, None] * vv  # (L, M) the whitened profiled residuals
    # J^T e = Re[-ds^H (v^H e) + sum_l w^H e_m(p)]; v^H e = 0 at the least-squares factor
    atg = jnp.real(jnp.sum(jnp.conj(w) * (res @ aps), axis=0))

    def priors(v):
        parts = split(groups, v)
        return jnp.concatenate([g.prior_residuals(p) for g, p in zip(groups, parts, strict=True)])

    jp, ep = jax.jacfwd(priors)(u), priors(u)
    return ata + jp.T @ jp, atg + jp.T @ ep


@partial(jax.jit, static_argnames=("num_steps",))
def solve(d, groups, u0, num_steps, unlabeled=None, structure=None):
    """LM over the concatenated groups from each row of ``u0`` (S, n) on the deployment
    ``d``: (u (S, n), cost (S,)); with ``structure`` (``per_ap_structure``, labeled
    snapshots only) the normal equations by column compression (``per_ap_normal``)."""
    normal = None
    if structure is not None and unlabeled is None:

        def normal(v, _):
            return per_ap_normal(v, d, groups, structure)

    def one(u):
        res = levenberg_marquardt(
            lambda v, _: residuals(v, d, groups, unlabeled),
            u,
            num_steps=num_steps,
            damping=1e-2,
            normal_fn=normal,
        )
        return res.x, res.cost

    return jax.vmap(one)(u0)


@jax.jit
def information(d, groups, u, unlabeled=None):
    """(J^T J of the whitened residuals in u, d natural / d u, the cost) at ``u`` on the
    deployment ``d``."""
    jac = jax.jacfwd(residuals)(u, d, groups, unlabeled)
    nat = jax.jacfwd(
        lambda v: jnp.concatenate(
            [g.natural(p) for g, p in zip(groups, split(groups, v), strict=True)]
        )
    )(u)
    e = residuals(u, d, groups, unlabeled)
    return jac.T @ jac, nat, jnp.sum(e * e)


class FitRounds(NamedTuple):
    """Output of :func:`fit_rounds` (a leading axis per deployment under ``jax.vmap``)."""

    u: Array
    """(n,) the groups' unknowns at the end."""
    cost: Array
    """() sum of squared whitened residuals there (inf: no finite start)."""
    converged: Array
    """() bool, a round lowered the cost by less than the tolerance."""
    steps: Array
    """() int, LM steps spent."""


@partial(jax.jit, static_argnames=("num_steps", "max_steps"))
def fit_rounds(
    d: Deployment,
    groups: tuple[FitGroup, ...],
    u0: Array,
    num_steps: int,
    max_steps: int | None,
    unlabeled: Any = None,
    structure: Any = None,
) -> FitRounds:
    """The calibration's pure fitting core on the deployment ``d``: the best of the LM runs
    from the rows of ``u0`` (S, n), then, with ``max_steps``, rounds of ``num_steps`` steps from it until a round
    lowers the cost by less than :data:`CONVERGENCE_TOLERANCE` or accepts no step
    (converged) or ``max_steps`` are spent (not converged).

    One program (a ``lax.while_loop`` over the rounds): for a fixed tuple of groups it is a
    pure function of arrays, so ``jax.vmap`` over deployments of the same shapes (the
    deployments, the groups' arrays and the starts stacked) fits them all at once, each
    stopping at its own round. ``num_steps``, ``max_steps`` and the groups' layout are
    static; ``structure``: :func:`per_ap_structure` (labeled complex snapshots only)."""

    def best_of(u, cost):
        cost = jnp.where(jnp.isfinite(cost), cost, jnp.inf)
        best = jnp.argmin(cost)
        return u[best], cost[best]

    def round_(state):
        u, cost, steps, _ = state
        u_new, c_new = solve(d, groups, u[None], num_steps, unlabeled, structure)
        first = steps == 0  # the first run from a single start: taken whatever its cost
        c_new = c_new[0]
        # no step accepted: the LM is at a stationary point
        stalled = ~first & (~jnp.isfinite(c_new) | (c_new >= cost))
        done = ~first & (stalled | (cost - c_new < CONVERGENCE_TOLERANCE))
        u = jnp.where(stalled, u, u_new[0])
        cost = jnp.where(stalled, cost, jnp.where(jnp.isfinite(c_new), c_new, jnp.inf))
        return u, cost, steps + num_steps, done

    if u0.shape[0] == 1 and max_steps is not None:
        # one start: its first run is the loop's first round (one LM in the program)
        start = (u0[0], jnp.asarray(jnp.inf, u0.dtype), jnp.asarray(0), jnp.asarray(False))
    else:
        u, cost = best_of(*solve(d, groups, u0, num_steps, unlabeled, structure))
        start = (u, cost, jnp.asarray(num_steps), jnp.asarray(False))
        if max_steps is None:
            return FitRounds(u, cost, jnp.asarray(True), start[2])

    def more(state):
        _, _, steps, done = state
        return (steps == 0) | (~done & (steps + num_steps <= max_steps))

    u, cost, steps, done = jax.lax.while_loop(more, round_, start)
    return FitRounds(u, cost, done, steps)


@partial(jax.jit, static_argnames=("num_steps", "max_steps"))
def fit_rounds_many(
    d: Deployment,
    groups: tuple[FitGroup, ...],
    u0: Array,
    num_steps: int,
    max_steps: int | None,
    structure: Any = None,
) -> FitRounds:
    """:func:`fit_rounds` over a leading axis of deployments in every argument (the
    deployments, groups, starts and structures stacked; labeled snapshots only): one
    program, each deployment stopping at its own round (``jax.vmap`` of the core)."""

    def one(di, g, u, st):
        return fit_rounds(di, g, u, num_steps, max_steps, None, st)

    return jax.vmap(one)(d, groups, u0, structure)


def stack_deployments(trees: Sequence[Any], what: str = "deployments") -> Any:
    """Pytrees of the same structure and shapes stacked along a new leading axis.

    Raises:
        ValueError: the trees differ in structure (a model kind, a static field such as the
            polarization, the groups' layout) or in a leaf's shape.
    """
    first = jax.tree.structure(trees[0])
    shapes = [np.shape(v) for v in jax.tree.leaves(trees[0])]
    for i, tree in enumerate(trees[1:], 1):
        # a treedef holds the static fields too (the polarization, the groups' layout)
        if (
            jax.tree.structure(tree) != first
            or [np.shape(v) for v in jax.tree.leaves(tree)] != shapes
        ):
            raise ValueError(
                f"{what} must share their structure and shapes to be fitted at once (the same "
                "model kind and static fields such as the polarization, the same groups and "
                f"numbers of snapshots, APs and surfaces): {what} 0 and {i} differ"
            )
    return jax.tree.map(lambda *a: jnp.stack([jnp.asarray(v) for v in a]), *trees)


def fit_lm_many(
    deployments: Sequence[Deployment],
    groups: Sequence[Sequence[FitGroup]],
    u0: Sequence[Array],
    num_steps: int,
    max_steps: int | None = None,
    jacobian: str = "auto",
) -> list[tuple[np.ndarray, float, bool]]:
    """:func:`fit_lm` of each deployment (labeled snapshots), its groups and its starts (S, n): one deployment runs :func:`fit_lm` itself; more run
    :func:`fit_rounds_many` once on their stacked arguments (:func:`stack_deployments`), with
    the same answers (tested to 1e-9)."""
    if len(deployments) == 1:
        (d,), (grp,), (start,) = deployments, groups, u0
        return [fit_lm(d, grp, start, num_steps, None, max_steps, jacobian)]
    rows = []
    for d, grp, start in zip(deployments, groups, u0, strict=True):
        structure = per_ap_structure(d.model, grp) if jacobian == "auto" else None
        rows.append((d, tuple(grp), jnp.asarray(start), structure))
    *args, structure = stack_deployments(rows)
    out = fit_rounds_many(*args, num_steps, max_steps, structure)
    u, cost, converged = np.asarray(out.u), np.asarray(out.cost), np.asarray(out.converged)
    return [(u[i], float(cost[i]), bool(converged[i])) for i in range(len(rows))]


def fit_lm(
    d: Deployment,
    groups: Sequence[FitGroup],
    u0: Array,
    num_steps: int,
    unlabeled: Any = None,
    max_steps: int | None = None,
    jacobian: str = "auto",
) -> tuple[np.ndarray, float, bool]:
    """:func:`fit_rounds` from the host: (u, cost, converged) as NumPy / Python values;
    ``jacobian="auto"`` uses the column-compressed normal equations where the groups allow
    (:func:`per_ap_structure`), ``"autodiff"`` the plain ``jax.jacfwd``."""
    structure = None
    if unlabeled is None and jacobian == "auto":
        structure = per_ap_structure(d.model, groups)
    out = fit_rounds(
        d,
        tuple(groups),
        jnp.asarray(u0),
        num_steps,
        max_steps,
        unlabeled,
        structure,
    )
    return np.asarray(out.u), float(out.cost), bool(out.converged)


def standard_errors(info: np.ndarray, nat: np.ndarray, inflation: float) -> np.ndarray:
    """Delta-method standard errors of the natural values from the eigen-inverted information:
    a direction with (numerically) zero information gives an infinite error."""
    lam, vec = np.linalg.eigh(info)
    floor = max(float(lam.max()), 0.0) * 1e-14
    ok = lam > floor
    g = nat @ vec  # (n_nat, n): each natural value along the information's eigenvectors
    var = (g[:, ok] ** 2) @ (1.0 / lam[ok])
    # a natural value with a (non-rounding) component along an unconstrained direction
    scale = np.linalg.norm(g, axis=1, keepdims=True)
    free = np.any(np.abs(g[:, ~ok]) > 1e-8 * scale, axis=1)
    return np.where(free, np.inf, np.sqrt(var)) * inflation
