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

import json
import pathlib
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jax.typing import ArrayLike

from dmimo_jax.measure import simulate_phases
from dmimo_jax.physics import as_phase_model

__all__ = ["SyntheticBatch", "synthesize", "write_dataset", "load_dataset"]


class SyntheticBatch(NamedTuple):
    x: Any  # (N, 3) UE positions, m
    r: Any  # (N, M) wrapped phases, rad
    cpo: Any  # (N,) CPOs, rad


def _region(model: Any, region: tuple[ArrayLike, ArrayLike] | None) -> tuple[Array, Array]:
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
    model: Any,
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


def write_dataset(
    path: str | pathlib.Path,
    key: Array,
    model: Any,
    num: int,
    *,
    chunk_size: int = 8192,
    region: tuple[ArrayLike, ArrayLike] | None = None,
    progress: bool = True,
) -> pathlib.Path:
    """Generate ``num`` samples into the directory ``path`` in chunks; resumable.

    Interrupting and calling again with the same arguments continues after the last
    finished chunk (``meta.json`` records it); a different key or size raises.

    Returns:
        ``path``; read it with :func:`load_dataset`.
    """
    from tqdm.auto import tqdm

    model = as_phase_model(model)
    if not (isinstance(chunk_size, int) and chunk_size >= 1):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    if not (isinstance(num, (int, np.integer)) and num >= 1):
        raise ValueError(f"num must be a positive int, got {num!r}")
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta_path = path / "meta.json"
    key_data = np.asarray(jax.random.key_data(key)).tolist()
    meta = dict(num=int(num), num_aps=model.num_aps, key=key_data, done=0, seconds=0.0)
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        if (old["num"], old["num_aps"], old["key"]) != (meta["num"], meta["num_aps"], key_data):
            raise ValueError(
                f"{path} holds a different dataset (num={old['num']}, key={old['key']}); "
                "use another path"
            )
        meta = old
    mode = "r+" if meta["done"] > 0 else "w+"
    shapes = {"x": (num, 3), "r": (num, model.num_aps), "cpo": (num,)}
    arrays = {
        k: np.lib.format.open_memmap(path / f"{k}.npy", mode=mode, dtype=np.float64, shape=s)
        for k, s in shapes.items()
    }
    with tqdm(
        total=num, initial=meta["done"], desc="synthesize", unit="sample", disable=not progress
    ) as bar:
        while meta["done"] < num:
            t0 = time.perf_counter()
            n = min(chunk_size, num - meta["done"])
            batch = synthesize(key, model, n, start=meta["done"], region=region)
            for k in shapes:
                arrays[k][meta["done"] : meta["done"] + n] = np.asarray(getattr(batch, k))
                arrays[k].flush()
            meta["done"] += n
            meta["seconds"] += time.perf_counter() - t0
            meta_path.write_text(json.dumps(meta))
            bar.update(n)
    return path


def load_dataset(path: str | pathlib.Path, *, mmap: bool = True) -> SyntheticBatch:
    """Open a dataset written by :func:`write_dataset` (memory-mapped by default)."""
    path = pathlib.Path(path)
    meta = json.loads((path / "meta.json").read_text())
    if meta["done"] < meta["num"]:
        raise ValueError(
            f"{path} is incomplete ({meta['done']}/{meta['num']}); resume write_dataset"
        )
    mode = "r" if mmap else None
    return SyntheticBatch(*(np.load(path / f"{k}.npy", mmap_mode=mode) for k in ("x", "r", "cpo")))
