"""Integer-array indexing: gather (``a[rows, cols]``), scatter (``a[rows, cols] = v``), take_along_axis.

Index arrays are turned into element offsets on the device (one fused
kernel per index), then one kernel moves the elements. Indices are clamped
into the array on the device — an out-of-range index read from device memory
cannot be reported without a host wait, but must never touch memory outside
the array; host (numpy) index arrays are checked and reported like numpy.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from neuroflow_opencl.array import ClArray, empty, is_array
from neuroflow_opencl.cdtypes import c_type, preamble
from neuroflow_opencl.elementwise import arange, run
from neuroflow_opencl.transfer import from_host
from neuroflow_opencl.views import broadcast_shapes, collapse


def _offsets(a: ClArray, key: Any) -> tuple[ClArray, tuple[int, ...], int]:
    """(element offsets of the indexed rows, trailing shape, trailing stride) for an all-integer-array key."""
    keys = key if isinstance(key, tuple) else (key,)
    if len(keys) > a.ndim:
        raise IndexError(f"too many indices: array is {a.ndim}-dimensional, but {len(keys)} were indexed")
    indices = []
    for axis, k in enumerate(keys):
        if isinstance(k, (list, np.ndarray)):
            host = np.asarray(k)
            if host.dtype.kind not in "iu":
                raise IndexError("arrays used as indices must be of integer type")
            n = a.shape[axis]
            if host.size and (host.min() < -n or host.max() >= n):
                raise IndexError(f"index out of bounds for axis {axis} with size {n}")
            k = from_host(a.device, host.astype(np.int64))
        elif not is_array(k):
            raise IndexError("the opencl backend indexes with integer arrays on every indexed axis "
                             f"(got {type(k).__name__} at axis {axis}); use a view for slices")
        elif k.dtype.kind not in "iu":
            raise IndexError("arrays used as indices must be of integer type")
        indices.append(k)
    shape = broadcast_shapes(*(k.shape for k in indices))
    offsets = empty(a.device, shape, np.int64)
    offsets.fill(0)
    for axis, k in enumerate(indices):
        n, stride = a.shape[axis], a.estrides[axis]
        # wrap negatives as numpy does, clamp the rest so a bad device index stays inside the array
        wrapped = f"((a1 < 0) ? a1 + {n} : a1)"
        clamped = f"clamp({wrapped}, 0L, {n - 1}L)"
        run(offsets, f"{clamped} * {stride} + a0", (offsets, k), np.int64)
    trailing_shape = a.shape[len(indices):]
    tshape, (tstrides,) = collapse(trailing_shape, [a.estrides[len(indices):]])
    if len(tshape) > 1:
        raise IndexError("the opencl backend needs the axes after an integer-array index to be walkable with one stride")
    return offsets, trailing_shape, tstrides[0] if tstrides else 0


def gather(a: ClArray, key: Any) -> ClArray:
    offsets, trailing, tstride = _offsets(a, key)
    out = empty(a.device, (*offsets.shape, *trailing), a.dtype)
    _move(a, offsets, out, math.prod(trailing), tstride, scatter=False)
    return out


def scatter(a: ClArray, key: Any, value: Any) -> None:
    """``a[key] = value`` with integer-array ``key``; with repeated indices the last write wins, as in numpy."""
    offsets, trailing, tstride = _offsets(a, key)
    dense = empty(a.device, (*offsets.shape, *trailing), a.dtype)
    dense.assign(value)
    _move(a, offsets, dense, math.prod(trailing), tstride, scatter=True)


def take_along_axis(a: ClArray, indices: ClArray, axis: int) -> ClArray:
    """numpy.take_along_axis: ``indices`` picks along ``axis``; every other axis is matched position by position."""
    if indices.ndim != a.ndim:
        raise ValueError(f"indices and arr must have the same number of dimensions; got {indices.ndim} and {a.ndim}")
    axis = axis % a.ndim
    key = []
    for d in range(a.ndim):
        if d == axis:
            key.append(indices)
        else:
            shape = [1] * a.ndim
            shape[d] = a.shape[d]
            key.append(arange(a.device, a.shape[d]).reshape(shape))
    return gather(a, tuple(key))


def _move(a: ClArray, offsets: ClArray, dense: ClArray, trailing: int, tstride: int, scatter: bool) -> None:
    total = offsets.size * trailing
    if total == 0:
        return
    kernel = a.device.kernel(*_source(a.dtype, scatter))
    kernel(a.device.queue, (total,), None, a.buffer, np.int64(a.offset), offsets.buffer, np.int64(offsets.offset),
           dense.buffer, np.int64(dense.offset), np.int64(trailing), np.int64(tstride))


@cache
def _source(dtype: Any, scatter: bool) -> tuple[str, str]:
    t = c_type(dtype)
    move = "src[src_off + at] = dense[dense_off + gid];" if scatter else "dense[dense_off + gid] = src[src_off + at];"
    source = preamble(dtype) + f"""__kernel void move(__global {t}* src, long src_off, __global const long* offsets,
                   long offsets_off, __global {t}* dense, long dense_off, long trailing, long tstride)
{{
    long gid = get_global_id(0);
    long at = offsets[offsets_off + gid / trailing] + (gid % trailing) * tstride;
    {move}
}}
"""
    return source, "move"
