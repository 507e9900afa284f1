"""The Locator beyond one process: its program exported as serialized StableHLO and loaded
where only jax is installed (:func:`export_locator`, :func:`load_locator`), and a batch split
over several devices (:func:`sharded`)."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax._checks import as_snapshot_batch
from dmimo_jax.estimators import PhasorTable
from dmimo_jax.pipeline.batches import program_jit, run_in_buckets
from dmimo_jax.pipeline.locator import Locator, LocatorResult
from dmimo_jax.pipeline.rescues import Status

FORMAT = "dmimo_jax.Locator/3"
"""The export format :func:`load_locator` reads: ``locator.json``, ``arrays.npz`` (the
Locator's leaves) and one ``batch_<B>.stablehlo`` per batch size."""


def export_locator(
    loc: Locator, path: str | pathlib.Path, batch_sizes: tuple[int, ...] = (1, 4, 16, 64, 256)
) -> None:
    """Write ``loc``'s online stage as serialized StableHLO (``jax.export``) for each of
    ``batch_sizes`` (and 1, which re-runs the rows that overflowed a larger batch's
    capacity), and its weights and tables (the Locator's leaves) beside them in
    ``arrays.npz``: :func:`load_locator` runs it in a process that has jax and none of the
    training code. The arrays are the programs' arguments, not constants inside them, so a
    program stays small and a persistent compilation cache keys and reads it quickly.
    Platforms: this one's."""
    if not isinstance(batch_sizes, tuple | list) or not all(
        isinstance(b, int | np.integer) and not isinstance(b, bool) and b >= 1 for b in batch_sizes
    ):
        raise ValueError(f"batch_sizes must be a tuple of positive ints, got {batch_sizes!r}")
    sizes = sorted({int(b) for b in batch_sizes} | {1})
    dtype = jnp.result_type(float)
    leaves, tree = jax.tree_util.tree_flatten(loc)
    first: dict[int, int] = {}  # id of a leaf -> its place among the stored arrays
    place = [first.setdefault(id(a), len(first)) for a in leaves]
    unique = [leaves[place.index(i)] for i in range(len(first))]
    specs = [jax.ShapeDtypeStruct(np.shape(a), a.dtype) for a in leaves]
    blobs = {}
    for b in sizes:

        def program(leaves: list, r: Array, n: Array, b: int = b) -> tuple:
            own = jax.tree_util.tree_unflatten(tree, leaves)
            return tuple(own.program(r, own.capacity_for(b), n))

        rows = jax.ShapeDtypeStruct((b, loc.num_aps), dtype)
        exp = jax.export.export(jax.jit(program))(specs, rows, jax.ShapeDtypeStruct((), jnp.int32))
        blobs[b] = bytes(exp.serialize())
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = dict(
        format=FORMAT,
        num_aps=loc.num_aps,
        dtype=str(jnp.dtype(dtype)),
        batch_sizes=sizes,
        arrays=place,  # the stored array of each leaf (a leaf the models share, once)
        fields=list(LocatorResult._fields),
        settings={k: v for k, v in loc.settings._asdict().items() if k != "rescues"},
        rescues=[type(x).__name__ for x in loc.settings.rescues],
    )
    np.savez(path / "arrays.npz", *(np.asarray(a) for a in unique))
    for b, blob in blobs.items():
        (path / f"batch_{b}.stablehlo").write_bytes(blob)
    (path / "locator.json").write_text(json.dumps(meta, indent=1))


def sharded(loc: Locator, devices: Any = None) -> Any:
    """``loc``'s program over a batch split across ``devices`` (default: every local
    device) with ``jax.sharding``: each device locates its rows with its own capacity
    (``jax.shard_map``), so the answers equal one device's wherever no row overflows.
    Returns a jitted ``r (B, M) -> LocatorResult``; B must be a multiple of the device
    count (pad the batch)."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = jax.local_devices() if devices is None else devices
    if isinstance(devices, str) or not isinstance(devices, Sequence):
        raise ValueError(f"devices must be a sequence of jax devices, got {devices!r}")
    devices = list(devices)
    if not devices or not all(isinstance(d, jax.Device) for d in devices):
        raise ValueError(f"devices must name at least one jax device, got {devices!r}")
    if len({d.id for d in devices}) != len(devices):
        raise ValueError(f"devices must be distinct, got {devices!r}")
    mesh = Mesh(np.asarray(devices), ("batch",))
    rows = PartitionSpec("batch")
    n = len(devices)
    table = loc.table
    if table.mesh is not None:  # each device searches the whole table: one copy each
        table = PhasorTable(
            jax.device_put(table.data, devices[0]),
            table.grid,
            table.chunk_size,
            table.num_chunks,
            None,
        )
    leaves, tree = jax.tree_util.tree_flatten(loc.with_table(table))
    loc = jax.device_put(
        jax.tree_util.tree_unflatten(tree, leaves), NamedSharding(mesh, PartitionSpec())
    )

    def local(loc: Locator, r: Array) -> LocatorResult:
        return loc.program(r, loc.capacity_for(r.shape[0]))

    mapped = jax.shard_map(
        local, mesh=mesh, in_specs=(PartitionSpec(), rows), out_specs=rows, check_vma=False
    )

    @program_jit
    def run(loc: Locator, r: Array) -> LocatorResult:
        return mapped(loc, r)

    def call(r: ArrayLike) -> LocatorResult:
        rb = loc._snapshots(r)
        if rb.shape[0] % n:
            raise ValueError(f"r: {rb.shape[0]} snapshots do not split over {n} devices")
        rb = jax.device_put(rb, NamedSharding(mesh, rows))
        return run(loc, rb)

    return call


class ExportedLocator:
    """A Locator loaded from :func:`export_locator`'s files: ``loaded(r)`` for (M,) or (B, M)
    snapshots (padded to the next exported batch size, split above the largest; rows that
    overflowed a program's capacity run again alone), checked like ``Locator.__call__``'s."""

    def __init__(self, meta: dict, programs: dict[int, Any], arrays: list[Array]):
        self.meta, self.programs, self.arrays = meta, programs, arrays
        self._calls = {b: program_jit(p.call) for b, p in programs.items()}  # as the Locator's
        self.num_aps = int(meta["num_aps"])
        self.batch_sizes = sorted(programs)

    def _run(self, b: int, r: Array, n: int) -> LocatorResult:
        return LocatorResult(*self._calls[b](self.arrays, r, jnp.int32(n)))

    def __call__(self, r: ArrayLike) -> LocatorResult:
        single = np.ndim(r) == 1
        rb = as_snapshot_batch("r", r, self.num_aps).astype(self.meta["dtype"])
        if rb.shape[0] == 0:  # as Locator.__call__: the empty result
            one = jax.ShapeDtypeStruct((1, self.num_aps), rb.dtype)
            empty = jax.eval_shape(lambda r: self._run(1, r, 1), one)
            return LocatorResult(*(jnp.zeros((0, *a.shape[1:]), a.dtype) for a in empty))
        out = run_in_buckets(lambda pad, k: self._run(pad.shape[0], pad, k), rb,
                             tuple(self.batch_sizes))  # fmt: skip
        overflow = np.asarray(out.status) == Status.OVERFLOW  # on the host
        for row in np.flatnonzero(overflow):  # alone, a row always fits
            again = self._run(1, rb[row : row + 1], 1)
            out = jax.tree.map(lambda a, b, i=row: a.at[i].set(b[0]), out, again)
        return jax.tree.map(lambda a: a[0], out) if single else out


def load_locator(path: str | pathlib.Path) -> ExportedLocator:
    """Load what :func:`export_locator` wrote (needs jax only, no trained objects). With
    JAX's persistent compilation cache on (:func:`~dmimo_jax.pipeline.use_compilation_cache`)
    a second process's first call reads the compiled program instead of compiling it."""
    path = pathlib.Path(path)
    meta_file = path / "locator.json"
    if not meta_file.is_file():
        raise ValueError(f"path: {path} holds no exported Locator (no locator.json)")
    try:
        meta = json.loads(meta_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"path: {meta_file} is damaged (not JSON: {e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(
            f"path: {meta_file} is not a {FORMAT} export (format "
            f"{meta.get('format')!r}: export it again with this version)"
        )
    programs = {}
    for b in meta.get("batch_sizes", []):
        file = path / f"batch_{b}.stablehlo"
        if not file.is_file():
            raise ValueError(f"path: {file} is missing (locator.json lists batch size {b})")
        try:
            programs[int(b)] = jax.export.deserialize(bytearray(file.read_bytes()))
        except Exception as e:  # a truncated or foreign file: flatbuffers' own errors vary
            raise ValueError(f"path: {file} is damaged ({type(e).__name__}: {e})") from None
    if 1 not in programs:
        raise ValueError(f"path: {meta_file} lists no batch size 1 (export it again)")
    arrays_file = path / "arrays.npz"
    try:
        with np.load(arrays_file) as stored:
            unique = {i: jnp.asarray(stored[f"arr_{i}"]) for i in set(meta["arrays"])}
        arrays = [unique[i] for i in meta["arrays"]]
    except Exception as e:  # missing, truncated or short: numpy's and zipfile's errors vary
        raise ValueError(f"path: {arrays_file} is damaged ({type(e).__name__}: {e})") from None
    return ExportedLocator(meta, programs, arrays)
