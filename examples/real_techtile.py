"""Real measurements: position the Techtile rover from 42 measured carrier phases.

For every ``csi_EXP*.nc`` in ``--data`` independently: L labeled snapshots drawn at random
(``--seed``; ``--distinct-labels``: L distinct spots, 2 cm apart, as a survey would place
them, where a random draw puts half of EXP002's labels on the spot its rover stood still
on), every other snapshot located in the search area (the labeled snapshots'
bounding box plus 0.3 m, at their median height, a 1 cm grid + a 2 mm local stage;
``--search-3d`` adds the height, +-5 cm). Methods (``kind``):

* ``los_offsets``: the plain model, LoS phase 2 pi d / lambda from the listed antenna
  positions plus per-antenna phase offsets (``calibration.offsets_closed_form``), phases only;
* ``knn``: fingerprinting, the most coherent labeled snapshot (``estimators.knn_locate``);
* ``paper_gp``: the paper's GP (Sec. III: ``gp.fit`` on the labeled snapshots, with the
  fitted offsets in the scene) searched with its mean and variance;
* ``field``: LoS + offsets + the learned residual field (``calibration.fit_residual_field``,
  a per-antenna GP on the residual phasors) from the labeled snapshots, searched with the
  expected phasors and the measured amplitudes (``estimators.coherent_search``);
* ``self_trained``: that field self-trained on the unlabeled snapshots in time order
  (``calibration.self_train_field``: pseudo-labels a neighbour in time confirms, 6 rounds;
  their positions are never used), searched the same way. The same settings for every
  experiment; they were chosen on EXP003/EXP005 (docs/real_data_measurements.md). By default it
  self-trains on the snapshots it then locates (a deployment's own traffic);
  ``--unlabeled-half`` self-trains on every other held-out snapshot and scores every method
  on the others;
* ``trajectory``: ``self_trained``'s field, the 8 most coherent local maxima of each snapshot
  (``estimators.coherent_peaks``), one chosen per snapshot along the trajectory by the
  Viterbi path of ``tracking.most_likely_path`` (cycle numbers as times) through the
  labeled snapshots' known positions (its anchors), then refined
  (``estimators.coherent_refine``); settings chosen on EXP003/EXP005
  (docs/real_data_measurements.md);
* ``lobe_oracle``: a diagnostic, not a method: of the same 8 maxima, the one nearest the
  **true** position, refined: what any choice among the lobes (a trajectory, a robust cost)
  could reach under ``self_trained``'s field;
* ``complex``: the complex snapshots (the CSI with its amplitudes) under the receivers'
  model of :mod:`dmimo_jax.receivers` (model B): LoS channel, a complex gain and an additive
  constant per antenna, calibrated from the labeled snapshots by the package's recipe for
  measured data (``calibration.calibrate_receivers``: each antenna's own variance, its share
  of the chi-square, and each labeled spot counted once), located by
  ``estimators.complex_search`` on the snapshots whitened by those variances
  (``receivers.whiten``: the constants removed, the weighted complex least-squares score);
* ``best``: ``complex`` with the antennas' 3-D phase centres fitted too (a 10 cm prior
  around the listed positions, ``position_prior``);
* ``best_trajectory``: ``best``'s model, its 8 most coherent lobes per snapshot (the
  constants removed) chosen along the trajectory as ``trajectory`` does, then refined;
* ``best_unlabeled`` (not run by default; ``--methods``): ``best``'s calibration refitted
  once more, from its receivers and phase centres, with ``UNLABELED_CALIBRATION`` held-out
  snapshots as unlabeled ones, their positions profiled out from ``best``'s estimates
  (``calibrate(unlabeled=)``, each estimated spot counted once as the labeled ones are),
  then located as ``best`` is: self-calibration of the complex model, measured and not kept
  (docs/real_data_measurements.md);
* ``best_self_trained`` (not run by default; ``--methods``): ``best_field``'s field
  self-trained on the located snapshots as ``self_trained`` is (``self_train_field`` on the
  phases with the constants removed, ``best``'s whitened model fixed underneath), searched as
  ``best_field`` is: measured and not kept (docs/real_data_measurements.md);
* ``best_field``: ``best``'s model (whitened) plus the residual field of ``field``
  (``calibration.fit_residual_field`` with its defaults) learned from the phases of the
  labeled snapshots with the constants removed, searched as ``field`` is (expected phasors,
  the amplitudes of the whitened snapshots with the constants removed as weights): the
  method chosen on EXP003/EXP005 (docs/real_data_measurements.md), the same for every experiment.

Each row also scores the located snapshots whose label is measured, not a motion-capture
frame held from the snapshot before (``median_unheld_m``, ``p90_unheld_m``; the loader's
``held_labels``; ``num_held_located`` of them left out): EXP002's west strip holds 33.

Every search is ``estimators.coherent_search`` with its grid stage tabulated beforehand
(``estimators.coherent_table``, counted in ``fit_s``). Per experiment, the noise-floor references:
the mean PEB under the fitted LoS model with the still rover's 0.05 rad, and with the
revisit repeatability (snapshots < 2 cm apart taken at different times; measured here).

    python examples/real_techtile.py                       # L = 50, every experiment
    python examples/real_techtile.py --learning-curve      # L in 20, 50, 100, 200
    python examples/real_techtile.py --data DIR --num-labeled 50 --seed 0 --json out.json
    python examples/real_techtile.py --unlabeled-half      # self-train and score apart
    python examples/real_techtile.py --distinct-labels     # labels at distinct spots

Writes ``OUT.json`` (rows; resumable with ``--resume``), ``OUT_errors.npz`` (the located
snapshots' indices in the experiment, ``<experiment>_located``, their true positions,
``<experiment>_x``, and each method's horizontal errors, ``<experiment>_<method>``, m; at
``--num-labeled``) and ``OUT.png`` (error CDFs, held-out residuals per antenna, error map of
``best_field``; needs matplotlib).
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
import warnings

import jax

jax.config.update("jax_enable_x64", True)

import numpy as np  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from _helpers import pyplot, save_figure, write_json  # noqa: E402

from dmimo_jax import bounds, gp  # noqa: E402
from dmimo_jax.benchmarking import read_rows  # noqa: E402
from dmimo_jax.calibration import (  # noqa: E402
    PHASE_CENTRE_PRIOR,
    SPOT_RADIUS,
    Positions,
    Unlabeled,
    calibrate,
    calibrate_receivers,
    fit_residual_field,
    offsets_closed_form,
    self_train_field,
    spot_counts,
)
from dmimo_jax.calibration.residual import residual_phasors  # noqa: E402
from dmimo_jax.datasets import list_experiments, load_techtile, techtile_scene  # noqa: E402
from dmimo_jax.estimators import (  # noqa: E402
    coherent_peaks,
    coherent_refine,
    coherent_search,
    coherent_table,
    complex_search,
    knn_locate,
    make_grid,
)
from dmimo_jax.physics import ImageSourceModel  # noqa: E402
from dmimo_jax.receivers import ReceiverModel, whiten  # noqa: E402
from dmimo_jax.tracking import most_likely_path  # noqa: E402

DEFAULT_DATA = pathlib.Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "techtile"
STILL_STD = 0.05  # rad: 355 snapshots of EXP002 within 1.4 mm repeat to this (data README)
METHODS = (
    "los_offsets",
    "knn",
    "paper_gp",
    "field",
    "self_trained",
    "trajectory",
    "lobe_oracle",
    "complex",
    "best",
    "best_trajectory",
    "best_field",
)
MAPPED = "best_field"  # the plot's error map: the method chosen (or best without it)
# measured on request (--methods), not by default
OPTIONAL_METHODS = ("best_unlabeled", "best_self_trained")
# what a row depends on beyond (experiment, L): --resume keeps rows only when these match
RESUME_KEYS = ("data", "seed", "methods", "search_3d", "unlabeled_half", "distinct_labels")
UNLABELED_CALIBRATION = 200  # best_unlabeled's unlabeled snapshots (drawn from the held-out)
LOBE_METHODS = ("trajectory", "lobe_oracle")  # choose among self_trained's lobes
COMPLEX_METHODS = ("complex", "best")
COMPLEX_EXTRAS = ("best_trajectory", "best_field", "best_unlabeled", "best_self_trained")
NUM_LOBES = 8  # local maxima per snapshot (estimators.coherent_peaks)
# tracking.most_likely_path, chosen on EXP003/EXP005 at L = 50 (docs/real_data_measurements.md): a
# random walk of 15 cm per square root of a cycle, a 10% jump probability over the search
# area, the coherence (in [0, 1]) weighted by 20
PATH_SETTINGS = dict(step_std=0.15, jump_probability=0.1, score_weight=20.0)
PAPER_GP_STEPS = 20  # L-BFGS steps of gp.fit (eq. 23)
GP_FIT_OBSERVATIONS = 2100  # L x (APs) of the hyperparameter fit: all 42 APs up to L = 50


def search_grid(x_labeled, spacing=0.01, pad=0.3, search_3d=False):
    """The labeled bounding box + ``pad`` at their median height (one cell thick), or +-5 cm."""
    low, high = x_labeled.min(0) - pad, x_labeled.max(0) + pad
    z = float(np.median(x_labeled[:, 2]))
    half = 0.05 if search_3d else spacing / 2
    low[2], high[2] = z - half, z + half
    return make_grid(low, high, spacing)


def revisit_std(data):
    """Per-antenna phase repeatability of a revisit: snapshots < 2 cm apart (both any time);
    pair coherence c = E cos(dr) = exp(-2 s^2 / 2), so s = sqrt(-ln c)."""
    x = data.positions[:, :2]
    d = np.linalg.norm(x[:, None] - x[None], axis=-1)
    i, j = np.nonzero(np.triu(d < 0.02, 1))
    if len(i) == 0:
        return float("nan"), 0
    z = np.exp(1j * data.phases)
    coh = np.abs(np.sum(z[i] * np.conj(z[j]), axis=1)) / data.num_aps
    return float(np.sqrt(-np.log(np.mean(coh)))), len(i)


def held_coherence(data):
    """Raw complex coherence |h_i^H h_j| / (|h_i| |h_j|) of consecutive snapshots (i - 1, i):
    (those whose label i holds i - 1's bit for bit, ``held_labels``; those measured < 2 mm
    apart, the still rover's repeats). A held label whose CSI changed is not where the rover
    was."""
    h = data.csi / np.linalg.norm(data.csi, axis=1, keepdims=True)
    c = np.abs(np.sum(np.conj(h[1:]) * h[:-1], axis=1))
    step = np.linalg.norm(np.diff(data.positions, axis=0), axis=1)
    held = data.held_labels[1:]
    return c[held], c[~held & (step < 0.002)]


def timed(fn, *args, **kwargs):
    """(result, seconds) of a second, compiled call (the first compiles)."""
    jax.block_until_ready(fn(*args, **kwargs))
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    return out, time.perf_counter() - t0


def draw_labels(x, num_labeled, seed, distinct=False):
    """(labeled, located) snapshot indices: ``num_labeled`` drawn at random (``seed``), the
    rest in time order. With ``distinct``, a draw within ``SPOT_RADIUS`` (horizontal) of an
    earlier one is skipped: the labels are ``num_labeled`` distinct spots, as a survey would
    place them, not copies of one spot a still rover stood on."""
    idx = np.random.default_rng(seed).permutation(len(x))
    if not distinct:
        return idx[:num_labeled], np.sort(idx[num_labeled:])
    chosen = []
    for i in idx:
        if not chosen or np.min(np.linalg.norm(x[chosen, :2] - x[i, :2], axis=1)) >= SPOT_RADIUS:
            chosen.append(i)
            if len(chosen) == num_labeled:
                break
    if len(chosen) < num_labeled:
        raise ValueError(
            f"num_labeled must be at most {len(chosen)} distinct spots, got {num_labeled}"
        )
    li = np.asarray(chosen)
    return li, np.setdiff1d(np.arange(len(x)), li)


def complex_model(los, x, h, *, phase_centres):
    """Model B (module docstring) calibrated on complex labeled snapshots ``h`` by the
    package's recipe for measured data (``calibration.calibrate_receivers``: each receiver
    with its own variance, each labeled spot counted once; with ``phase_centres`` the
    antennas' phase centres within a ``PHASE_CENTRE_PRIOR`` prior): a ``ReceiverCalibration``
    (search with ``receivers.whiten(model, h, noise_var)``)."""
    with warnings.catch_warnings():  # a real room misses what the LoS model lacks: a misfit
        warnings.simplefilter("ignore", UserWarning)
        return calibrate_receivers(
            los, x, h, phase_centres=phase_centres, position_prior=PHASE_CENTRE_PRIOR
        )


def with_unlabeled(los, x, h, fitted, h_u, x0):
    """``fitted`` (``complex_model``'s, with phase centres) refitted once more with the
    complex snapshots ``h_u`` at unknown positions (estimates ``x0``) as well
    (``calibrate(unlabeled=)``, positions profiled out), started from its receivers and phase
    centres at its variances (kept for the search), each labeled and each estimated spot
    counted once."""
    var = fitted.noise_var
    labeled = var * spot_counts(x)[:, None]
    unlabeled = Unlabeled(h_u, var * spot_counts(x0)[:, None], x0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cal = calibrate(
            los,
            x,
            h,
            labeled,
            fit=(
                Positions(
                    prior=PHASE_CENTRE_PRIOR, start=fitted.calibration.values["ap_positions"]
                ),
                "receiver_gains",
                "receiver_constants",
            ),
            receivers=fitted.calibration.receivers,
            unlabeled=unlabeled,
        )
    return ReceiverModel(cal.model, cal.receivers), var  # searched at best's variances


def choose_lobe(model, grid, table, r, amplitudes, cycles, area, labeled, truth=None):
    """One of each snapshot's ``NUM_LOBES`` most coherent maxima, refined: along the Viterbi
    path over the trajectory through the labeled snapshots (``labeled``: their positions and
    cycles, the path's anchors), or (``truth`` given: the diagnostic) the one nearest the
    truth."""
    peaks = coherent_peaks(model, grid, r, amplitudes, num_peaks=NUM_LOBES, table=table)
    if truth is None:
        anchors, anchor_times = labeled
        x = most_likely_path(
            peaks.x,
            peaks.score,
            cycles,
            area=area,
            anchors=anchors,
            anchor_times=anchor_times,
            **PATH_SETTINGS,
        ).x
    else:
        d = np.linalg.norm(np.asarray(peaks.x)[:, :, :2] - truth[:, None, :2], axis=2)
        x = np.asarray(peaks.x)[np.arange(len(d)), np.argmin(d, axis=1)]
    return coherent_refine(model, grid, x, r, amplitudes).x


def run_experiment(
    data, num_labeled, seed, search_3d=False, methods=METHODS, half=False, distinct=False
):
    """Rows (one per method) and the per-snapshot errors, for one experiment and L; with
    ``half``, ``self_trained`` self-trains on every other held-out snapshot (time order) and every
    method is scored on the others only; with ``distinct``, the labels are distinct spots
    (``draw_labels``)."""
    n = data.num_snapshots
    if not 2 <= num_labeled < n:
        raise ValueError(
            f"num_labeled must be in [2, {n - 1}] for {data.experiment}, got {num_labeled}"
        )
    li, ti = draw_labels(data.positions, num_labeled, seed, distinct)
    pool = ti  # self_trained's unlabeled snapshots
    if half:
        pool, ti = ti[0::2], ti[1::2]
    xl, rl, xt, rt = data.positions[li], data.phases[li], data.positions[ti], data.phases[ti]
    held = data.held_labels[ti]  # motion-capture frames held, not measured (the loader's)
    grid = search_grid(xl, search_3d=search_3d)
    area = float(np.prod(np.asarray(grid.shape[:2]) * grid.spacing))  # the path's jump area
    scene = techtile_scene(data, phase_noise_std=STILL_STD)

    t0 = time.perf_counter()
    los = ImageSourceModel(scene, [])
    offsets = offsets_closed_form(los, xl, rl)
    scene = scene.replace(ap_phase_offsets=offsets)
    los = ImageSourceModel(scene, [])
    t_offsets = time.perf_counter() - t0
    amps = data.amplitudes / np.median(data.amplitudes[li], axis=0)

    rows, errors, extras, fitted = [], {}, {}, {}
    for method in methods:
        model, fit_s, amplitudes = None, t_offsets, None
        if method == "los_offsets":
            model = los
        elif method == "paper_gp":
            t0 = time.perf_counter()
            noise = np.full(rl.shape, STILL_STD**2)
            # eq. (23) on every 42-AP covariance is (42 L)^2: its hyperparameters (shared by
            # all APs) are fitted on a subset of about GP_FIT_OBSERVATIONS / L APs, then the
            # GP is conditioned on every AP (one Cholesky)
            k = min(data.num_aps, max(4, GP_FIT_OBSERVATIONS // num_labeled))
            sub = np.linspace(0, data.num_aps - 1, k).round().astype(int)
            small = scene.replace(
                ap_positions=scene.ap_positions[sub], ap_phase_offsets=scene.ap_phase_offsets[sub]
            )
            result = gp.fit(xl, rl[:, sub], noise[:, sub], small, num_steps=PAPER_GP_STEPS)
            exact = gp.GPPhaseModel.from_data(result.params, result.cpo, xl, rl, noise, scene)
            model = gp.TabulatedGPModel.from_model(exact, variance=False)  # the paper's table
            fit_s += time.perf_counter() - t0
        elif method == "field":
            t0 = time.perf_counter()
            model = jax.block_until_ready(fit_residual_field(los, xl, rl))
            fit_s += time.perf_counter() - t0
            amplitudes = amps[ti]
        elif method in (*COMPLEX_METHODS, *COMPLEX_EXTRAS):
            key = "complex" if method == "complex" else "best"
            if key not in fitted:
                t0 = time.perf_counter()
                rc = complex_model(los, xl, data.csi[li], phase_centres=key == "best")
                model, var = rc.model, rc.noise_var
                fitted[key + "_calibration"] = rc
                table = jax.block_until_ready(
                    coherent_table(whiten(model, data.csi[li], var)[0], grid)
                )
                fitted[key] = (model, var, table, time.perf_counter() - t0)
            model, var, table, fit_s = fitted[key]  # the receivers carry the offsets
            whitened, h_located = whiten(model, data.csi[ti], var)
            constants = np.asarray(whitened.receivers.constants)[None, :]
            y_located = h_located - constants  # the constants removed
            y_labeled = whiten(model, data.csi[li], var)[1] - constants
            if method == "best_unlabeled" and "best_unlabeled" not in fitted:
                t0 = time.perf_counter()
                x0 = np.asarray(complex_search(whitened, grid, h_located, table=table).x)
                pick = np.random.default_rng(seed).permutation(len(ti))[:UNLABELED_CALIBRATION]
                model, var = with_unlabeled(
                    los, xl, data.csi[li], fitted["best_calibration"], data.csi[ti][pick], x0[pick]
                )
                whitened_u, _ = whiten(model, data.csi[li], var)
                table_u = jax.block_until_ready(coherent_table(whitened_u, grid))
                fitted["best_unlabeled"] = (model, var, table_u, fit_s + time.perf_counter() - t0)
            if method == "best_unlabeled":
                model, var, table, fit_s = fitted["best_unlabeled"]
                whitened, h_located = whiten(model, data.csi[ti], var)
            if method == "best_field" and "best_field" not in fitted:
                t0 = time.perf_counter()
                field = fit_residual_field(whitened, xl, np.angle(y_labeled))
                field_table = jax.block_until_ready(coherent_table(field, grid))
                fitted["best_field"] = (field, field_table, fit_s + time.perf_counter() - t0)
            if method == "best_self_trained":
                t0 = time.perf_counter()
                y_pool = whiten(model, data.csi[pool], var)[1] - constants if half else y_located
                field = self_train_field(
                    whitened,
                    grid,
                    xl,
                    np.angle(y_labeled),
                    np.angle(y_pool),
                    data.cycles[pool],
                    amplitudes=np.abs(y_pool),
                ).model
                field_table = jax.block_until_ready(coherent_table(field, grid))
                fitted[method] = (field, field_table, fit_s + time.perf_counter() - t0)
        elif method == "self_trained" or (method in LOBE_METHODS and "self_trained" not in fitted):
            # the unlabeled snapshots' phases, amplitudes and times only: never their positions
            t0 = time.perf_counter()
            model = self_train_field(
                los, grid, xl, rl, data.phases[pool], data.cycles[pool], amplitudes=amps[pool]
            ).model
            table = jax.block_until_ready(coherent_table(model, grid))
            fitted["self_trained"] = (model, table, fit_s + time.perf_counter() - t0)
        if method in ("self_trained", *LOBE_METHODS):
            model, table, fit_s = fitted["self_trained"]
            amplitudes = amps[ti]
        if method == "knn":
            xe, t = timed(knn_locate, xl, rl, rt)
            fit_s = 0.0
        elif method in (*COMPLEX_METHODS, "best_unlabeled"):
            res, t = timed(complex_search, whitened, grid, h_located, table=table)
            xe = res.x
        elif method in ("best_field", "best_self_trained"):
            model, field_table, fit_s = fitted[method]
            search = (model, grid, np.angle(y_located), np.abs(y_located))
            res, t = timed(coherent_search, *search, table=field_table)
            xe = res.x
        elif method == "best_trajectory":
            labeled = (xl, data.cycles[li])
            y = y_located
            args = (whitened, grid, table, np.angle(y), np.abs(y), data.cycles[ti], area, labeled)
            xe, t = timed(choose_lobe, *args)
        elif method in LOBE_METHODS:
            truth = xt if method == "lobe_oracle" else None
            labeled = (xl, data.cycles[li])  # the path's anchors
            args = (model, grid, table, rt, amplitudes, data.cycles[ti], area, labeled, truth)
            xe, t = timed(choose_lobe, *args)
        else:
            # the grid stage tabulated once (offline, counted in fit_s), then searched
            if method != "self_trained":
                t0 = time.perf_counter()
                table = jax.block_until_ready(coherent_table(model, grid))
                fit_s += time.perf_counter() - t0
            res, t = timed(coherent_search, model, grid, rt, amplitudes, table=table)
            xe = res.x
        err = np.linalg.norm((np.asarray(xe) - xt)[:, :2], axis=1)
        errors[method] = err
        fresh = err[~held]  # scored against measured labels only (not held frames)
        residual = None
        if model is not None:
            residual = np.angle(np.asarray(residual_phasors(model, xt, rt)))
            if method not in LOBE_METHODS:  # self_trained's: its residuals are plotted once
                extras[method] = residual
        rows.append(
            {
                "experiment": data.experiment,
                "method": method,
                "kind": method,
                "num_labeled": int(num_labeled),
                "seed": int(seed),
                "num_located": int(len(ti)),
                "self_training_pool": "other_half" if half else "located",
                "label_draw": "distinct_spots" if distinct else "random",
                "median_m": float(np.median(err)),
                "p90_m": float(np.percentile(err, 90)),
                "p99_m": float(np.percentile(err, 99)),
                "max_m": float(err.max()),
                "num_held_located": int(held.sum()),
                "median_unheld_m": float(np.median(fresh)),
                "p90_unheld_m": float(np.percentile(fresh, 90)),
                # RMS of the CPO-free held-out residual at the true positions, rad
                "residual_rms_rad": (
                    None if residual is None else float(np.sqrt(np.mean(residual**2)))
                ),
                "ms_per_snapshot": 1e3 * t / len(ti),
                "fit_s": float(fit_s),
            }
        )
    peb = np.asarray(jax.vmap(lambda x: bounds.peb(x, los))(xt))
    std, pairs = revisit_std(data)
    c_held, c_still = held_coherence(data)
    floor = {
        "num_held_labels": int(data.held_labels.sum()),
        "held_coherence_min": float(c_held.min()) if len(c_held) else None,
        "held_coherence_median": float(np.median(c_held)) if len(c_held) else None,
        "held_coherence_max": float(c_held.max()) if len(c_held) else None,
        "still_coherence_p1": float(np.percentile(c_still, 1)) if len(c_still) else None,
        "experiment": data.experiment,
        "num_labeled": int(num_labeled),
        "mean_peb_still_m": float(np.mean(peb)),
        "still_std_rad": STILL_STD,
        "revisit_std_rad": std,
        "revisit_pairs": pairs,
        "mean_peb_revisit_m": float(np.mean(peb) * std / STILL_STD),
    }
    return rows, floor, {"errors": errors, "residuals": extras, "x": xt, "located": ti}


def plot(plt, detail, path):
    exps = sorted(detail)
    fig, axes = plt.subplots(3, len(exps), figsize=(5 * len(exps), 12), squeeze=False)
    for c, e in enumerate(exps):
        d = detail[e]
        ax = axes[0, c]
        for m, err in d["errors"].items():
            label = f"{m} (uses the truth)" if m == "lobe_oracle" else m
            ax.plot(np.sort(err) * 100, np.linspace(0, 1, len(err)), label=label)
        ax.set(xscale="log", xlabel="error (cm)", ylabel="CDF", title=f"{e}: held-out snapshots")
        ax = axes[1, c]
        for k, (m, res) in enumerate(d["residuals"].items()):
            rms = np.sqrt(np.mean(res**2, axis=0))
            ax.bar(np.arange(len(rms)) + 0.2 * k, rms, width=0.2, label=m)
        ax.set(xlabel="antenna", ylabel="held-out residual RMS (rad)")
        ax = axes[2, c]
        shown = MAPPED if MAPPED in d["errors"] else "best"
        sc = ax.scatter(d["x"][:, 0], d["x"][:, 1], c=np.log10(d["errors"][shown] * 100), s=12)
        fig.colorbar(sc, ax=ax, label=f"log10 error of {shown} (cm)")
        ax.set(
            xlabel="x (m)", ylabel="y (m)", aspect="equal", title=f"{shown}: error over the patch"
        )
    save_figure(fig, path)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=pathlib.Path, default=DEFAULT_DATA)
    ap.add_argument("--num-labeled", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--learning-curve", action="store_true", help="L in 20, 50, 100, 200")
    ap.add_argument("--search-3d", action="store_true", help="also search the height (+-5 cm)")
    ap.add_argument(
        "--unlabeled-half",
        action="store_true",
        help="self_trained self-trains on every other held-out snapshot; all are scored on the rest",
    )
    ap.add_argument(
        "--distinct-labels",
        action="store_true",
        help="draw the labels among distinct spots (2 cm apart), not among snapshots",
    )
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--experiments", default=None, help="comma-separated ids (default: all)")
    ap.add_argument("--resume", action="store_true", help="keep the rows already in --json")
    ap.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/real_techtile"))
    ap.add_argument("--json", type=pathlib.Path, default=None, help="default OUT.json")
    args = ap.parse_args(argv)
    methods = tuple(m for m in args.methods.split(",") if m)
    unknown = set(methods) - set(METHODS) - set(OPTIONAL_METHODS)
    if unknown:
        ap.error(f"--methods must be among {METHODS + OPTIONAL_METHODS}, got {sorted(unknown)}")
    experiments = list_experiments(args.data)
    if args.experiments:
        wanted = args.experiments.split(",")
        missing = sorted(set(wanted) - set(experiments))
        if missing:
            ap.error(f"--experiments {missing} not in {args.data} (found {experiments})")
        experiments = wanted
    if not experiments:
        ap.error(f"no csi_*.nc file in {args.data}")
    json_path = args.json or args.out.with_suffix(".json")
    sizes = (20, 50, 100, 200) if args.learning_curve else (args.num_labeled,)
    result = {"rows": [], "noise_floor": [], "settings": vars(args) | {"methods": methods}}
    result["settings"] = {k: str(v) for k, v in result["settings"].items()}
    if args.resume and json_path.exists():
        old = read_rows(json_path)
        # the rows of another request (seed, label draw, methods, ...) are not this one's
        changed = [
            k for k in RESUME_KEYS if old.get("settings", {}).get(k) != result["settings"][k]
        ]
        if changed:
            ap.error(
                f"--resume: {json_path} holds rows of another request ({', '.join(changed)} "
                "differ); pass another --json or leave out --resume"
            )
        result["rows"], result["noise_floor"] = old["rows"], old["noise_floor"]
    done = {(r["experiment"], r["num_labeled"]) for r in result["noise_floor"]}
    detail = {}
    jobs = [(e, n) for e in experiments for n in sizes]
    data = {e: load_techtile(args.data, e) for e in experiments}
    for e, n in tqdm(jobs, desc="experiments x L"):
        if (e, n) in done:
            continue
        if n >= data[e].num_snapshots:
            print(f"skip {e} L = {n}: only {data[e].num_snapshots} snapshots")
            continue
        rows, floor, det = run_experiment(
            data[e],
            n,
            args.seed,
            args.search_3d,
            methods,
            args.unlabeled_half,
            args.distinct_labels,
        )
        result["rows"] += rows
        result["noise_floor"].append(floor)
        if n == args.num_labeled or len(sizes) == 1:
            detail[e] = det
        write_json(json_path, result)  # after every job: an interrupted run resumes here
    print(
        f"\n{'experiment':10s} {'L':>4s} {'method':12s} {'median':>8s} {'p90':>8s} "
        f"{'p99':>8s} {'resid':>7s} {'ms/snap':>8s} {'fit s':>6s} {'p90 unheld':>10s}"
    )
    for r in result["rows"]:
        res = "-" if r["residual_rms_rad"] is None else f"{r['residual_rms_rad']:.3f}"
        print(
            f"{r['experiment']:10s} {r['num_labeled']:4d} {r['method']:12s} "
            f"{100 * r['median_m']:6.2f}cm {100 * r['p90_m']:6.2f}cm {100 * r['p99_m']:6.1f}cm "
            f"{res:>7s} {r['ms_per_snapshot']:8.2f} {r['fit_s']:6.2f} "
            f"{100 * r.get('p90_unheld_m', np.nan):8.2f}cm"
        )
    for f in result["noise_floor"]:
        if f.get("num_held_labels"):
            still = f["still_coherence_p1"]
            print(
                f"{f['experiment']}: {f['num_held_labels']} held labels, CSI coherence with the "
                f"snapshot before {f['held_coherence_min']:.2f}-{f['held_coherence_max']:.2f} "
                f"(median {f['held_coherence_median']:.2f}); measured repeats < 2 mm apart: p1 "
                + ("-" if still is None else f"{still:.4f}")
            )
        print(
            f"{f['experiment']} L={f['num_labeled']}: mean PEB {1e3 * f['mean_peb_still_m']:.2f} mm "
            f"at {f['still_std_rad']} rad (still rover); revisit repeatability "
            f"{f['revisit_std_rad']:.2f} rad ({f['revisit_pairs']} pairs) -> "
            f"{1e3 * f['mean_peb_revisit_m']:.1f} mm"
        )
    write_json(json_path, result)
    if detail:  # per located snapshot, for analyses of one's own
        arrays = {f"{e}_x": d["x"] for e, d in detail.items()}
        arrays |= {f"{e}_located": d["located"] for e, d in detail.items()}
        arrays |= {f"{e}_{m}": err for e, d in detail.items() for m, err in d["errors"].items()}
        npz = args.out.with_name(args.out.name + "_errors.npz")
        npz.parent.mkdir(parents=True, exist_ok=True)  # --json may have gone elsewhere
        np.savez(npz, **arrays)
        print(f"wrote {npz}")
    plt = pyplot()
    if plt is not None and detail and ({"best", MAPPED} & set(methods)):
        plot(plt, detail, args.out.with_suffix(".png"))
    return result


if __name__ == "__main__":
    main()
