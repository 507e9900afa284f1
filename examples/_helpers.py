"""The one helper module of the example scripts (``examples/`` and ``examples/paper/``).

Plots and JSON (optional matplotlib), the GP modeling draws and scores, the localization
test sets, methods and rows, and the MLE mismatch sweep of Fig. 5(a). Scripts import this
module, never each other; physics constants come from the scene.
"""

from __future__ import annotations

import json
import pathlib
import time

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

import dmimo_jax as dj
from dmimo_jax import estimators as est
from dmimo_jax import gp, pipeline
from dmimo_jax.benchmarking import read_rows, time_call, timed_passes, write_json  # noqa: F401
from dmimo_jax.estimators import egs, phasor_table, refine_batch, search_grid
from dmimo_jax.metrics import ecdf, modeling_score

# ----------------------------------------------------------------------------- output


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend, or None (with a hint) when not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: pip install -e '.[plots]' for the PNG")
        return None
    return plt


def save_figure(fig, path: pathlib.Path) -> None:
    """Grid and legend on every axis (a legend already placed is kept), tight layout, PNG."""
    for ax in fig.axes:
        if ax.get_legend_handles_labels()[0]:
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend() is None:
                ax.legend()
    fig.tight_layout()
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150)
    print(f"wrote {path}")


def repeat_style(drawn: list, name: str, values) -> tuple[str, dict]:
    """Label and line style of a curve: one identical to an earlier curve in ``drawn``
    (a list of (name, values), appended to here) is dashed and labelled "(= earlier)"."""
    same = next((n for n, v in drawn if v == values), None)
    drawn.append((name, values))
    if same is None:
        return name, dict(ls="-")
    return f"{name} (= {same})", dict(ls=(0, (4, 3)), lw=2.5)


# ----------------------------------------------------------------------------- GP modeling


def measurements(key, scene, num):
    """``num`` snapshots of the true two-ray channel: positions, phases, their variances, CPOs
    (:func:`dmimo_jax.measure.labeled_snapshots`)."""
    return tuple(dj.measure.labeled_snapshots(key, scene, num))


def fit_and_score(scene, num_train: int, num_test: int, seed: int) -> dict:
    """Fit the GP on ``num_train`` locations; RMSE/NLPD of theory and GP on independent test UEs."""
    key_train, key_test = jax.random.split(jax.random.key(seed))
    x, r, nv, _ = measurements(key_train, scene, num_train)
    t0 = time.perf_counter()
    fit = gp.fit(x, r, nv, scene)
    seconds = time.perf_counter() - t0
    model = gp.GPPhaseModel.from_fit(fit, x, r, nv, scene)
    xt, rt, _, _ = measurements(key_test, scene, num_test)
    theory = modeling_score(dj.TwoRayModel(scene), xt, rt)
    learned = modeling_score(model, xt, rt)
    return dict(
        theory_rmse_deg=theory.rmse_deg,
        theory_nlpd=float(theory.nlpd),
        gp_rmse_deg=learned.rmse_deg,
        gp_nlpd=float(learned.nlpd),
        fit_seconds=seconds,
        log_likelihood=float(fit.log_likelihood),
        hyperparameters=fit.params.natural(),
        model=model,
        train=(x, r, nv),
    )


def slice_positions(scene, ap_index: int, gamma: float, num: int):
    """UE positions seen by AP ``ap_index`` at incidence angle ``gamma``, over the UE heights."""
    ap = np.asarray(scene.ap_positions[ap_index])
    z = np.linspace(float(scene.ue_low[2]), float(scene.ue_high[2]), num)
    rho = (z + ap[2]) * np.tan(gamma)
    direction = np.array([1.0, 0.0])  # towards +x
    xy = ap[None, :2] + rho[:, None] * direction[None, :]
    return jnp.asarray(np.column_stack([xy, z]))


# ----------------------------------------------------------------------------- localization


def labeled_snapshots(scene, num, seed):
    """``num`` measured snapshots of the true channel: positions, phases, noise variances
    (:func:`dmimo_jax.measure.labeled_snapshots`, key ``seed``)."""
    return tuple(dj.measure.labeled_snapshots(jax.random.key(seed), scene, num))[:3]


def test_snapshots(scene, num, seed, x=None, cpo=None):
    """Random (or given) test positions and CPOs, and their noisy phases
    (:func:`dmimo_jax.measure.labeled_snapshots`, key ``10_000 + seed``)."""
    test = dj.measure.labeled_snapshots(jax.random.key(10_000 + seed), scene, num, x=x, cpo=cpo)
    return test.x, test.r


