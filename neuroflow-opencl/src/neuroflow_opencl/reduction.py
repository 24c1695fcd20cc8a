"""Reductions: sum, mean, max, min, any, all over axes, and sums of products (dot, einsum).

One work item reduces one output element, walking the reduced axes through
their strides; when there are few outputs and many elements per output (a
BatchNorm statistic over N·H·W), the walk is split into partial results that
a second launch combines, so the device is not left with two busy threads.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

from neuroflow_opencl.array import ClArray, empty, is_array
from neuroflow_opencl.cdtypes import c_type, preamble
from neuroflow_opencl.views import Shape, collapse, contiguous_strides

_COMBINE = {
    "sum": "acc += v;",
    "max": "if (v > acc || v != v) acc = v;",
    "min": "if (v < acc || v != v) acc = v;",
    "any": "acc = acc || (v != 0);",
    "all": "acc = acc && (v != 0);",
    # numpy returns the first extreme, and the first NaN if there is one
    "argmax": "if ((v > acc || (v != v && acc == acc)) || j == 0) { acc = v; idx = j; }",
    "argmin": "if ((v < acc || (v != v && acc == acc)) || j == 0) { acc = v; idx = j; }",
}
# Integers have no NaN: the same choices without a self-comparison (which compilers warn about).
_INTEGER_COMBINE = {
    "max": "if (v > acc) acc = v;",
    "min": "if (v < acc) acc = v;",
    "argmax": "if (v > acc || j == 0) { acc = v; idx = j; }",
    "argmin": "if (v < acc || j == 0) { acc = v; idx = j; }",
}


def normalize_axes(axis: Any, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) or hasattr(axis, "__index__") else tuple(axis)
    result = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < ndim:
            raise ValueError(f"axis {a} is out of bounds for array of dimension {ndim}")
        result.append(a % ndim)
    if len(set(result)) != len(result):
        raise ValueError(f"duplicate value in axis {axis}")
    return tuple(sorted(result))


def reduce(kind: str, a: ClArray, axis: Any = None, keepdims: bool = False, out: ClArray | None = None,
           dtype: Any = None) -> ClArray:
    """``numpy.<kind>(a, axis, keepdims=..., out=...)`` on a device array."""
    axes = normalize_axes(axis, a.ndim)
    kept = [d for d in range(a.ndim) if d not in axes]
    out_shape = tuple(1 if d in axes else n for d, n in enumerate(a.shape)) if keepdims else tuple(a.shape[d] for d in kept)
    result_dtype = np.dtype(dtype) if dtype is not None else _result_dtype(kind, a.dtype)
    count = math.prod(a.shape[d] for d in axes)
    if kind in ("max", "min") and count == 0:
        raise ValueError(f"zero-size array to reduction operation {kind} which has no identity")
    order = (*kept, *axes)
    view = a.transpose(order)
    target = _output(a, out, out_shape, result_dtype)
    kept_view = target.reshape(tuple(a.shape[d] for d in kept)) if keepdims else target
    combine = "sum" if kind == "mean" else kind
    scale = 1.0 / count if kind == "mean" and count else None
    contract([view], "a0", combine, len(kept), kept_view, scale=scale)
    return target


def arg_reduce(kind: str, a: ClArray, axis: int | None = None, out: ClArray | None = None,
               keepdims: bool = False) -> ClArray:
    """``numpy.argmax``/``argmin``: the index of the first extreme along ``axis`` (of the flattened array for None)."""
    if a.size == 0:
        raise ValueError(f"attempt to get {kind} of an empty sequence")
    if axis is None:
        flat = a.reshape(-1)
        target = _output(a, out, (1,) * a.ndim if keepdims else (), np.dtype(np.int64))
        contract([flat], "a0", kind, 0, target.reshape(()))
        return target
    (axis,) = normalize_axes(axis, a.ndim)
    kept = [d for d in range(a.ndim) if d != axis]
    shape = tuple(1 if d == axis else n for d, n in enumerate(a.shape)) if keepdims else tuple(a.shape[d] for d in kept)
    target = _output(a, out, shape, np.dtype(np.int64))
    view = target.reshape(tuple(a.shape[d] for d in kept)) if keepdims else target
    contract([a.transpose((*kept, axis))], "a0", kind, len(kept), view)
    return target


def _output(a: ClArray, out: ClArray | None, shape: Shape, dtype: np.dtype) -> ClArray:
    if out is None:
        return empty(a.device, shape, dtype)
    if not is_array(out):
        raise TypeError(f"out= must be an opencl array; got {type(out).__name__}")
    if out.shape != shape:
        raise ValueError(f"output parameter has shape {out.shape}; the reduction gives {shape}")
    return out


def _result_dtype(kind: str, dtype: np.dtype) -> np.dtype:
    if kind in ("any", "all"):
        return np.dtype(np.bool_)
    if kind == "mean":
        return dtype if dtype.kind == "f" else np.dtype(np.float64)
    if kind == "sum" and dtype.kind in "bi":
        return np.dtype(np.int64)
    if kind == "sum" and dtype.kind == "u":
        return np.dtype(np.uint64)
    return dtype


def contract(inputs: Sequence[ClArray], expr: str, kind: str, kept: int, out: ClArray,
             scale: float | None = None) -> None:
    """Reduce ``expr`` (over ``a0``, ``a1``, ...) along every axis after the first ``kept`` into ``out``.

    Each input is a view whose first ``kept`` axes match ``out`` and whose
    remaining axes (the same for all inputs) are the ones reduced; broadcast
    axes have stride 0. ``dot`` and ``einsum`` are contractions with
    ``expr = "a0 * a1"``.
    """
    out_shape = tuple(out.shape)
    reduced_shape = tuple(inputs[0].shape[kept:])
    if any(tuple(x.shape[:kept]) != out_shape or tuple(x.shape[kept:]) != reduced_shape for x in inputs):
        raise ValueError("contraction operands disagree on their kept or reduced axes")
    if math.prod(out_shape) == 0:
        return
    count = math.prod(reduced_shape)
    oshape, osets = collapse(out_shape, [out.estrides, *(x.estrides[:kept] for x in inputs)])
    rshape, rsets = collapse(reduced_shape, [x.estrides[kept:] for x in inputs])
    device = out.device
    acc_dtype = _accumulator(kind, out.dtype, [x.dtype for x in inputs], device.facts.fp64)
    outputs = math.prod(oshape)
    parts = 1 if kind.startswith("arg") else _parts(outputs, count, device)
    if parts == 1:
        _launch(inputs, expr, kind, oshape, osets, rshape, rsets, out, 1, acc_dtype, scale)
        return
    # Stage 1 writes (parts, outputs) partial results; stage 2 reduces them over ``parts``.
    partial = empty(device, (parts, outputs), acc_dtype)
    _launch(inputs, expr, kind, oshape, [contiguous_strides(oshape), *osets[1:]], rshape, rsets, partial, parts,
            acc_dtype, None)
    partials = partial.view_at(partial.offset, (*oshape, parts), (*contiguous_strides(oshape), outputs))
    target = out.view_at(out.offset, oshape, osets[0])
    contract([partials], "a0", kind, len(oshape), target, scale)


def _parts(outputs: int, count: int, device: Any) -> int:
    wanted = 8192 if device.facts.kind == "gpu" else 16 * device.facts.compute_units
    if outputs >= wanted or count < 2048:
        return 1
    return max(1, min(wanted // outputs, count // 512))


def _accumulator(kind: str, out_dtype: np.dtype, in_dtypes: list[np.dtype], fp64: bool) -> np.dtype:
    if kind == "sum" and out_dtype.kind == "f":
        # float32 sums over N·H·W elements lose digits; double keeps parity with numpy's pairwise sum
        return np.dtype(np.float64) if fp64 else np.dtype(np.float32)
    if kind == "sum":
        return out_dtype
    # the others compare the values themselves: any/all must not read 0.5 as the integer 0 (False)
    return np.result_type(*in_dtypes)


def _launch(inputs: Sequence[ClArray], expr: str, kind: str, oshape: Shape, osets: Sequence[Shape],
            rshape: Shape, rsets: Sequence[Shape], out: ClArray, parts: int, acc_dtype: np.dtype,
            scale: float | None) -> None:
    """One launch of ``prod(oshape) * parts`` work items; part ``p`` of output ``o`` lands at ``o + p * prod(oshape)``."""
    device = out.device
    source, name = _source(expr, kind, tuple(x.dtype for x in inputs), out.dtype, np.dtype(acc_dtype),
                           len(oshape), len(rshape), scale is not None)
    kernel = device.kernel(source, name)
    outputs = math.prod(oshape)
    # every integer argument travels in one cached constant buffer (pocl charges ~9 µs per scalar argument)
    longs: list[int] = [out.offset, *osets[0], outputs if parts > 1 else 0]
    for x, os_, rs in zip(inputs, osets[1:], rsets):
        longs += [x.offset, *os_, *rs]
    longs += [*oshape, *rshape, parts, math.prod(rshape)]
    args: list[Any] = [out.buffer, *(x.buffer for x in inputs), device.constants(tuple(int(v) for v in longs))]
    if scale is not None:
        args.append(np.dtype(acc_dtype).type(scale))
    kernel(device.queue, (outputs * parts,), None, *args)


@cache
def _source(expr: str, kind: str, in_dtypes: tuple[np.dtype, ...], out_dtype: np.dtype, acc_dtype: np.dtype, ko: int, kr: int,
            scaled: bool) -> tuple[str, str]:
    at, ot = c_type(acc_dtype), c_type(out_dtype)
    params = ["__global " + ot + "* out", *(f"__global const {c_type(dt)}* p{i}" for i, dt in enumerate(in_dtypes)),
              "__constant long* kc"]
    longs = ["out_off", *(f"out_s{d}" for d in range(ko)), "part_stride"]
    for i in range(len(in_dtypes)):
        longs += [f"p{i}_off", *(f"p{i}_o{d}" for d in range(ko)), *(f"p{i}_r{d}" for d in range(kr))]
    longs += [*(f"on{d}" for d in range(ko)), *(f"rn{d}" for d in range(kr)), "parts", "count"]
    if scaled:
        params.append(f"{at} scale")
    lines = [f"    const long {name} = kc[{i}];" for i, name in enumerate(longs)]
    lines += ["    long gid = get_global_id(0);", "    long total = 1;"]
    lines += [f"    total *= on{d};" for d in range(ko)]
    lines += ["    long o = gid % total;", "    long part = gid / total;", "    long r = o;"]
    for d in reversed(range(ko)):
        lines.append(f"    long i{d} = r % on{d}; r /= on{d};")
    for i in range(len(in_dtypes)):
        lines.append(f"    long b{i} = " + " + ".join([f"p{i}_off", *(f"i{d} * p{i}_o{d}" for d in range(ko))]) + ";")
    lines.append(f"    {at} acc = {_identity(kind, acc_dtype, at)};")
    if kind.startswith("arg"):
        lines.append("    long idx = 0;")
    lines.append("    for (long j = part; j < count; j += parts) {")
    lines.append("        long q = j;")
    for d in reversed(range(kr)):
        lines.append(f"        long k{d} = q % rn{d}; q /= rn{d};")
    for i, dt in enumerate(in_dtypes):
        # the expression sees values in their own type (a count of "a0 != 0" must not first cast 0.3 to 0)
        offset = " + ".join([f"b{i}", *(f"k{d} * p{i}_r{d}" for d in range(kr))])
        lines.append(f"        {c_type(dt)} a{i} = p{i}[{offset}];")
    lines.append(f"        {at} v = ({at})({expr});")
    combine = _COMBINE[kind] if np.dtype(acc_dtype).kind == "f" else _INTEGER_COMBINE.get(kind, _COMBINE[kind])
    lines.append(f"        {combine}")
    lines.append("    }")
    if scaled:
        lines.append("    acc *= scale;")
    store = " + ".join(["out_off", "part * part_stride", *(f"i{d} * out_s{d}" for d in range(ko))])
    lines.append(f"    out[{store}] = ({ot}){'idx' if kind.startswith('arg') else 'acc'};")
    name = f"reduce_{kind}"
    source = preamble(acc_dtype, out_dtype, *in_dtypes)
    source += f"__kernel void {name}({', '.join(params)})\n{{\n" + "\n".join(lines) + "\n}\n"
    return source, name


_LIMITS = {"char": ("CHAR_MIN", "CHAR_MAX"), "uchar": ("0", "UCHAR_MAX"), "short": ("SHRT_MIN", "SHRT_MAX"),
           "ushort": ("0", "USHRT_MAX"), "int": ("INT_MIN", "INT_MAX"), "uint": ("0", "UINT_MAX"),
           "long": ("LONG_MIN", "LONG_MAX"), "ulong": ("0", "ULONG_MAX")}


def _identity(kind: str, acc_dtype: np.dtype, at: str) -> str:
    floating = np.dtype(acc_dtype).kind == "f"
    if kind == "max":
        return "-INFINITY" if floating else _LIMITS[at][0]
    if kind == "min":
        return "INFINITY" if floating else _LIMITS[at][1]
    return {"sum": "0", "any": "0", "all": "1", "argmax": "0", "argmin": "0"}[kind]
