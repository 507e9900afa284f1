r"""Synthetic training data from a PhaseModel (Sec. III-C, Step 3 of the offline stage).

Each sample n gets its own key ``fold_in(key, n)``, from which it draws a UE position
uniform in the UE region, a CPO uniform on :math:`[-\pi, \pi)` and the noisy wrapped
phases :math:`\tilde r = \mathrm{wrap}(\tilde\mu(\tilde{\mathbf x}) + \tilde\phi + \tilde n)`
(eq. 25 with the GP PhaseModel, or any other PhaseModel). The data therefore depend only
on ``key`` and ``n``, not on how generation is chunked or resumed.

:func:`write_dataset` fills ``x.npy``, ``r.npy`` and ``cpo.npy`` (NumPy ``.npy``,
float64, memory-mappable so training can stream them) in chunks, records its progress
in ``meta.json`` after every chunk and resumes from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax.measure import simulate_phases
from dmimo_jax.physics import PhaseModel, as_phase_model
from dmimo_jax.scene import Scene


class SyntheticBatch(NamedTuple):
    """A batch of the synthetic set (Sec. III-C): positions, phases, CPOs (and more)."""

    x: Any
    """(N, 3) UE positions, m."""
    r: Any
    """(N, M) wrapped phases, rad."""
    cpo: Any
    """(N,) CPOs, rad."""


def _region(
    model: PhaseModel | Scene, region: tuple[ArrayLike, ArrayLike] | None
) -> tuple[Array, Array]:
    if region is None:
        scene = getattr(model, "scene", None)
        if scene is None:
            raise ValueError("region=(low, high) is required for a model without a .scene")
        return jnp.asarray(scene.ue_low), jnp.asarray(scene.ue_high)
    low, high = (jnp.asarray(v, float) for v in region)
    if low.shape != (3,) or high.shape != (3,) or not bool(jnp.all(high > low)):
        raise ValueError(
            f"region must be (low, high) with 3 entries each and high > low, got {region}"
        )
    return low, high


def synthesize(
    key: Array,
    model: PhaseModel | Scene,
    num: int,
    *,
    start: int = 0,
    region: tuple[ArrayLike, ArrayLike] | None = None,
) -> SyntheticBatch:
    """Samples ``start .. start + num - 1`` of the synthetic dataset of ``key`` (in memory).

    Args:
        key: dataset key.
        model: PhaseModel (e.g. :class:`~dmimo_jax.gp.GPPhaseModel`) or Scene.
        num: number of samples.
        start: index of the first sample.
        region: (low, high) box for the UE positions (default: the model scene's UE region).
    """
    model = as_phase_model(model)
    if not (isinstance(num, (int, np.integer)) and num >= 1):
        raise ValueError(f"num must be a positive int, got {num!r}")
    if not (isinstance(start, (int, np.integer)) and start >= 0):
        raise ValueError(f"start must be a non-negative int, got {start!r}")
    low, high = _region(model, region)
    # evaluate in whole blocks so every sample takes the same vectorized code path:
    # the data are then bit-identical whatever the chunking
    padded = -(-num // _BLOCK) * _BLOCK
    index = jnp.arange(start, start + padded, dtype=jnp.uint32)
    out = _synthesize(key, model, index, low, high)
    return SyntheticBatch(*(v[:num] for v in out))


_BLOCK = 256


@jax.jit
def _synthesize(key, model, index, low, high) -> SyntheticBatch:
    def one(n):
        k_x, k_cpo, k_noise = jax.random.split(jax.random.fold_in(key, n), 3)
        u = jax.random.uniform(k_x, (3,), low.dtype)
        x = low + u * (high - low)
        cpo = jax.random.uniform(k_cpo, (), low.dtype, minval=-jnp.pi, maxval=jnp.pi)
        return x, simulate_phases(k_noise, model, x, cpo), cpo

    return SyntheticBatch(*jax.vmap(one)(index))


def model_fingerprint(model: PhaseModel) -> str:
    """A hash of a PhaseModel's type, tree structure and every leaf's bytes: two models
    with the same fingerprint give the same synthetic data."""
    h = hashlib.sha256(type(model).__qualname__.encode())
    leaves, treedef = jax.tree_util.tree_flatten(model)
    h.update(str(treedef).encode())
    for leaf in leaves:
        arr = np.asarray(leaf)
        h.update(str(arr.dtype).encode() + str(arr.shape).encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def write_json_atomic(path: pathlib.Path, obj: dict) -> None:
    """Write ``obj`` as JSON to a temporary file and rename it over ``path``: a kill at any
    moment leaves either the old or the new file, never a partial one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def check_npy_file(path: pathlib.Path, shape: tuple[int, ...]) -> None:
    """``ValueError`` naming ``path`` unless it is a float64 ``.npy`` file of ``shape`` whose
    size holds every element (a truncated file memory-mapped for writing would be extended
    with zeros, and a network trained on them, without a word)."""
    try:
        with open(path, "rb") as f:
            major, _ = np.lib.format.read_magic(f)
            read = (
                np.lib.format.read_array_header_1_0
                if major == 1
                else np.lib.format.read_array_header_2_0
            )
            header = read(f)
            offset = f.tell()
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(f"{path} is missing, truncated or corrupt ({err})") from err
    got_shape, _, dtype = header
    if tuple(got_shape) != tuple(shape) or np.dtype(dtype) != np.float64:
        raise ValueError(
            f"{path} holds {np.dtype(dtype)} {tuple(got_shape)}, the dataset records float64 "
            f"{tuple(shape)}: remove the folder and write the dataset again"
        )
    need = offset + int(np.prod(shape)) * 8
    have = path.stat().st_size
    if have < need:
        raise ValueError(
            f"{path} is truncated ({have} of {need} bytes): remove the folder and write the "
            "dataset again"
        )


def read_meta(path: pathlib.Path) -> dict:
    """The ``meta.json`` of a dataset folder, or a ``ValueError`` naming the folder."""
    meta_path = pathlib.Path(path) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
        int(meta["num"]), int(meta["done"]), int(meta["num_aps"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(
            f"{path}: meta.json is missing, empty or corrupt ({err}); remove the folder and "
            "write the dataset again"
        ) from err
    return meta


def write_dataset(
    path: str | pathlib.Path,
    key: Array,
    model: PhaseModel | Scene,
    num: int,
    *,
    chunk_size: int = 8192,
    region: tuple[ArrayLike, ArrayLike] | None = None,
    progress: bool = True,
) -> pathlib.Path:
    """Generate ``num`` samples into the directory ``path`` in chunks; resumable.

    ``meta.json`` records the request (size, key, chunking, region and a fingerprint of
    the model) and the finished count; it is replaced atomically after each chunk.
    Calling again with the same request continues after the last finished chunk; any
    other request on the same folder raises (it would mix two datasets).

    Returns:
        ``path``; read it with :func:`load_dataset`.

    Raises:
        ValueError: bad arguments; a folder holding a different dataset; a corrupt one.
    """
    from tqdm.auto import tqdm

    model = as_phase_model(model)
    if not (isinstance(chunk_size, int) and chunk_size >= 1):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if not (isinstance(num, (int, np.integer)) and num >= 1):
        raise ValueError(f"num must be a positive int, got {num!r}")
    low, high = _region(model, region)
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta_path = path / "meta.json"
    request = dict(
        num=int(num),
        num_aps=model.num_aps,
        key=np.asarray(jax.random.key_data(key)).tolist(),
        chunk_size=chunk_size,
        region=[np.asarray(low).tolist(), np.asarray(high).tolist()],
        model=type(model).__name__,
        model_fingerprint=model_fingerprint(model),
    )
    meta = dict(request, done=0)
    if meta_path.exists():
        old = read_meta(path)
        changed = [k for k in request if old.get(k) != request[k]]
        if changed:
            raise ValueError(
                f"{path} holds a different dataset (it differs in {changed}); use another "
                "path or remove this one"
            )
        meta = old
    mode = "r+" if meta["done"] > 0 else "w+"
    shapes = {"x": (num, 3), "r": (num, model.num_aps), "cpo": (num,)}
    if mode == "r+":
        for k, s in shapes.items():
            check_npy_file(path / f"{k}.npy", s)
    try:
        arrays = {
            k: np.lib.format.open_memmap(path / f"{k}.npy", mode=mode, dtype=np.float64, shape=s)
            for k, s in shapes.items()
        }
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: cannot open its arrays to resume ({err})") from err
    if mode == "r+" and any(arrays[k].shape != s for k, s in shapes.items()):
        raise ValueError(f"{path}: its arrays do not have the recorded shapes")
    if meta["done"] == 0:
        write_json_atomic(meta_path, meta)
    with tqdm(
        total=num,
        initial=meta["done"],
        desc="synthesize",
        unit="sample",
        disable=None if progress else True,
    ) as bar:
        while meta["done"] < num:
            n = min(chunk_size, num - meta["done"])
            batch = synthesize(key, model, n, start=meta["done"], region=(low, high))
            for k in shapes:
                arrays[k][meta["done"] : meta["done"] + n] = np.asarray(getattr(batch, k))
                arrays[k].flush()
            meta = dict(meta, done=meta["done"] + n)
            write_json_atomic(meta_path, meta)
            bar.update(n)
    return path


def load_dataset(path: str | pathlib.Path, *, mmap: bool = True) -> SyntheticBatch:
    """Open a dataset written by :func:`write_dataset` (memory-mapped by default).

    Raises:
        ValueError: an incomplete, corrupt or truncated dataset (the message names ``path``).
    """
    path = pathlib.Path(path)
    meta = read_meta(path)
    if meta["done"] < meta["num"]:
        raise ValueError(
            f"{path} is incomplete ({meta['done']}/{meta['num']}); resume write_dataset"
        )
    mode = "r" if mmap else None
    shapes = {"x": (meta["num"], 3), "r": (meta["num"], meta["num_aps"]), "cpo": (meta["num"],)}
    arrays = []
    for k, shape in shapes.items():
        check_npy_file(path / f"{k}.npy", shape)
        try:
            a = np.load(path / f"{k}.npy", mmap_mode=mode)
        except (OSError, ValueError, EOFError) as err:
            raise ValueError(f"{path}: {k}.npy is missing, truncated or corrupt ({err})") from err
        if a.shape != shape:
            raise ValueError(f"{path}: {k}.npy has shape {a.shape}, meta.json says {shape}")
        arrays.append(a)
    return SyntheticBatch(*arrays)