def _timed(fn):
    """Compile ``fn``, then one timed pass (:func:`dmimo_jax.benchmarking.timed_passes`)."""
    jax.block_until_ready(fn())
    return timed_passes(fn, 1)


class MLE:
    """EGS (certified table screen) + LM refinement under the believed analytic model."""

    def __init__(self, scene_believed, spacing):
        self.model = dj.TwoRayModel(scene_believed)
        self.table = phasor_table(self.model, search_grid(scene_believed, spacing))

    def __call__(self, r):
        res, t_coarse = _timed(lambda: egs(r, self.model, self.table))
        fine, t_fine = _timed(lambda: refine_batch(res.x, r, self.model))
        return np.asarray(res.x), np.asarray(fine.x), t_coarse, t_fine


class Learned:
    """A trained coarse estimator + the safeguard window + exact GP refinement: the paper's
    online stage, as the library's :class:`~dmimo_jax.pipeline.Locator` (timed per stage)."""

    def __init__(self, offline, kind):
        self.loc = pipeline.Locator.from_offline(offline, kind, fine="model")

    def __call__(self, r):
        coarse, t_coarse = _timed(lambda: self.loc.coarse(r))
        found, t_screen = _timed(lambda: self.loc.screen(r, coarse))
        fine, t_fine = _timed(lambda: self.loc.fine_stage(r, found.x))
        return np.asarray(coarse), np.asarray(fine.x), t_coarse, t_screen + t_fine


class Candidates:
    """The cell classifier + the two-tier candidate screen + the fine stage on the tabulated
    GP model of eq. (27) (beyond the paper) + the cost gate: the library's
    :class:`~dmimo_jax.pipeline.Locator` (``Locator.__call__``'s stages, one at a time so each
    can be timed; the answer is ``Locator.__call__``'s).

    Per-stage times (coarse, safeguard, fine), the fallback and narrow-tier fractions and
    the cell recall (true cell among the K candidates) of the last call are kept in
    ``stats``.
    """

    def __init__(self, offline, *, num_cells=16, min_mass=0.5, fine_steps=None):
        self.loc = pipeline.Locator.from_offline(
            offline, "cells", num_cells=num_cells, min_mass=min_mass, fine_steps=fine_steps
        )
        self.stats = {}

    def __call__(self, r, x_true=None):
        loc = self.loc
        coarse, t_coarse = _timed(lambda: loc.coarse(r))
        found, t_guard = _timed(lambda: loc.screen(r, coarse))
        # the fine stage, then Locator.__call__'s cost gate (a wrong cell is re-screened)
        (_, fine, recovered), t_fine = _timed(
            lambda: loc.certify(r, found.x, loc.fine_stage(r, found.x))
        )
        fine = fine.x
        n = r.shape[0]
        self.stats = dict(
            ms_coarse=1e3 * t_coarse / n,
            ms_safeguard=1e3 * t_guard / n,
            ms_fine=1e3 * t_fine / n,
            fallback_fraction=float(np.mean(np.asarray(found.fallback) | recovered)),
            narrow_fraction=float(np.mean(np.asarray(found.narrow))),
            recovered_fraction=float(np.mean(recovered)),
        )
        cells = loc.stage.cells
        if x_true is not None:
            true_cell = np.asarray(cells.index(jnp.asarray(x_true)))
            hit = np.any(np.asarray(coarse[0]) == true_cell[:, None], axis=1)
            self.stats["cell_recall"] = float(np.mean(hit))
        return np.asarray(loc.coarse_position(coarse)), np.asarray(fine), t_coarse, t_guard + t_fine


def row(method, x, coarse, fine, t_coarse, t_fine, pebs, wall_s):
    """One table row: RMSEs, tail errors (m) and times per snapshot (ms)."""
    x = np.asarray(x)
    ec = np.linalg.norm(coarse - x, axis=1)
    ef = np.linalg.norm(fine - x, axis=1)
    n = x.shape[0]
    return dict(
        method=method,
        coarse_rmse_m=float(np.sqrt(np.mean(ec**2))),
        fine_rmse_m=float(np.sqrt(np.mean(ef**2))),
        p99_m=float(np.percentile(ef, 99)),
        max_m=float(ef.max()),
        ms_per_snapshot=1e3 * (t_coarse + t_fine) / n,
        coarse_ms_per_snapshot=1e3 * t_coarse / n,
        mean_peb_m=float(np.mean(pebs)),
        fine_over_peb=float(np.sqrt(np.mean(ef**2)) / np.mean(pebs)),
        wall_s=wall_s,
        errors_m=ef.tolist(),
    )


