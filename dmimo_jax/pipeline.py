r"""The offline/online positioning framework of Fig. 1, one function per stage.

Offline (Steps 1-4):

1. :func:`fit_phase_model`: L labeled snapshots -> the shared GP PhaseModel (Sec. III).
2. :func:`make_training_set`: the GP PhaseModel -> a synthetic set on disk (Sec. III-C).
3. :func:`train_estimator`: the synthetic set -> POPT (or the MLP / HI benchmarks) (Sec. IV).
4. :func:`search_radius`: the trained estimator's validation errors -> the safeguard radius.

Online (for every snapshot, batched):

1. :func:`coarse_estimate`: the learned estimator's position (float32 network, returned
   as float64).
2. :func:`window_search` (the safeguard): the LS cost of eq. (17) on a :math:`\lambda/4`
   grid in a cube of half-width ``radius`` around the coarse estimate, with the tabulated
   GP mean (:class:`~dmimo_jax.gp.TabulatedGPModel`); the ``num_starts`` best points start
   Levenberg-Marquardt refinements under the same cheap model; the best wins. Refinement
   alone converges to the nearest local minimum of a cost that repeats every ~lambda/2;
   the window keeps the estimate in the right basin whenever the coarse error is below
   the radius.
3. :func:`~dmimo_jax.estimators.refine_batch` with the exact GP PhaseModel (eq. 27 in
   place of the analytic model): the fine estimate.

:func:`locate` runs the three online steps.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import weakref
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax import gp
from dmimo_jax._checks import check_phases
from dmimo_jax.estimators import hyperbola
from dmimo_jax.estimators.grid import PhasorTable, coarse_to_fine, phasor_table, search_grid
from dmimo_jax.estimators.mle import _refine_batch, compressed_residuals
from dmimo_jax.learning.data import load_dataset, write_dataset
from dmimo_jax.learning.mlp import AmbiguityClassifier, MLPConfig, MLPRegressor
from dmimo_jax.learning.nets import inference_fn
from dmimo_jax.learning.popt import POPT, POPTConfig
from dmimo_jax.learning.train import PRESETS, TrainConfig, load_model, save_model, train
from dmimo_jax.scene import Scene

__all__ = [
    "HIEstimator",
    "Offline",
    "run_offline",
    "OnlineResult",
    "coarse_estimate",
    "fit_phase_model",
    "locate",
    "make_training_set",
    "search_radius",
    "train_estimator",
    "window_search",
]


# ----------------------------------------------------------------------------- offline


def fit_phase_model(
    x: ArrayLike, r: ArrayLike, noise_var: ArrayLike, scene: Scene, **fit_kwargs: Any
) -> gp.GPPhaseModel:
    """Step 1: fit the shared GP on L labeled snapshots (eqs. 23-24) and condition it (eq. 25).

    ``scene`` supplies the geometry and wavelength only; its permittivity is not used.
    """
    result = gp.fit(x, r, noise_var, scene, **fit_kwargs)
    return gp.GPPhaseModel.from_fit(result, x, r, noise_var, scene)


def make_training_set(
    path: str | pathlib.Path,
    key: Array,
    model: Any,
    num: int,
    *,
    chunk_size: int = 8192,
    progress: bool = True,
):
    """Step 2: write ``num`` synthetic snapshots of ``model`` to ``path`` (resumable) and
    return them as memory-mapped arrays (``.x``, ``.r``, ``.cpo``)."""
    write_dataset(path, key, model, num, chunk_size=chunk_size, progress=progress)
    return load_dataset(path)


def train_estimator(
    kind: str,
    data: Any,
    scene: Scene,
    *,
    preset: str = "cpu",
    config: TrainConfig | None = None,
    network: POPTConfig | MLPConfig | None = None,
    checkpoint_dir: str | pathlib.Path | None = None,
    seed: int = 0,
    progress: bool = True,
):
    """Step 3: build and train ``kind`` in ``{"popt", "mlp", "hi"}`` on ``data``.

    ``preset`` picks POPT's network and the loop settings (:data:`~dmimo_jax.learning.train.PRESETS`);
    ``config`` / ``network`` override them. Returns the :class:`~dmimo_jax.learning.train.TrainResult`.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    p = PRESETS[preset]
    config = config or p.train
    rngs = nnx.Rngs(seed)
    low, high = scene.ue_low, scene.ue_high
    if kind == "popt":
        net = POPT(scene.num_aps, network or p.popt, low=low, high=high, rngs=rngs)
    elif kind == "mlp":
        net = MLPRegressor(scene.num_aps, network or MLPConfig(), low=low, high=high, rngs=rngs)
    elif kind == "hi":
        cfg = network or MLPConfig()
        n_max = hyperbola.max_ambiguity(scene.ap_positions, float(scene.wavelength), cfg.reference)
        net = AmbiguityClassifier(
            scene.num_aps,
            cfg,
            ap_positions=scene.ap_positions,
            wavelength=float(scene.wavelength),
            n_max=n_max,
            rngs=rngs,
        )
    else:
        raise ValueError(f"kind must be 'popt', 'mlp' or 'hi', got {kind!r}")
    return train(net, data, config, checkpoint_dir=checkpoint_dir, progress=progress)


