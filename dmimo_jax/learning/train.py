r"""One training loop for every learned estimator (Sec. VI-A): AdamW, one-cycle, checkpoints.

:func:`train` fits any network of :mod:`dmimo_jax.learning` (POPT, the MLP benchmark, the
HI ambiguity classifier) on a synthetic dataset (in memory or streamed from disk by
:func:`~dmimo_jax.learning.load_dataset`):

* optax ``adamw`` with ``cosine_onecycle_schedule`` (peak 1e-3), minibatch 500, the
  model's own loss (MAE on standardized positions; cross-entropy for the classifier);
* the last ``val_fraction`` of the samples are held out; each epoch reports the training
  loss and the validation error (tqdm bar, and the returned history);
* data-parallel over ``devices`` (default: all local devices): minibatches are sharded
  along the batch axis with ``jax.sharding``, parameters replicated;
* with ``checkpoint_dir``, an orbax checkpoint after every epoch; a run that is killed
  restarts from its last finished epoch and ends with the same parameters as an
  uninterrupted run (the data order and dropout keys are functions of the seed, epoch
  and step only).

The loop knows no network class: it needs ``loss`` and ``error`` only. Model files are
:mod:`dmimo_jax.learning.io`; presets :mod:`dmimo_jax.learning.presets`. Wall-clock
timings are the caller's (``on_epoch_end`` is called after every epoch).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

__all__ = ["TrainConfig", "TrainResult", "train"]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimizer and loop settings (defaults: the paper's, Sec. VI-A)."""

    epochs: int = 120
    batch_size: int = 500
    peak_lr: float = 1e-3
    weight_decay: float = 1e-4
    pct_start: float = 0.3
    val_fraction: float = 0.125 / 1.125
    seed: int = 0

    def __post_init__(self):
        for name in ("epochs", "batch_size"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not 0.0 < self.val_fraction < 1.0:  # False for NaN too
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction}")
        if not (math.isfinite(self.peak_lr) and self.peak_lr > 0):
            raise ValueError(f"peak_lr must be finite and > 0, got {self.peak_lr}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be finite and >= 0, got {self.weight_decay}")
        if not 0.0 < self.pct_start < 1.0:
            raise ValueError(f"pct_start must be in (0, 1), got {self.pct_start}")


class TrainResult(NamedTuple):
    model: nnx.Module  # trained (updated in place and returned)
    history: list[dict]  # one row per epoch: epoch, loss, val_loss, val_error, lr


def _as_arrays(data: Any) -> tuple[Any, Any]:
    x, r = getattr(data, "x", None), getattr(data, "r", None)
    if x is None or r is None:
        raise ValueError("data must have .x (N, 3) positions and .r (N, M) phases")
    if x.ndim != 2 or x.shape[1] != 3 or r.ndim != 2 or r.shape[0] != x.shape[0]:
        raise ValueError(f"data.x must be (N, 3) and data.r (N, M), got {x.shape}, {r.shape}")
    # the jitted step cannot check its inputs: a NaN would silently turn every weight NaN
    for name, a in (("data.x", x), ("data.r", r)):
        for s in range(0, a.shape[0], 1 << 16):
            block = np.asarray(a[s : s + (1 << 16)])
            if not np.all(np.isfinite(block)):
                row = s + int(np.argwhere(~np.isfinite(block))[0, 0])
                raise ValueError(f"{name} has non-finite entries (first at row {row})")
    return x, r


def _batches(perm: np.ndarray, batch: int) -> list[np.ndarray]:
    n = len(perm) // batch
    return [np.sort(perm[i * batch : (i + 1) * batch]) for i in range(n)]


def _checkpointer(directory: pathlib.Path):
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(max_to_keep=2, create=True)
    return ocp.CheckpointManager(directory.absolute(), options=options)