COLUMNS = [
    ("method", "method", "s"),
    ("coarse_rmse_m", "coarse RMSE m", ".4g"),
    ("fine_rmse_m", "fine RMSE m", ".4g"),
    ("p99_m", "p99 m", ".4g"),
    ("max_m", "max m", ".4g"),
    ("ms_per_snapshot", "ms/snap", ".3f"),
    ("coarse_ms_per_snapshot", "coarse ms/snap", ".4f"),
    ("mean_peb_m", "mean PEB m", ".4g"),
    ("fine_over_peb", "fine/PEB", ".2f"),
]


def print_rows(rows):
    widths = [max(len(h), 10) for _, h, _ in COLUMNS]
    print("  ".join(h.rjust(w) for (_, h, _), w in zip(COLUMNS, widths, strict=True)))
    for r in rows:
        print(
            "  ".join(
                format(r[k], f).rjust(w) for (k, _, f), w in zip(COLUMNS, widths, strict=True)
            )
        )


def plot_cdfs(plt, rows, path, title):
    """Fine-error ECDFs; a curve identical to an earlier one is dashed and says so."""
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = []
    for r in rows:
        label, style = repeat_style(drawn, r["method"], r["errors_m"])
        e, p = ecdf(np.asarray(r["errors_m"]))
        ax.step(e, p, where="post", label=label, **style)
    ax.axvline(rows[0]["mean_peb_m"], color="k", ls=":", label="mean PEB")
    ax.set_xscale("log")
    ax.set_xlabel("fine position error [m]")
    ax.set_ylabel("empirical CDF")
    ax.set_title(title)
    return fig


# ----------------------------------------------------------------------------- MLE mismatch (Fig. 5a)


TEST_POINT = (6.5, 5.0, 2.0)


def run_point(scene_true, believed, table, n: int, seed: int) -> dict:
    """RMSE of EGS + refinement under the ``believed`` model, n noise draws at the test point."""
    x = jnp.asarray(TEST_POINT)
    xs = jnp.broadcast_to(x[None, :], (n, 3))
    r = dj.simulate_phases_batch(jax.random.key(seed), scene_true, xs, jnp.full((n,), jnp.pi / 2))
    coarse = est.egs(r, believed, table)
    fine = est.refine_batch(coarse.x, r, believed)
    err = np.linalg.norm(np.asarray(fine.x) - np.asarray(TEST_POINT)[None, :], axis=1)
    err_egs = np.linalg.norm(np.asarray(coarse.x) - np.asarray(TEST_POINT)[None, :], axis=1)
    return dict(
        rmse_m=float(np.sqrt(np.mean(err**2))),
        median_err_m=float(np.median(err)),
        egs_rmse_m=float(np.sqrt(np.mean(err_egs**2))),
        outliers=int(np.sum(err > 0.1)),  # > 10 cm: a wrong phase-ambiguity cell
        peb_m=float(dj.peb(x, scene_true)),
    )


def mle_mismatch_sweep(betas, powers_dbm, realizations, spacing_div, json_path, *, resume):
    """Fig. 5(a)'s MLE curves: EGS + refinement under eps_r * beta at the test point, for
    every (beta, P); rows kept in ``json_path`` (a resumed sweep skips finished points)."""
    if realizations < 2:
        raise ValueError(f"--realizations must be >= 2, got {realizations}")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    rows = read_rows(json_path) if resume and json_path.exists() else []
    done = {(row["beta"], row["power_dbm"]) for row in rows}
    base = dj.paper_scene()
    grid = est.search_grid(base, float(base.wavelength) / spacing_div)
    todo = [(b, p) for b in betas for p in powers_dbm if (b, p) not in done]
    with tqdm(total=len(todo), desc="mle_mismatch", unit="point") as bar:
        for beta in betas:
            if all((beta, p) in done for p in powers_dbm):
                continue
            # the believed model's table: phases do not depend on P, so one per beta
            believed0 = dj.TwoRayModel(base.replace(eps_r=beta * base.eps_r))
            table = est.phasor_table(believed0, grid)
            for i, power in enumerate(powers_dbm):
                if (beta, power) in done:
                    continue
                truth = dj.paper_scene(power_dbm=power)
                believed = dj.TwoRayModel(truth.replace(eps_r=beta * truth.eps_r))
                row = dict(beta=beta, power_dbm=power, spacing_m=grid.spacing, n=realizations)
                row.update(run_point(truth, believed, table, realizations, seed=100 + i))
                rows.append(row)
                json_path.write_text(json.dumps(rows, indent=1))
                bar.update()
                bar.set_postfix(beta=beta, P=power, rmse_um=f"{row['rmse_m'] * 1e6:.1f}")
            del table
    return rows