class HIEstimator:
    """The HI benchmark's coarse stage: ambiguity classifier + hyperboloid intersection.

    Args:
        classifier: a trained :class:`~dmimo_jax.learning.mlp.AmbiguityClassifier`.
        scene: gives the UE region (the solver's starts).
    """

    def __init__(self, classifier: AmbiguityClassifier, scene: Scene):
        self.classifier = classifier
        self.num_aps = classifier.num_aps
        self.starts = hyperbola.default_starts(scene.ue_low, scene.ue_high)
        self.low, self.high = jnp.asarray(scene.ue_low), jnp.asarray(scene.ue_high)

    def __call__(self, r: ArrayLike) -> Array:
        """Positions (B, 3), projected onto the UE region: with wrong integers the
        hyperboloids need not meet, and the unconstrained least-squares point can lie
        kilometres away (measured: a coarse RMSE of 1.6e7 m over 1280 UEs unprojected)."""
        r = jnp.asarray(r)
        n = self.classifier.predict(r)
        ap = jnp.asarray(self.classifier.ap_positions[...], self.starts.dtype)
        x = hyperbola.estimate(
            r,
            n,
            ap,
            self.classifier.wavelength,
            self.starts,
            reference=self.classifier.config.reference,
        )
        return jnp.clip(x, self.low[None, :], self.high[None, :])


_JITTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def coarse_estimate(estimator: Any, r: ArrayLike) -> Array:
    """Online step 1: (B, 3) float64 positions from a trained estimator (POPT, MLP or HI).

    A Flax network is run through :func:`~dmimo_jax.learning.nets.inference_fn` (jitted
    once per network object, weights as constants).
    """
    r = jnp.asarray(r)
    r = r[None, :] if r.ndim == 1 else r
    num_aps = getattr(estimator, "num_aps", None)
    if num_aps is not None:
        check_phases("r", r, num_aps, batched=True)
    fn = estimator
    if isinstance(estimator, nnx.Module):
        fn = _JITTED.get(estimator)
        if fn is None:
            fn = _JITTED[estimator] = inference_fn(estimator)
        r = r.astype(jnp.float32)
    return jnp.asarray(fn(r), jnp.float64 if jax.config.jax_enable_x64 else jnp.float32)


def search_radius(
    estimator: Any,
    r: ArrayLike,
    x: ArrayLike,
    *,
    quantile: float = 1.0,
    factor: float = 1.5,
    minimum: float = 0.1,
) -> float:
    """Step 4: the safeguard radius from held-out errors: ``factor`` x their ``quantile``.

    With the default (1.5 x the largest validation error, at least 10 cm) the window
    covers every coarse error seen in validation with margin.
    """
    err = np.linalg.norm(np.asarray(coarse_estimate(estimator, r)) - np.asarray(x), axis=-1)
    return float(max(minimum, factor * np.quantile(err, quantile)))


