"""The one way dmimo_jax makes pytrees: frozen dataclasses, fields as leaves or static.

Every public pytree of the package (``Scene``, the PhaseModels, grids and tables,
reflectors) is a frozen :mod:`dataclasses` class decorated with :func:`pytree_dataclass`.
Fields are pytree leaves unless declared with :func:`static_field` (hashable metadata:
sizes, flags, names). This is ``jax.tree_util.register_dataclass`` with one difference,
the one equinox makes too: unflattening bypasses ``__init__``, so a constructor may
validate and convert its arguments (a ``Scene`` checks that APs are above the ground)
while ``jit``, ``vmap`` and ``grad`` can still rebuild the object from tracers or from
the placeholder leaves JAX uses internally.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import jax

__all__ = ["pytree_dataclass", "static_field"]

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
