"""Where :func:`~dmimo_jax.pipeline.run_offline` keeps its work, and the key that names it.

The key hashes **everything that determines the result**: the labeled snapshots (positions,
phases, noise variances), every leaf of the scene and of the phase model (AP positions,
phase offsets, antenna, materials, wavelength, powers, UE region, ...) together with their
tree structure (the static fields: polarization, reflector names, the model's class), and the
settings (preset, sample count, seed, network and loop configuration). Change any of them
and the key changes, so a cached network is never reused for another problem.

The cache lives in ``$DMIMO_JAX_CACHE`` if set, else ``$XDG_CACHE_HOME/dmimo_jax``, else
``~/.cache/dmimo_jax``; ``run_offline(cache_dir=...)`` overrides both.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Any

import jax
import numpy as np

CACHE_ENV = "DMIMO_JAX_CACHE"
"""The environment variable that moves the default cache."""


def default_cache_dir() -> pathlib.Path:
    """``$DMIMO_JAX_CACHE``, else ``$XDG_CACHE_HOME/dmimo_jax``, else ``~/.cache/dmimo_jax``."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return pathlib.Path(explicit).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
    return pathlib.Path(base) / "dmimo_jax"


def cache_key(settings: dict, *trees: Any) -> str:
    """A 16-hex-digit key of ``settings`` (JSON) and of every leaf and structure of ``trees``.

    Leaves are hashed as float64/complex128 bytes with their shapes; the tree structure (which
    carries the static fields: a model's class, polarization, reflector names) as its repr.

    Examples:
        >>> import numpy as np
        >>> a = cache_key({"seed": 0}, {"x": np.zeros(3)})
        >>> a == cache_key({"seed": 0}, {"x": np.zeros(3)}), a == cache_key({"seed": 1}, {"x": np.zeros(3)})
        (True, False)
    """
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for tree in trees:
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        h.update(str(treedef).encode())
        for leaf in leaves:
            arr = np.asarray(leaf)
            arr = arr.astype(np.complex128 if np.iscomplexobj(arr) else np.float64)
            h.update(str(arr.shape).encode())
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:16]


COMPILATION_CACHE_ENV = "DMIMO_JAX_COMPILATION_CACHE"
"""The environment variable that moves :func:`use_compilation_cache`'s default folder."""


def use_compilation_cache(path: str | os.PathLike | None = None) -> pathlib.Path:
    """Keep XLA's compiled programs on disk (JAX's persistent compilation cache), so a second
    process runs the Locator's programs without compiling them again.

    An explicit call for entry points (scripts, services, notebooks), never an import side
    effect: it sets ``jax_compilation_cache_dir`` to ``path``, else
    ``$DMIMO_JAX_COMPILATION_CACHE``, else ``xla/`` under :func:`default_cache_dir`, and keeps
    every program that took at least 0.5 s to compile. JAX keys an entry by the program, the
    XLA flags, the backend and the jax version, so a hit is the same executable (it never
    caches a result). Returns the folder.
    """
    folder = path or os.environ.get(COMPILATION_CACHE_ENV) or default_cache_dir() / "xla"
    folder = made_folder("path", pathlib.Path(folder).expanduser())
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return folder


def made_folder(name: str, path: str | os.PathLike) -> pathlib.Path:
    """``path`` as a folder, created with its parents: ``ValueError`` naming the argument
    ``name`` where it (or a parent) is a file, instead of an ``OSError`` from ``mkdir``."""
    path = pathlib.Path(path)
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise ValueError(f"{name} must be a folder, but {p} is a file")
    path.mkdir(parents=True, exist_ok=True)
    return path
