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
* ``resident=True`` (default on an accelerator when the training set is at most
  ``RESIDENT_BYTES``) puts the whole set in device memory once and runs each epoch as a few
  jitted ``lax.scan`` calls over its minibatches (the same data order and keys as the host
  loop, so the same parameters to float rounding); otherwise each minibatch travels from
  host memory (on a CPU that is no copy, and one step compiles faster than a scan);
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
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tqdm.auto import tqdm

from dmimo_jax._checks import check_int
from dmimo_jax.learning.io import check_saved_shapes

#: the largest float32 training set (bytes of ``x`` and ``r``) that ``resident=None`` keeps
#: in device memory
RESIDENT_BYTES = 2**31


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
    """Output of :func:`train`: the trained network and one history row per epoch."""

    model: nnx.Module
    """Trained (updated in place and returned)."""
    history: list[dict]
    """One row per epoch: epoch, loss, val_loss, val_error, lr."""


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


def _split_sizes(n: int, config: TrainConfig, devices: list) -> tuple[int, int]:
    """(training, validation) sample counts of ``n``; ``ValueError`` when the training
    part holds no full minibatch or the batch does not split across ``devices``."""
    n_val = max(1, int(round(config.val_fraction * n)))
    n_tr = n - n_val
    if n_tr < config.batch_size:
        raise ValueError(
            f"data has {n_tr} training samples after the validation split; "
            f"batch_size={config.batch_size} needs at least that many"
        )
    if config.batch_size % len(devices):
        raise ValueError(
            f"batch_size={config.batch_size} must be divisible by the {len(devices)} devices"
        )
    return n_tr, n_val


def _optimizer(config: TrainConfig, total_steps: int) -> tuple[Any, Callable]:
    """AdamW on the one-cycle cosine schedule (Sec. VI-A) and the schedule itself."""
    sched = optax.cosine_onecycle_schedule(total_steps, config.peak_lr, pct_start=config.pct_start)
    lr = lambda count: sched(count).astype(jnp.float32)
    return optax.adamw(lr, weight_decay=config.weight_decay), lr


def _step_functions(graphdef: Any, opt: Any) -> tuple[Callable, Callable]:
    """The jitted training step ``(params, rest, opt_state, r, x, key) -> (params, opt_state,
    loss)`` and the jitted evaluation ``(params, rest, r, x) -> (errors, loss)`` of one network
    structure (pure functions of their arguments; ``rest`` is the network's state other than
    its parameters)."""

    @jax.jit
    def step(params, rest, opt_state, r, x, key):
        def loss_fn(p):
            return nnx.merge(graphdef, p, rest).loss(r, x, key)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    @jax.jit
    def evaluate(params, rest, r, x):
        m = nnx.merge(graphdef, params, rest)
        return m.error(r, x), m.loss(r, x, None)

    return step, evaluate


def _scan_steps(step: Callable, rest: Any, key: jax.Array, sharding: Any) -> Callable:
    """Jitted ``(params, opt_state, r_dev, x_dev, idx, g) -> (params, opt_state, losses)``:
    ``step`` over the minibatches ``r_dev[idx[i]]`` of the device-resident set in one
    ``lax.scan``, the dropout key of global step ``g[i]`` folded in as the host loop does."""

    def run(params, opt_state, r_dev, x_dev, idx, g):
        def body(carry, inp):
            i, gi = inp
            rb = jax.lax.with_sharding_constraint(r_dev[i], sharding)
            xb = jax.lax.with_sharding_constraint(x_dev[i], sharding)
            p, o, loss = step(carry[0], rest, carry[1], rb, xb, jax.random.fold_in(key, gi))
            return (p, o), loss

        (params, opt_state), losses = jax.lax.scan(body, (params, opt_state), (idx, g))
        return params, opt_state, losses

    return jax.jit(run)


