"""The batch sizes the online program is compiled for: a batch is padded to the next of a few
sizes (:data:`BUCKETS`), so a handful of programs serve any batch (serving systems pad
requests the same way)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from types import MappingProxyType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array

from dmimo_jax._checks import check_int

BUCKETS = (1, 4, 16, 64, 256, 1024, 4096)
"""The batch sizes the Locator's call compiles: a batch is padded to the next (a larger one
runs in parts of the last), so any batch runs one of seven programs."""


def _jaxlib_version() -> tuple[int, int]:
    try:
        return tuple(int(p) for p in version("jaxlib").split(".")[:2])  # type: ignore[return-value]
    except (PackageNotFoundError, ValueError):
        return (0, 0)


try:  # JAX's own test that no transformation is tracing (JAX 0.10, the versions with options)
    from jax._src.core import trace_state_clean as _top_level
except ImportError:  # pragma: no cover (a JAX without it: no options, the plain jit)
    _top_level = None

PROGRAM_COMPILER_OPTIONS = MappingProxyType(
    {"xla_cpu_use_fusion_emitters": False}
    if _jaxlib_version() < (0, 11) and _top_level is not None
    else {}
)
"""XLA options of the Locator's compiled program only (``jax.jit(...,
compiler_options=...)``: nothing global changes): on jaxlib < 0.11, XLA's elemental CPU
emitters, which compile it faster at the same speed per snapshot and with the same
answers to float rounding (measured in docs/performance.md); empty on newer jaxlib, which
removed the option (and on a JAX without the test of a trace in progress that
:class:`ProgramJit` uses to keep them off nested jits)."""


class ProgramJit:
    """``jax.jit(fn, **jit_kwargs)`` compiled with :data:`PROGRAM_COMPILER_OPTIONS` where it
    is called from the host. JAX takes compiler options only on a top-level jit, so a call
    inside a transformation (``jax.jit``, ``jax.eval_shape``, ``jax.grad``, ``jax.vmap``,
    with traced or concrete arguments) runs the plain jit, which the caller's program then
    inlines. Without options the two are one jit."""

    def __init__(self, fn: Callable, **jit_kwargs: Any):
        self.plain = jax.jit(fn, **jit_kwargs)
        options = dict(PROGRAM_COMPILER_OPTIONS)
        self.top = jax.jit(fn, compiler_options=options, **jit_kwargs) if options else self.plain

    def __call__(self, *args: Any) -> Any:
        if self.top is not self.plain and _top_level():
            return self.top(*args)
        return self.plain(*args)

    def lower(self, *args: Any) -> Any:
        """``jax.jit``'s ``lower`` of the top-level jit (with the options): what a
        measurement of the program's size and compile time lowers and compiles."""
        return self.top.lower(*args)

    def cache_size(self) -> int:
        """The programs its jits hold in this process (:func:`jit_cache_size`)."""
        return jit_cache_size(*{self.plain, self.top})


def jit_cache_size(*jits: Any) -> int:
    """The programs ``jax.jit`` functions ``jits`` (or :class:`ProgramJit` s) hold in this
    process, summed (JAX's in-memory caches; -1 where this JAX does not report one)."""
    sizes = []
    for f in jits:
        if isinstance(f, ProgramJit):
            sizes.append(f.cache_size())
        else:
            size = getattr(f, "_cache_size", None)
            sizes.append(-1 if size is None else int(size()))
    return -1 if -1 in sizes else sum(sizes)


def program_jit(fn: Callable, **jit_kwargs: Any) -> ProgramJit:
    """:class:`ProgramJit` of ``fn``: how the Locator's program is jitted (its call, its
    sharded call, a loaded export)."""
    return ProgramJit(fn, **jit_kwargs)


def check_sizes(sizes: Any) -> tuple[int, ...]:
    """``sizes`` as a tuple of batch sizes: ints >= 1, strictly ascending, at least one
    (``ValueError`` naming ``sizes`` otherwise: a size out of order would pad a batch to a
    smaller program or split it in the wrong parts)."""
    try:
        sizes = tuple(sizes)
    except TypeError:
        raise ValueError(f"sizes must be a tuple of batch sizes, got {sizes!r}") from None
    ok = len(sizes) > 0 and all(
        isinstance(s, int | np.integer) and not isinstance(s, bool) and s >= 1 for s in sizes
    )
    if not ok or any(a >= b for a, b in zip(sizes, sizes[1:], strict=False)):
        raise ValueError(
            f"sizes must be ints >= 1 in strictly ascending order, at least one, got {sizes!r}"
        )
    return tuple(int(s) for s in sizes)


def bucket_for(n: int, sizes: tuple[int, ...] = BUCKETS) -> int:
    """The smallest of ``sizes`` (ascending; default :data:`BUCKETS`) that holds ``n`` rows.

    Raises:
        ValueError: ``n`` not an int >= 0, ``sizes`` not ascending ints >= 1
            (:func:`check_sizes`), or ``n`` above the largest (split the batch:
            :func:`padded_parts`).
    """
    check_int("n", n)
    return _bucket(n, check_sizes(sizes))


