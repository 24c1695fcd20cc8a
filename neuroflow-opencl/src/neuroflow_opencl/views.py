"""Stride arithmetic for views of one buffer: basic indexing, reshape without copy, dimension collapsing.

Everything here is in elements, not bytes, and knows nothing about OpenCL,
so it is exercised on plain tuples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

Shape = tuple[int, ...]


def contiguous_strides(shape: Sequence[int]) -> Shape:
    """C-order strides (in elements) of a dense array of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a view is dense in C order (size-1 dimensions may have any stride)."""
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def normalize_shape(shape: Any, size: int | None = None) -> Shape:
    """``shape`` as a tuple, with one ``-1`` resolved against ``size``."""
    if type(shape) is tuple:  # what ops pass, the same few every step: remembered (a step reshapes ~10 times)
        try:
            return _normalized(shape, size)
        except TypeError:  # an unhashable size in the tuple: resolved below, which says what is wrong
            pass
    return _normalize(shape, size)


def _normalize(shape: Any, size: int | None) -> Shape:
    if isinstance(shape, (int,)) or hasattr(shape, "__index__"):
        shape = (int(shape),)
    dims = [int(d) for d in shape]
    if dims.count(-1) > 1:
        raise ValueError(f"can only specify one unknown dimension; got shape {tuple(dims)}")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if size is None or known == 0 or size % known:
            raise ValueError(f"cannot reshape array of size {size} into shape {tuple(dims)}")
        dims[dims.index(-1)] = size // known
    if any(d < 0 for d in dims):
        raise ValueError(f"negative dimensions are not allowed: {tuple(dims)}")
    if size is not None and math.prod(dims) != size:
        raise ValueError(f"cannot reshape array of size {size} into shape {tuple(dims)}")
    return tuple(dims)


_normalized = lru_cache(maxsize=4096)(_normalize)


@lru_cache(maxsize=4096)
def reshape_strides(shape: Shape, strides: Shape, new_shape: Shape) -> Shape | None:
    """Strides that show the same elements as ``new_shape`` without a copy, or None when a copy is needed.

    Groups of old dimensions are matched to groups of new ones with equal
    products; a group can be re-split only if it is dense within itself.
    """
    if math.prod(shape) == 0:
        return contiguous_strides(new_shape)
    old_dims = [n for n in shape if n != 1]
    old_strides = [s for n, s in zip(shape, strides) if n != 1]
    new = list(new_shape)
    out = [0] * len(new)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new) and oi < len(old_dims):
        new_prod, old_prod = new[ni], old_dims[oi]
        while new_prod != old_prod:
            if new_prod < old_prod:
                new_prod *= new[nj]
                nj += 1
            else:
                old_prod *= old_dims[oj]
                oj += 1
        for k in range(oi, oj - 1):
            if old_strides[k] != old_dims[k + 1] * old_strides[k + 1]:
                return None
        out[nj - 1] = old_strides[oj - 1]
        for k in range(nj - 1, ni, -1):
            out[k - 1] = out[k] * new[k]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    return tuple(out)


def basic_index(shape: Shape, strides: Shape, key: Any) -> tuple[int, Shape, Shape]:
    """(offset delta, shape, strides) of ``array[key]`` for ints, slices, None and Ellipsis."""
    if not isinstance(key, tuple):
        key = (key,)
    explicit = sum(1 for k in key if k is not None and k is not Ellipsis)
    if explicit > len(shape):
        raise IndexError(f"too many indices: array is {len(shape)}-dimensional, but {explicit} were indexed")
    if sum(1 for k in key if k is Ellipsis) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    expanded: list[Any] = []
    for k in key:
        if k is Ellipsis:
            expanded.extend([slice(None)] * (len(shape) - explicit))
        else:
            expanded.append(k)
    expanded.extend([slice(None)] * (len(shape) - sum(1 for k in expanded if k is not None)))
    offset, dim = 0, 0
    out_shape: list[int] = []
    out_strides: list[int] = []
    for k in expanded:
        if k is None:
            out_shape.append(1)
            out_strides.append(0)
            continue
        n, s = shape[dim], strides[dim]
        if isinstance(k, slice):
            start, stop, step = k.indices(n)
            length = len(range(start, stop, step))
            offset += start * s if length else 0
            out_shape.append(length)
            out_strides.append(s * step)
        else:
            i = int(k.__index__())
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {dim} with size {n}")
            offset += (i % n) * s
        dim += 1
    return offset, tuple(out_shape), tuple(out_strides)


def broadcast_shapes(*shapes: Shape) -> Shape:
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(-ndim, 0):
        sizes = {s[axis] for s in shapes if len(s) >= -axis and s[axis] != 1}
        if len(sizes) > 1:
            raise ValueError(f"operands could not be broadcast together with shapes {' '.join(map(str, shapes))}")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def broadcast_strides(shape: Shape, strides: Shape, target: Shape) -> Shape:
    """Strides of a view of ``shape`` broadcast to ``target`` (0 along stretched dimensions)."""
    lead = len(target) - len(shape)
    if lead < 0:
        raise ValueError(f"cannot broadcast shape {shape} to {target}")
    out = [0] * lead
    for n, s, t in zip(shape, strides, target[lead:]):
        if n == t:
            out.append(s if t != 1 else 0)
        elif n == 1:
            out.append(0)
        else:
            raise ValueError(f"cannot broadcast shape {shape} to {target}")
    return tuple(out)


def collapse(shape: Shape, stride_sets: Sequence[Shape]) -> tuple[Shape, list[Shape]]:
    """Merge neighbouring dimensions that every operand walks densely, and drop size-1 dimensions.

    A broadcast add over a (64, 128) output usually collapses to one
    dimension, so the kernel does no division or modulo per element.
    """
    dims = [(n, [s[d] for s in stride_sets]) for d, n in enumerate(shape) if n != 1]
    if not dims:
        return (), [() for _ in stride_sets]
    merged = [dims[0]]
    for n, ss in dims[1:]:
        pn, pss = merged[-1]
        if all(p == s * n for p, s in zip(pss, ss)):
            merged[-1] = (pn * n, ss)
        else:
            merged.append((n, ss))
    new_shape = tuple(n for n, _ in merged)
    return new_shape, [tuple(ss[i] for _, ss in merged) for i in range(len(stride_sets))]