def _validation(evaluate: Callable, params: Any, x_all: Any, r_all: Any, start: int) -> tuple:
    """(RMS error, mean loss) over the held-out samples ``start:``, in chunks of 4096."""
    n = x_all.shape[0]
    errs, losses, chunk = [], [], 4096
    for s in range(start, n, chunk):
        e = min(s + chunk, n)
        err, loss = evaluate(
            params, np.asarray(r_all[s:e], np.float32), np.asarray(x_all[s:e], np.float32)
        )
        errs.append(np.asarray(err, np.float64))
        losses.append(float(loss) * (e - s))
    err = np.concatenate(errs)
    return float(np.sqrt(np.mean(err**2))), float(np.sum(losses) / (n - start))


def _bar(total: int, initial: int, progress: bool, desc: str) -> Any:
    """The training loop's tqdm bar (quiet when ``progress`` is False or stderr is not a
    terminal)."""
    return tqdm(total=total, initial=initial, disable=None if progress else True, desc=desc,
                unit="step")  # fmt: skip


def _row(epoch: int, loss: float, validation: tuple, lr: Callable, steps_per_epoch: int) -> dict:
    """One history row: the epoch (from 1), its mean training loss, the validation (error,
    loss) and the learning rate of its last step."""
    val_error, val_loss = validation
    last = (epoch + 1) * steps_per_epoch - 1
    return dict(epoch=epoch + 1, loss=loss, val_loss=val_loss, val_error=val_error,
                lr=float(lr(last)))  # fmt: skip


class _Checkpoints:
    """Per-epoch orbax checkpoints of ``{"params", "opt_state"}`` and the history rows."""

    def __init__(self, directory: str | pathlib.Path):
        import orbax.checkpoint as ocp  # imported only when checkpoints are asked for

        self.ocp, self.directory = ocp, str(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=2, create=True)
        self.manager = ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options)

    def restore(self, state: dict) -> tuple[dict, list[dict], int] | None:
        """``(state, history, next_epoch)`` of the latest checkpoint, or None; ``ValueError``
        when it does not match ``state``'s structure or cannot be read."""
        latest = self.manager.latest_step()
        if latest is None:
            return None
        args = self.ocp.args
        saved = pathlib.Path(self.directory).absolute() / str(latest) / "state"
        try:
            with self.ocp.StandardCheckpointer() as ckpt:  # shapes first (see the function)
                check_saved_shapes(ckpt, saved, state)
            restored = self.manager.restore(
                latest,
                args=args.Composite(state=args.StandardRestore(state), history=args.JsonRestore()),
            )
        except Exception as err:  # structure/shape mismatch or unreadable files
            raise ValueError(
                f"checkpoint_dir={self.directory!r} holds a checkpoint (epoch {latest + 1}) "
                f"that does not match this model or is corrupted: {err}"
            ) from err
        return restored.state, list(restored.history["rows"]), latest + 1

    def save(self, epoch: int, state: dict, history: list[dict]) -> None:
        args = self.ocp.args
        self.manager.save(
            epoch,
            args=args.Composite(
                state=args.StandardSave(state), history=args.JsonSave({"rows": history})
            ),
        )
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _resume(directory: Any, state: dict, sharding: Any, history: list) -> tuple:
    """``(checkpoints, state, history, first epoch)``: the checkpoints of ``directory`` (None
    without one) and, when one is there, its state (put with ``sharding``), history and next
    epoch; else ``state``, ``history`` and epoch 0."""
    checkpoints = None if directory is None else _Checkpoints(directory)
    if checkpoints is not None and (found := checkpoints.restore(state)) is not None:
        state, history, start = found
        return checkpoints, jax.device_put(state, sharding), history, start
    return checkpoints, state, history, 0