def train(
    model: nnx.Module,
    data: Any,
    config: TrainConfig = TrainConfig(),
    *,
    checkpoint_dir: str | pathlib.Path | None = None,
    devices: list | None = None,
    progress: bool = True,
    on_epoch_end: Callable[[int, dict], None] | None = None,
) -> TrainResult:
    """Train ``model`` (in place) on ``data`` (``.x`` (N, 3), ``.r`` (N, M); memmaps fine).

    Args:
        model: a network of :mod:`dmimo_jax.learning` (it provides ``loss`` and ``error``).
        data: e.g. a :class:`~dmimo_jax.learning.SyntheticBatch` or ``load_dataset(path)``.
        config: :class:`TrainConfig`.
        checkpoint_dir: where to keep per-epoch checkpoints and resume from.
        devices: devices for data parallelism (default ``jax.devices()``).
        progress: show a tqdm bar.
        on_epoch_end: called as ``fn(epoch, row)`` after each epoch's checkpoint (a
            benchmark times epochs with it).

    Raises:
        ValueError: malformed data, too few samples for one minibatch, a batch size that
            does not split across the devices, or a checkpoint of another model.
    """
    x_all, r_all = _as_arrays(data)
    n = x_all.shape[0]
    n_val = max(1, int(round(config.val_fraction * n)))
    n_tr = n - n_val
    if n_tr < config.batch_size:
        raise ValueError(
            f"data has {n_tr} training samples after the validation split; "
            f"batch_size={config.batch_size} needs at least that many"
        )
    devices = list(devices or jax.devices())
    if config.batch_size % len(devices):
        raise ValueError(
            f"batch_size={config.batch_size} must be divisible by the {len(devices)} devices"
        )
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    batch_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())

    steps_per_epoch = n_tr // config.batch_size
    total = steps_per_epoch * config.epochs
    sched = optax.cosine_onecycle_schedule(total, config.peak_lr, pct_start=config.pct_start)
    lr = lambda count: sched(count).astype(jnp.float32)
    opt = optax.adamw(lr, weight_decay=config.weight_decay)

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = opt.init(params)
    params, opt_state = jax.device_put((params, opt_state), replicated)

    @jax.jit
    def step(params, opt_state, r, x, key):
        def loss_fn(p):
            return nnx.merge(graphdef, p, rest).loss(r, x, key)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def evaluate(params, r, x):
        m = nnx.merge(graphdef, params, rest)
        return m.error(r, x), m.loss(r, x, None)

    def validation(params) -> tuple[float, float]:
        errs, losses, chunk = [], [], 4096
        for s in range(n_tr, n, chunk):
            e = min(s + chunk, n)
            err, loss = evaluate(
                params, np.asarray(r_all[s:e], np.float32), np.asarray(x_all[s:e], np.float32)
            )
            errs.append(np.asarray(err, np.float64))
            losses.append(float(loss) * (e - s))
        err = np.concatenate(errs)
        return float(np.sqrt(np.mean(err**2))), float(np.sum(losses) / n_val)

    history: list[dict] = []
    start_epoch = 0
    manager = None
    if checkpoint_dir is not None:
        import orbax.checkpoint as ocp

        manager = _checkpointer(pathlib.Path(checkpoint_dir))
        latest = manager.latest_step()
        if latest is not None:
            target = {"params": params, "opt_state": opt_state}
            try:
                restored = manager.restore(
                    latest,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardRestore(target), history=ocp.args.JsonRestore()
                    ),
                )
            except Exception as err:  # structure/shape mismatch or unreadable files
                raise ValueError(
                    f"checkpoint_dir={str(checkpoint_dir)!r} holds a checkpoint (epoch {latest + 1}) "
                    f"that does not match this model or is corrupted: {err}"
                ) from err
            params = jax.device_put(restored.state["params"], replicated)
            opt_state = jax.device_put(restored.state["opt_state"], replicated)
            history = list(restored.history["rows"])
            start_epoch = latest + 1

    key = jax.random.key(config.seed)
    bar = tqdm(
        total=total,
        initial=start_epoch * steps_per_epoch,
        disable=not progress,
        desc=f"train {type(model).__name__}",
        unit="step",
    )
    try:
        for epoch in range(start_epoch, config.epochs):
            perm = np.random.default_rng([config.seed, epoch]).permutation(n_tr)
            losses = []
            for i, idx in enumerate(_batches(perm, config.batch_size)):
                g = epoch * steps_per_epoch + i
                rb = jax.device_put(np.asarray(r_all[idx], np.float32), batch_sharding)
                xb = jax.device_put(np.asarray(x_all[idx], np.float32), batch_sharding)
                params, opt_state, loss = step(
                    params, opt_state, rb, xb, jax.random.fold_in(key, g)
                )
                losses.append(loss)
                bar.update(1)
                if i % 50 == 0:
                    bar.set_postfix(epoch=epoch + 1, loss=f"{float(loss):.4f}")
            jax.block_until_ready(params)
            val_error, val_loss = validation(params)
            row = dict(
                epoch=epoch + 1,
                loss=float(np.mean(np.asarray(jax.device_get(losses)))),
                val_loss=val_loss,
                val_error=val_error,
                lr=float(lr((epoch + 1) * steps_per_epoch - 1)),
            )
            history.append(row)
            bar.set_postfix(epoch=epoch + 1, loss=f"{row['loss']:.4f}", val=f"{val_error:.4g}")
            if manager is not None:
                import orbax.checkpoint as ocp

                manager.save(
                    epoch,
                    args=ocp.args.Composite(
                        state=ocp.args.StandardSave({"params": params, "opt_state": opt_state}),
                        history=ocp.args.JsonSave({"rows": history}),
                    ),
                )
                manager.wait_until_finished()
            if on_epoch_end is not None:
                on_epoch_end(epoch, row)
    finally:
        bar.close()
        if manager is not None:
            manager.wait_until_finished()
            manager.close()
    nnx.update(model, jax.device_get(params))
    return TrainResult(model, history)