def _bucket(n: int, sizes: tuple[int, ...]) -> int:  # bucket_for on checked arguments
    for size in sizes:
        if size >= n:
            return size
    raise ValueError(f"n={n} rows exceed the largest batch size {sizes[-1]}: split them")


def snug_parts(n: int, sizes: tuple[int, ...] = BUCKETS, waste: float = 0.25) -> list[int]:
    """``n`` rows as parts that each run one of ``sizes``' programs with little padding: a
    part of the largest size while more remain, else the rest when its size's padding is
    at most ``waste`` of it, else the largest size that the rest fills. Where the Locator's
    call pads a batch to the next size (5 rows run 16), a caller with many small batches
    (a tiled building's tiles) runs ``[4, 1]``: the same programs, a fraction of the work.

    Examples:
        >>> snug_parts(5), snug_parts(11), snug_parts(63), snug_parts(70)
        ([4, 1], [4, 4, 3], [63], [64, 4, 1, 1])

    Raises:
        ValueError: ``n`` not an int >= 0, ``sizes`` not ascending ints >= 1, or a
            ``waste`` outside [0, 1).
    """
    check_int("n", n)
    sizes = check_sizes(sizes)
    if not 0 <= waste < 1:
        raise ValueError(f"waste must be in [0, 1), got {waste}")
    parts = []
    while n > 0:
        if n >= sizes[-1]:
            part = sizes[-1]
        elif (size := _bucket(n, sizes)) - n <= waste * size:
            part = n
        else:  # the largest size the rest fills (none: the rest, padded to the smallest)
            part = max((s for s in sizes if s <= n), default=n)
        parts.append(part)
        n -= part
    return parts


def padded_parts(r: Array | np.ndarray, sizes: tuple[int, ...] = BUCKETS):
    """``r`` (B, M) in parts of at most the largest of ``sizes``, each padded to the next
    size by repeats of its last row: yields ``(n, padded)`` with ``n`` its real rows. What
    the Locator's call and a loaded export run, so a few programs serve any batch. A NumPy
    ``r`` is split and padded on the host (no device dispatch); a JAX array on its device,
    each part padded by one small program per row count (not one per operation: a new
    batch size compiles one, not four); a part that fills its size is yielded as it is.

    Raises:
        ValueError: ``sizes`` not ascending ints >= 1 (:func:`check_sizes`), at the call.
    """
    return _parts(r, check_sizes(sizes))


def _parts(r: Array | np.ndarray, sizes: tuple[int, ...]):
    top = sizes[-1]
    for start in range(0, r.shape[0], top):
        part = r if r.shape[0] <= top else r[start : start + top]  # one part: no slice
        n = part.shape[0]
        size = _bucket(n, sizes)
        if size == n:
            yield n, part
        elif isinstance(part, np.ndarray):
            yield n, np.concatenate([part, np.repeat(part[-1:], size - n, axis=0)])
        else:
            yield n, _padded(part, size)


def run_in_buckets(run: Callable[[Any, int], Any], r: Array | np.ndarray, sizes=BUCKETS) -> Any:
    """``run(padded, n)`` on each part of :func:`padded_parts` ``(r, sizes)``, each result
    cut to its ``n`` real rows (:func:`head_rows`) and the parts joined: a batch of any size
    through a few programs, as the Locator's call and a loaded export run theirs. A batch
    of several parts is cut and joined by one program (:func:`joined_rows`)."""
    outs, counts, full = [], [], True
    for n, padded in padded_parts(r, sizes):
        outs.append(run(padded, n))
        counts.append(n)
        full = full and n == padded.shape[0]
    if len(outs) > 1:
        return joined_rows(outs, tuple(counts))
    return outs[0] if full else head_rows(outs[0], counts[0])


@partial(jax.jit, static_argnums=1)
def joined_rows(trees: list, counts: tuple[int, ...]) -> Any:
    """The first ``counts[i]`` rows of every leaf of ``trees[i]``, the trees joined along
    the rows, as one program: a batch of several parts (over the largest bucket) compiles
    one small program per new size, not a slice and a concatenation per leaf."""
    for c in counts:
        check_int("counts", c)
    return jax.tree.map(
        lambda *a: jnp.concatenate([x[:c] for x, c in zip(a, counts, strict=True)]), *trees
    )


@partial(jax.jit, static_argnums=1)
def _padded(part: Array, size: int) -> Array:
    return jnp.concatenate([part, jnp.repeat(part[-1:], size - part.shape[0], axis=0)])


@partial(jax.jit, static_argnums=1)
def head_rows(tree: Any, n: int) -> Any:
    """The first ``n`` rows of every leaf of ``tree`` (a padded batch's results without
    the padding), as one program: a new ``n`` compiles one small program, not one slice
    per leaf (a Locator's result has eight). ``ValueError`` unless ``n`` is an int >= 0
    (a negative one would cut rows from the end)."""
    check_int("n", n)
    return jax.tree.map(lambda a: a[:n], tree)