def train(
    model: nnx.Module,
    data: Any,
    config: TrainConfig = TrainConfig(),
    *,
    checkpoint_dir: str | pathlib.Path | None = None,
    devices: list | None = None,
    progress: bool = True,
    on_epoch_end: Callable[[int, dict], None] | None = None,
    resident: bool | None = None,
    scan_steps: int = 250,
) -> TrainResult:
    """Train ``model`` (in place) on ``data`` (``.x`` (N, 3), ``.r`` (N, M); memmaps fine).

    Args:
        model: a network of :mod:`dmimo_jax.learning` (it provides ``loss`` and ``error``).
        data: e.g. a :class:`~dmimo_jax.learning.SyntheticBatch` or ``load_dataset(path)``.
        config: :class:`TrainConfig`.
        checkpoint_dir: where to keep per-epoch checkpoints and resume from.
        devices: devices for data parallelism (default ``jax.devices()``).
        progress: a tqdm bar (in a terminal; quiet when stderr is not one).
        on_epoch_end: called as ``fn(epoch, row)`` after each epoch's checkpoint (a
            benchmark times epochs with it).
        resident: keep the training samples in device memory and scan over minibatches
            (default: on a GPU or TPU, when ``x`` and ``r`` take at most
            :data:`RESIDENT_BYTES` as float32).
        scan_steps: minibatches per jitted scan call of the resident loop (the progress
            bar moves by this many).

    Raises:
        ValueError: malformed data, too few samples for one minibatch, a batch size that
            does not split across the devices, or a checkpoint of another model.
    """
    x_all, r_all = _as_arrays(data)
    if not (isinstance(scan_steps, int) and scan_steps >= 1):
        raise ValueError(f"scan_steps must be a positive int, got {scan_steps!r}")
    if resident not in (None, True, False):
        raise ValueError(f"resident must be None, True or False, got {resident!r}")
    devices = list(devices or jax.devices())
    n_tr, _ = _split_sizes(x_all.shape[0], config, devices)
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    batch_sharding, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())
    steps_per_epoch = n_tr // config.batch_size
    total = steps_per_epoch * config.epochs
    opt, lr = _optimizer(config, total)

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    state = jax.device_put({"params": params, "opt_state": opt.init(params)}, replicated)
    step, evaluate = _step_functions(graphdef, opt)
    checkpoints, state, history, start_epoch = _resume(checkpoint_dir, state, replicated, [])
    params, opt_state = state["params"], state["opt_state"]

    def put(a: Any, idx: np.ndarray) -> jax.Array:
        return jax.device_put(np.asarray(a[idx], np.float32), batch_sharding)

    key = jax.random.key(config.seed)
    if resident is None:
        fits = 4 * n_tr * (x_all.shape[1] + r_all.shape[1]) <= RESIDENT_BYTES
        resident = fits and devices[0].platform != "cpu"
    if resident:
        r_dev = jax.device_put(np.asarray(r_all[:n_tr], np.float32), replicated)
        x_dev = jax.device_put(np.asarray(x_all[:n_tr], np.float32), replicated)
        scan = _scan_steps(step, rest, key, batch_sharding)
    bar = _bar(total, start_epoch * steps_per_epoch, progress, f"train {type(model).__name__}")
    try:
        for epoch in range(start_epoch, config.epochs):
            perm = np.random.default_rng([config.seed, epoch]).permutation(n_tr)
            losses = []
            batches = _batches(perm, config.batch_size)
            if resident:
                idx_all = np.stack(batches).astype(np.int32)
                for s in range(0, steps_per_epoch, scan_steps):
                    e = min(s + scan_steps, steps_per_epoch)
                    g = np.arange(epoch * steps_per_epoch + s, epoch * steps_per_epoch + e)
                    params, opt_state, loss = scan(
                        params, opt_state, r_dev, x_dev, idx_all[s:e], g.astype(np.int32)
                    )
                    losses.append(loss)
                    bar.update(e - s)
                    bar.set_postfix(epoch=epoch + 1, loss=f"{float(loss[-1]):.4f}")
            else:
                for i, idx in enumerate(batches):
                    g = epoch * steps_per_epoch + i
                    params, opt_state, loss = step(
                        params,
                        rest,
                        opt_state,
                        put(r_all, idx),
                        put(x_all, idx),
                        jax.random.fold_in(key, g),
                    )
                    losses.append(loss[None])
                    bar.update(1)
                    if i % 50 == 0:
                        bar.set_postfix(epoch=epoch + 1, loss=f"{float(loss):.4f}")
            jax.block_until_ready(params)
            validation = _validation(
                lambda p, r, x: evaluate(p, rest, r, x), params, x_all, r_all, n_tr
            )
            loss = float(np.mean(np.concatenate(jax.device_get(losses))))
            row = _row(epoch, loss, validation, lr, steps_per_epoch)
            history.append(row)
            bar.set_postfix(epoch=epoch + 1, loss=f"{loss:.4f}", val=f"{row['val_error']:.4g}")
            if checkpoints is not None:
                checkpoints.save(epoch, {"params": params, "opt_state": opt_state}, history)
            if on_epoch_end is not None:
                on_epoch_end(epoch, row)
    finally:
        bar.close()
        if checkpoints is not None:
            checkpoints.close()
    nnx.update(model, jax.device_get(params))
    return TrainResult(model, history)


