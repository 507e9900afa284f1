"""Shared by the localization scripts (quickstart, Fig. 5, Table II): test sets, methods, rows."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from _output import repeat_style

import dmimo_jax as dj
from dmimo_jax import pipeline
from dmimo_jax.estimators import egs, phasor_table, refine_batch, search_grid
from dmimo_jax.metrics import ecdf


def labeled_snapshots(scene, num, seed):
    """``num`` measured snapshots of the true channel: positions, phases, noise variances."""
    k_x, k_cpo, k_noise = jax.random.split(jax.random.key(seed), 3)
    truth = dj.TwoRayModel(scene)
    x = dj.sample_positions(k_x, num, scene)
    r = dj.simulate_phases_batch(k_noise, truth, x, dj.random_cpos(k_cpo, num))
    return x, r, jax.vmap(truth.variance)(x)


def test_snapshots(scene, num, seed, x=None, cpo=None):
    """Random (or given) test positions and CPOs, and their noisy phases."""
    k_x, k_cpo, k_noise = jax.random.split(jax.random.key(10_000 + seed), 3)
    x = (
        dj.sample_positions(k_x, num, scene)
        if x is None
        else jnp.broadcast_to(jnp.asarray(x), (num, 3))
    )
    cpo = dj.random_cpos(k_cpo, num) if cpo is None else jnp.full((num,), cpo)
    return x, dj.simulate_phases_batch(k_noise, dj.TwoRayModel(scene), x, cpo)


def _timed(fn):
    jax.block_until_ready(fn())  # compile
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - t0


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
    """A trained coarse estimator + the safeguard + GP refinement (the online stage)."""

    def __init__(self, offline, kind):
        self.off, self.kind = offline, kind
        self.est = offline.estimators[kind]

    def __call__(self, r):
        coarse, t_coarse = _timed(lambda: pipeline.coarse_estimate(self.est, r))
        out, t_all = _timed(
            lambda: pipeline.locate(
                r,
                self.est,
                self.off.model,
                screen=self.off.screen,
                radius=self.off.radii[self.kind],
                table=self.off.table,
            )
        )
        return np.asarray(coarse), np.asarray(out.fine), t_coarse, t_all - t_coarse


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