class Offline(NamedTuple):
    """Everything the online stage needs, from :func:`run_offline`."""

    model: gp.GPPhaseModel  # the exact GP PhaseModel (fine refinement)
    screen: gp.TabulatedGPModel  # its tabulated mean (safeguard)
    table: PhasorTable  # lambda/4 phasor table of ``screen`` over the UE region (wide windows)
    estimators: dict  # kind -> coarse estimator (POPT / MLP network, HIEstimator)
    radii: dict  # kind -> safeguard radius, m
    info: dict  # kind -> training record (history, seconds, samples/s, validation RMSE)
    cache: pathlib.Path  # the folder of this configuration


def _config_key(scene: Scene, x: Array, r: Array, config: dict) -> str:
    h = hashlib.sha256()
    h.update(json.dumps(config, sort_keys=True).encode())
    for a in (scene.ap_positions, scene.wavelength, x, r):
        h.update(np.ascontiguousarray(np.asarray(a, np.float64)).tobytes())
    return h.hexdigest()[:16]


def run_offline(
    x: ArrayLike,
    r: ArrayLike,
    noise_var: ArrayLike,
    scene: Scene,
    *,
    kinds: tuple[str, ...] = ("popt",),
    preset: str = "cpu",
    num_samples: int | None = None,
    cache_dir: str | pathlib.Path = "cache",
    seed: int = 0,
    progress: bool = True,
) -> Offline:
    """Steps 1-4 for the estimators ``kinds``, cached by a key of their configuration.

    The cache folder ``cache_dir/<key>`` (the key hashes the training snapshots, the scene
    geometry, the preset, the sample count and the seed) holds the synthetic set and one
    folder per estimator with its orbax checkpoints and final model. A finished model is
    loaded instead of retrained; an interrupted synthesis or training resumes.

    Args:
        x, r, noise_var: the L labeled snapshots (positions, wrapped phases, noise variances).
        scene: geometry and wavelength (its permittivity is not used).
        kinds: estimators to train, from ``{"popt", "mlp", "hi"}``.
        preset: ``"cpu"`` or ``"paper"`` (:data:`~dmimo_jax.learning.train.PRESETS`).
        num_samples: synthetic set size (default: the preset's).
        cache_dir: root of the cache.
        seed: seeds the synthetic set and the initializations.
        progress: tqdm bars.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    for kind in kinds:
        if kind not in ("popt", "mlp", "hi"):
            raise ValueError(f"kinds must be from ('popt', 'mlp', 'hi'), got {kind!r}")
    p = PRESETS[preset]
    num = p.num_samples if num_samples is None else int(num_samples)
    x, r = jnp.asarray(x), jnp.asarray(r)
    model = fit_phase_model(x, r, noise_var, scene)
    screen = gp.TabulatedGPModel.from_model(model)
    table = phasor_table(screen, search_grid(scene, float(scene.wavelength) / 4, region="ue"))
    config = dict(
        preset=preset,
        num_samples=num,
        seed=seed,
        train=dataclasses.asdict(p.train),
        popt=dataclasses.asdict(p.popt),
    )
    folder = pathlib.Path(cache_dir) / _config_key(scene, x, r, config)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    data = make_training_set(folder / "data", jax.random.key(seed), model, num, progress=progress)
    n_val = max(1, int(round(p.train.val_fraction * num)))
    val = slice(num - min(n_val, 4096), num)
    estimators, radii, info = {}, {}, {}
    for kind in kinds:
        out = folder / kind / "model"
        if (out / "spec.json").is_file():
            net, meta = load_model(out)
        else:
            res = train_estimator(
                kind,
                data,
                scene,
                preset=preset,
                checkpoint_dir=folder / kind / "ckpt",
                seed=seed,
                progress=progress,
            )
            net = res.model
            meta = dict(
                history=res.history, seconds=res.seconds, samples_per_second=res.samples_per_second
            )
            est = HIEstimator(net, scene) if kind == "hi" else net
            xv, rv = np.asarray(data.x[val]), np.asarray(data.r[val])
            err = np.linalg.norm(np.asarray(coarse_estimate(est, rv)) - xv, axis=-1)
            meta.update(
                radius=search_radius(est, rv, xv),
                val_rmse_m=float(np.sqrt(np.mean(err**2))),
                val_max_m=float(err.max()),
            )
            save_model(out, net, meta=meta)
        estimators[kind] = HIEstimator(net, scene) if kind == "hi" else net
        radii[kind] = float(meta["radius"])
        info[kind] = meta
    return Offline(model, screen, table, estimators, radii, info, folder)


# ----------------------------------------------------------------------------- online


class OnlineResult(NamedTuple):
    coarse: Array  # (B, 3) learned estimate
    screened: Array  # (B, 3) best point of the safeguard window (after its cheap refinement)
    fine: Array  # (B, 3) refined with the exact phase model
    cost: Array  # (B,) ML cost (eq. 17) at the fine estimate
    cpo: Array  # (B,) CPO estimate at the fine estimate


def _window_offsets(radius: float, spacing: float) -> np.ndarray:
    n = int(np.ceil(radius / spacing))
    axis = np.arange(-n, n + 1) * spacing
    return np.stack(np.meshgrid(axis, axis, axis, indexing="ij"), axis=-1).reshape(-1, 3)


def window_search(
    r: ArrayLike,
    model: Any,
    x_coarse: ArrayLike,
    *,
    radius: float,
    spacing: float | None = None,
    num_starts: int = 8,
    num_steps: int = 15,
    region: tuple[ArrayLike, ArrayLike] | None = None,
    table: PhasorTable | None = None,
) -> Array:
    """Online step 2, the safeguard: best LS point near each coarse estimate (B, 3).

    When a ``table`` of ``model`` is given and the window would hold more than 1/16 of
    the table's points, the window is the whole table: the search becomes the
    hierarchical search :func:`~dmimo_jax.estimators.coarse_to_fine` (coherence screen of
    the table, then the same multi-start refinement), which costs a few ms per snapshot
    whatever the radius. A coarse estimator that is no better than the region's size then
    adds nothing, and the result says so through the radius it was given.

    Args:
        r: (B, M) wrapped phases.
        model: a cheap PhaseModel (e.g. :class:`~dmimo_jax.gp.TabulatedGPModel`).
        x_coarse: (B, 3) coarse estimates.
        radius: half-width of the window cube, m.
        spacing: window grid spacing (default lambda / 4 of the model's scene).
        num_starts: window points that start a Levenberg-Marquardt refinement.
        num_steps: LM steps per start.
        region: (low, high) box the window is clipped to (default the scene's UE region
            widened by 0.25 m).
        table: optional :class:`~dmimo_jax.estimators.PhasorTable` of ``model`` (see above).
    """
    scene = model.scene
    r = jnp.asarray(r)
    r = r[None, :] if r.ndim == 1 else r
    check_phases("r", r, model.num_aps, batched=True)
    x_coarse = jnp.asarray(x_coarse, r.dtype).reshape(-1, 3)
    if not bool(jnp.all(jnp.isfinite(x_coarse))):
        raise ValueError("x_coarse contains non-finite positions")
    if x_coarse.shape[0] != r.shape[0]:
        raise ValueError(
            f"x_coarse must have {r.shape[0]} rows to match r, got {x_coarse.shape[0]}"
        )
    spacing = float(scene.wavelength) / 4 if spacing is None else float(spacing)
    if not (radius > 0 and spacing > 0):
        raise ValueError(f"radius and spacing must be > 0, got {radius}, {spacing}")
    if region is None:
        low, high = jnp.asarray(scene.ue_low) - 0.25, jnp.asarray(scene.ue_high) + 0.25
    else:
        low, high = (jnp.asarray(v, r.dtype) for v in region)
    # a window wider than the region adds nothing: cap the radius at the region's extent
    radius = min(float(radius), float(jnp.max(high - low)))
    count = (2 * int(np.ceil(radius / spacing)) + 1) ** 3
    if not (isinstance(num_starts, int) and 1 <= num_starts <= count):
        raise ValueError(f"num_starts must be an int in [1, {count}], got {num_starts!r}")
    # the table's coherence screen costs ~1/30 of a direct model evaluation per point
    # (measured): past 1/16 of the table's size, screening all of it is the cheaper window
    if table is not None and 16 * count >= table.grid.size:
        return coarse_to_fine(r, model, table, num_starts=num_starts, num_steps=num_steps).x
    if count > 2_000_000:
        raise ValueError(
            f"radius={radius:.3g} m at spacing {spacing:.3g} m is a {count}-point window per "
            "snapshot; pass table= (a PhasorTable of the model) for wide windows"
        )
    offsets = jnp.asarray(_window_offsets(radius, spacing), r.dtype)
    return _window_search(r, model, x_coarse, offsets, low, high, num_starts, num_steps)


@partial(jax.jit, static_argnums=(6, 7))
def _window_search(r, model, x_coarse, offsets, low, high, k, num_steps):
    def one(args):
        ri, xi = args
        centre = jnp.clip(xi, low, high)  # a coarse estimate may lie outside the region
        pts = jnp.clip(centre[None, :] + offsets, low[None, :], high[None, :])
        cost = jax.vmap(lambda p: jnp.sum(compressed_residuals(ri, model.mean(p)) ** 2))(pts)
        _, idx = jax.lax.top_k(-cost, k)
        fine = _refine_batch(
            pts[idx], jnp.broadcast_to(ri, (k, ri.shape[0])), model, num_steps, 1e-3
        )
        c = jnp.where(jnp.isfinite(fine.cost), fine.cost, jnp.inf)
        return fine.x[jnp.argmin(c)]

    return jax.lax.map(one, (r, x_coarse))


def locate(
    r: ArrayLike,
    estimator: Any,
    model: Any,
    *,
    screen: Any | None = None,
    radius: float = 0.5,
    spacing: float | None = None,
    num_starts: int = 8,
    refine_steps: int = 15,
    table: PhasorTable | None = None,
) -> OnlineResult:
    """The online stage: coarse estimate -> safeguard window -> refinement with ``model``.

    Args:
        r: (M,) or (B, M) wrapped phases.
        estimator: trained POPT / MLP / :class:`HIEstimator` (anything r -> positions).
        model: the exact PhaseModel for the fine estimate (the GP model; or the analytic
            model for a matched-model study).
        screen: the cheap model of the window search (default: the tabulated ``model`` when
            it is a :class:`~dmimo_jax.gp.GPPhaseModel`, else ``model`` itself).
        radius, spacing, num_starts: the window (:func:`window_search`).
        refine_steps: LM steps of the final refinement.
        table: a :class:`~dmimo_jax.estimators.PhasorTable` of ``screen`` for wide windows.
    """
    r = jnp.asarray(r)
    r = r[None, :] if r.ndim == 1 else r
    if screen is None:
        screen = (
            gp.TabulatedGPModel.from_model(model) if isinstance(model, gp.GPPhaseModel) else model
        )
    x0 = coarse_estimate(estimator, r)
    r = r.astype(x0.dtype)
    xs = window_search(
        r, screen, x0, radius=radius, spacing=spacing, num_starts=num_starts, table=table
    )
    fine = _refine_batch(xs, r, model, refine_steps, 1e-3)
    return OnlineResult(x0, xs, fine.x, fine.cost, fine.cpo)