def train_many(
    models: Sequence[nnx.Module],
    datas: Sequence[Any],
    config: TrainConfig = TrainConfig(),
    *,
    checkpoint_dir: str | pathlib.Path | None = None,
    devices: list | None = None,
    progress: bool = True,
    on_epoch_end: Callable[[int, list[dict]], None] | None = None,
    vmap_width: int | None = None,
) -> list[TrainResult]:
    """Train G networks of one architecture, each on its own data set of one size, as one
    program: every step is :func:`train`'s step of each network, the network axis sharded
    over ``devices`` (``jax.shard_map``: each device steps G / D of the networks; G is padded
    to a multiple of D with copies of the last network, trained and dropped) and, on each
    device, its networks stepped ``vmap_width`` at a time (``jax.lax.map``: a ``vmap``
    inside a loop). The networks of a tiled building's tiles
    (:func:`~dmimo_jax.pipeline.train_cell_classifiers`) train this way.

    Each network takes the steps :func:`train`'s host loop gives it on its own data (the
    same minibatch order, dropout keys and one-cycle schedule: functions of ``config``'s
    seed, the epoch and the step), so each ends where :func:`train` would, to float32
    rounding (a vmapped product may sum in another order, and Adam's normalized steps carry
    that rounding on). What it buys: one compiled step and one dispatch per step for every
    network, the networks spread over the devices, and on an accelerator G small networks
    that fill it where one leaves it idle.

    Args:
        models: the G networks (one graph: the same class, widths and static attributes;
            updated in place).
        datas: their data sets (``.x`` (N, 3), ``.r`` (N, M); memmaps fine), of one N and M.
        config: :class:`TrainConfig` (one for all).
        checkpoint_dir: one orbax checkpoint of every network per epoch; a killed run
            resumes from its last finished epoch, as :func:`train`'s does.
        devices: the devices the network axis is sharded over (default ``jax.devices()``).
        progress: a tqdm bar.
        on_epoch_end: called as ``fn(epoch, rows)`` (a history row per network) after each
            epoch's checkpoint.
        vmap_width: how many of a device's networks step at once (``jax.lax.map``'s
            ``batch_size``: a ``vmap`` of that many inside a loop over the rest). Default:
            all of them on an accelerator; 1 on a CPU, where XLA's batched matrix
            products run slower per network than one network's (docs/locality_measurements.md).

    Returns:
        One :class:`TrainResult` per network, in order.

    Raises:
        ValueError: no networks, ``datas`` of another length or of other sizes, networks
            of different graphs, malformed data, a checkpoint of other networks.
    """
    models, datas = list(models), list(datas)
    if vmap_width is not None:
        check_int("vmap_width", vmap_width, minimum=1)
    if not models or len(datas) != len(models):
        raise ValueError(
            f"models and datas must be non-empty and of one length, got {len(models)} and "
            f"{len(datas)}"
        )
    arrays = [_as_arrays(d) for d in datas]
    n, m = arrays[0][0].shape[0], arrays[0][1].shape[1]
    for i, (x, r) in enumerate(arrays):
        if x.shape[0] != n or r.shape[1] != m:
            raise ValueError(
                f"datas must be of one size: datas[0] has {n} samples of {m} APs, datas[{i}] "
                f"{x.shape[0]} of {r.shape[1]}"
            )
    splits = [nnx.split(model, nnx.Param, ...) for model in models]
    graphdef = splits[0][0]
    for i, (g, _, _) in enumerate(splits):
        if g != graphdef:
            raise ValueError(
                f"models must share one graph (class, widths, static attributes): models[{i}] "
                "differs from models[0]"
            )
    devices = list(devices or jax.devices())
    n_tr, _ = _split_sizes(n, config, devices[:1])
    count = len(models)
    slots = list(range(count)) + [count - 1] * (-count % len(devices))  # padded to D's multiple
    steps_per_epoch = n_tr // config.batch_size
    total = steps_per_epoch * config.epochs
    opt, lr = _optimizer(config, total)
    step, evaluate = _step_functions(graphdef, opt)
    mesh = jax.sharding.Mesh(np.array(devices), ("net",))
    sharded = NamedSharding(mesh, P("net"))
    local = len(slots) // len(devices)
    if vmap_width is None:
        vmap_width = 1 if devices[0].platform == "cpu" else local

    def device_step(params, rests, opt_state, r, x, key):  # a device's networks
        def one(a):
            return step(*a, key)

        return jax.lax.map(one, (params, rests, opt_state, r, x), batch_size=min(vmap_width, local))

    spec = P("net")
    vstep = jax.jit(
        jax.shard_map(device_step, mesh=mesh, in_specs=(spec,) * 5 + (P(),), out_specs=spec,
                      check_vma=False)
    )  # fmt: skip

    def stacked(trees: list) -> Any:
        return jax.tree.map(lambda *a: np.stack([np.asarray(v) for v in a]), *trees)

    params = stacked([splits[i][1] for i in slots])
    rests = jax.device_put(stacked([splits[i][2] for i in slots]), sharded)
    state = {"params": params, "opt_state": jax.vmap(opt.init)(params)}
    state = jax.device_put(state, sharded)
    empty: list[list[dict]] = [[] for _ in range(count)]
    checkpoints, state, histories, start_epoch = _resume(checkpoint_dir, state, sharded, empty)
    params, opt_state = state["params"], state["opt_state"]

    def put(which: int, idx: np.ndarray) -> jax.Array:
        return jax.device_put(
            np.stack([np.asarray(arrays[i][which][idx], np.float32) for i in slots]), sharded
        )

    key = jax.random.key(config.seed)
    desc = f"train {count} x {type(models[0]).__name__}"
    bar = _bar(total, start_epoch * steps_per_epoch, progress, desc)
    try:
        for epoch in range(start_epoch, config.epochs):
            perm = np.random.default_rng([config.seed, epoch]).permutation(n_tr)
            losses = []
            for i, idx in enumerate(_batches(perm, config.batch_size)):
                g = epoch * steps_per_epoch + i
                params, opt_state, loss = vstep(
                    params, rests, opt_state, put(1, idx), put(0, idx), jax.random.fold_in(key, g)
                )
                losses.append(loss)
                bar.update(1)
            losses = np.asarray(jax.device_get(losses))  # (steps, slots)
            for j in range(count):
                p_j, rest_j = (jax.tree.map(lambda a, j=j: a[j], t) for t in (params, rests))
                validation = _validation(
                    lambda p, r, x, rest_j=rest_j: evaluate(p, rest_j, r, x),
                    p_j,
                    arrays[j][0],
                    arrays[j][1],
                    n_tr,
                )
                loss = float(np.mean(losses[:, j]))
                histories[j].append(_row(epoch, loss, validation, lr, steps_per_epoch))
            bar.set_postfix(epoch=epoch + 1, loss=f"{float(np.mean(losses[-1])):.4f}")
            if checkpoints is not None:
                checkpoints.save(epoch, {"params": params, "opt_state": opt_state}, histories)
            if on_epoch_end is not None:
                on_epoch_end(epoch, [h[-1] for h in histories])
    finally:
        bar.close()
        if checkpoints is not None:
            checkpoints.close()
    params = jax.device_get(params)
    results = []
    for j, model in enumerate(models):
        nnx.update(model, jax.tree.map(lambda a, j=j: a[j], params))
        results.append(TrainResult(model, histories[j]))
    return results
