"""Model files: a trained network as a folder (``spec.json`` + an orbax checkpoint).

Each network class says how it is described and rebuilt (``kind``, ``spec()``,
``from_spec(spec, rngs=...)``); :data:`NETWORKS` maps the kinds to the classes. Nothing
here knows a network's internals.
"""

from __future__ import annotations

import json
import pathlib
from types import MappingProxyType
from typing import Any

import jax
import numpy as np
from flax import nnx

from dmimo_jax.learning.cells import CellClassifier
from dmimo_jax.learning.hi import AmbiguityClassifier
from dmimo_jax.learning.mlp import MLPRegressor
from dmimo_jax.learning.popt import POPT

NETWORKS = MappingProxyType(
    {cls.kind: cls for cls in (POPT, MLPRegressor, AmbiguityClassifier, CellClassifier)}
)
"""Kind -> network class (read-only): the networks a model file can hold."""

ESTIMATORS = MappingProxyType({cls.estimator_kind: cls for cls in NETWORKS.values()})
"""The offline stage's estimator kind -> its network class (read-only): the one place the
kinds are declared; each class builds itself for a scene (``for_training``), names its
training settings in a preset (``training_config``) and its online estimator
(``as_estimator``)."""


def model_spec(model: nnx.Module) -> dict:
    """A JSON-able description that :func:`build_model` turns back into the architecture."""
    kind = getattr(type(model), "kind", None)
    if NETWORKS.get(kind) is not type(model):
        raise ValueError(
            f"model must be one of {sorted(c.__name__ for c in NETWORKS.values())}, "
            f"got {type(model).__name__}"
        )
    return dict(kind=kind, **model.spec())


def build_model(spec: dict, *, seed: int = 0) -> nnx.Module:
    """A freshly initialized network of the architecture in ``spec`` (see :func:`model_spec`)."""
    kind = spec.get("kind")
    if kind not in NETWORKS:
        raise ValueError(f"spec['kind'] must be one of {sorted(NETWORKS)}, got {kind!r}")
    return NETWORKS[kind].from_spec(spec, rngs=nnx.Rngs(seed))


def save_model(path: str | pathlib.Path, model: nnx.Module, *, meta: dict | None = None) -> None:
    """Write ``model`` to the folder ``path``: ``spec.json`` and an orbax checkpoint ``state``."""
    import orbax.checkpoint as ocp

    path = pathlib.Path(path).absolute()
    path.mkdir(parents=True, exist_ok=True)
    _, state = nnx.split(model)
    with ocp.StandardCheckpointer() as ckpt:
        ckpt.save(path / "state", nnx.to_pure_dict(state), force=True)
    (path / "spec.json").write_text(
        json.dumps(dict(spec=model_spec(model), meta=meta or {}), indent=1)
    )


def load_model(path: str | pathlib.Path) -> tuple[nnx.Module, dict]:
    """The model written by :func:`save_model` and its ``meta`` dict.

    Raises:
        FileNotFoundError: no saved model at ``path``.
        ValueError: the files are there but unreadable or do not match their spec.
    """
    import orbax.checkpoint as ocp

    path = pathlib.Path(path).absolute()
    spec_file = path / "spec.json"
    if not spec_file.is_file() or not (path / "state").exists():
        raise FileNotFoundError(f"path={str(path)!r} holds no saved model (spec.json + state)")
    try:
        saved = json.loads(spec_file.read_text())
        model = build_model(saved["spec"])
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"path={str(path)!r}: spec.json is corrupted: {err}") from err
    graphdef, state = nnx.split(model)
    target = nnx.to_pure_dict(state)
    try:
        with ocp.StandardCheckpointer() as ckpt:
            # shapes first: a restore that fails on one array leaves the reads of the others
            # pending (orbax's coroutines, reported unawaited when collected)
            check_saved_shapes(ckpt, path / "state", target)
            restored = ckpt.restore(path / "state", target)
    except Exception as err:
        raise ValueError(
            f"path={str(path)!r}: the saved state is corrupted or does not match spec.json: {err}"
        ) from err
    nnx.replace_by_pure_dict(state, restored)
    return nnx.merge(graphdef, state), saved.get("meta", {})


def check_saved_shapes(ckpt: Any, state: str | pathlib.Path, target: Any) -> None:
    """``ValueError`` naming the first array whose shape saved at ``state`` (an orbax
    checkpoint folder of one pytree, read with ``ckpt``: an ``orbax.checkpoint``
    ``StandardCheckpointer``) differs from ``target``'s (a pytree of arrays; arrays matched
    by their path); nothing where orbax's metadata cannot be read as shapes (the restore
    then checks). Called before a restore: a restore that fails on one array leaves orbax's
    reads of the others pending (coroutines reported unawaited when collected)."""
    # a path as orbax's metadata names it: dict keys, attribute names (an optimizer state's
    # fields, a flax variable's value) and sequence indices, plain
    key = lambda path: jax.tree_util.keystr(path, simple=True, separator="/")  # noqa: E731
    try:
        metadata = ckpt.metadata(state)
        saved = getattr(getattr(metadata, "item_metadata", metadata), "tree", metadata)
        leaves = jax.tree_util.tree_leaves_with_path(saved)
        shapes = {key(p): tuple(int(n) for n in a.shape) for p, a in leaves}
    except Exception:  # another orbax's metadata, or unreadable: the restore decides
        return
    for path, a in jax.tree_util.tree_leaves_with_path(target):
        got = shapes.get(key(path))
        if got is not None and got != np.shape(a):
            raise ValueError(
                f"{jax.tree_util.keystr(path)} is saved with shape {got}, the model's is "
                f"{np.shape(a)}"
            )
