"""The one way dmimo_jax makes pytrees: frozen dataclasses, fields as leaves or static.

Every public pytree of the package (``Scene``, the PhaseModels, grids and tables,
reflectors) is a frozen :mod:`dataclasses` class decorated with :func:`pytree_dataclass`.
Fields are pytree leaves unless declared with :func:`static_field` (hashable metadata:
sizes, flags, names). This is ``jax.tree_util.register_dataclass`` with one difference,
the one equinox makes too: unflattening bypasses ``__init__``, so a constructor may
validate and convert its arguments (a ``Scene`` checks that APs are above the ground)
while ``jit``, ``vmap`` and ``grad`` can still rebuild the object from tracers or from
the placeholder leaves JAX uses internally.

It also holds the package's two pieces of plumbing around ``jit`` and loops:
:func:`jit_or_eager` and :func:`map_in_chunks`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["jit_or_eager", "map_in_chunks", "pytree_dataclass", "static_field"]

T = TypeVar("T")


def static_field(**kwargs: Any) -> Any:
    """A dataclass field that is pytree metadata (part of the tree structure), not a leaf."""
    metadata = dict(kwargs.pop("metadata", {}) or {})
    metadata["static"] = True
    return dataclasses.field(metadata=metadata, **kwargs)


def pytree_dataclass(cls: type[T] | None = None, *, init: bool = True) -> Any:
    """Make ``cls`` a frozen dataclass registered as a pytree (keys = field names).

    Args:
        cls: the class to decorate.
        init: generate ``__init__`` (``False`` when the class writes its own, validating one).

    Examples:
        >>> import jax.numpy as jnp
        >>> @pytree_dataclass
        ... class Point:
        ...     xyz: jax.Array
        ...     label: str = static_field(default="p")
        >>> leaves, treedef = jax.tree_util.tree_flatten(Point(jnp.zeros(3)))
        >>> len(leaves), jax.tree_util.tree_unflatten(treedef, leaves).label
        (1, 'p')
    """

    def wrap(cls: type[T]) -> type[T]:
        cls = dataclasses.dataclass(frozen=True, init=init, eq=False)(cls)
        fields = dataclasses.fields(cls)
        data = tuple(f.name for f in fields if not f.metadata.get("static", False))
        meta = tuple(f.name for f in fields if f.metadata.get("static", False))
        keys = tuple(jax.tree_util.GetAttrKey(n) for n in data)

        def flatten_with_keys(obj):
            children = tuple((k, getattr(obj, n)) for k, n in zip(keys, data, strict=True))
            return children, tuple(getattr(obj, n) for n in meta)

        def flatten(obj):
            return tuple(getattr(obj, n) for n in data), tuple(getattr(obj, n) for n in meta)

        def unflatten(aux, children):
            obj = object.__new__(cls)
            for n, v in zip(data, children, strict=True):
                object.__setattr__(obj, n, v)
            for n, v in zip(meta, aux, strict=True):
                object.__setattr__(obj, n, v)
            return obj

        jax.tree_util.register_pytree_with_keys(cls, flatten_with_keys, unflatten, flatten)
        return cls

    return wrap if cls is None else wrap(cls)


def _traceable(leaf: Any) -> bool:
    return isinstance(leaf, (jax.Array, np.ndarray, np.generic, bool, int, float, complex))


def jit_or_eager(fn: Callable[..., Any], *, static_argnums: tuple[int, ...] = ()) -> Callable:
    """``fn`` compiled with ``jax.jit`` when every argument is a pytree of arrays, and
    called as it is otherwise (a user's PhaseModel that is not a pytree cannot cross
    ``jit``).

    One compiled program per argument structure and shape (``jit``'s own cache) instead
    of an eager dispatch, and a compilation, per operation: the unchecked cores of the
    package's public functions are wrapped with it.

    Examples:
        >>> import jax.numpy as jnp
        >>> double = jit_or_eager(lambda x, scale: scale * x)
        >>> double(jnp.arange(3.0), 2.0).tolist()
        [0.0, 2.0, 4.0]
    """
    jitted = jax.jit(fn, static_argnums=static_argnums)

    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        dynamic = [a for i, a in enumerate(args) if i not in static_argnums]
        if all(_traceable(leaf) for leaf in jax.tree.leaves(dynamic)):
            return jitted(*args)
        return fn(*args)

    return call


def map_in_chunks(fn: Callable[[Any], Any], xs: Any, chunk: int) -> Any:
    """``jax.lax.map(fn, xs, batch_size=...)`` over the leading axis of the pytree ``xs``
    with every chunk of one size, so the loop body is compiled once.

    ``lax.map`` with a ``batch_size`` that does not divide the length runs the remainder
    through a second, separately compiled copy of ``fn``. Here the length n is split into
    ``ceil(n / chunk)`` chunks of equal size (at most ``chunk``), the last item repeated to
    fill the last one, and the extra results dropped: the same values, one body, at most
    one chunk's extra work.

    Examples:
        >>> import jax.numpy as jnp
        >>> map_in_chunks(lambda x: 2 * x, jnp.arange(5.0), 2).tolist()
        [0.0, 2.0, 4.0, 6.0, 8.0]
    """
    n = jax.tree.leaves(xs)[0].shape[0]
    if n == 0:
        return jax.lax.map(fn, xs)
    num = -(-n // max(1, min(chunk, n)))
    size = -(-n // num)
    pad = lambda x: jnp.concatenate([x, jnp.repeat(x[-1:], num * size - n, axis=0)])
    out = jax.lax.map(fn, jax.tree.map(pad, xs) if num * size > n else xs, batch_size=size)
    return jax.tree.map(lambda y: y[:n], out)
