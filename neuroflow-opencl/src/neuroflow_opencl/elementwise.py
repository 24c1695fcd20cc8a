"""Elementwise kernels: one generated OpenCL C kernel per expression, dtypes and stride pattern.

Operands are views — (buffer, offset, strides) — broadcast to the output's
shape with zero strides; neighbouring dimensions every operand walks densely
are merged first, so the common cases (dense arrays, a bias row, a scalar)
compile to kernels that index with the global id alone.

Strided kernels give each work item a run of up to ``RUN`` elements along the
last (collapsed) dimension and split only the row index into the other
dimensions, in 32-bit arithmetic when the sizes allow: on pocl the per-element
64-bit divisions of one work item per element made a 7-d im2col copy run at
~55 M elements/s. Offsets, strides and sizes reach a kernel in one ``Device.constants``
buffer, scalar operands in another, not as scalar arguments (pocl sets each of those in ~9 µs).
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from neuroflow_opencl import transpose
from neuroflow_opencl.array import ClArray, empty, is_array, overlaps
from neuroflow_opencl.cdtypes import c_type, preamble
from neuroflow_opencl.views import Shape, broadcast_shapes, broadcast_strides, collapse, contiguous_strides

# numpy name -> (arity, C expression over a0, a1, ... already converted to the compute type)
UFUNCS: dict[str, tuple[int, str]] = {
    "add": (2, "a0 + a1"), "subtract": (2, "a0 - a1"), "multiply": (2, "a0 * a1"), "divide": (2, "a0 / a1"),
    "true_divide": (2, "a0 / a1"), "power": (2, "pow(a0, a1)"),
    # NaN must win, as in numpy, or a diverging network would look healthy after a ReLU
    "maximum": (2, "((a0 > a1) || (a0 != a0)) ? a0 : a1"), "minimum": (2, "((a0 < a1) || (a0 != a0)) ? a0 : a1"),
    "greater": (2, "a0 > a1"), "greater_equal": (2, "a0 >= a1"), "less": (2, "a0 < a1"),
    "less_equal": (2, "a0 <= a1"), "equal": (2, "a0 == a1"), "not_equal": (2, "a0 != a1"),
    "logical_and": (2, "(a0 != 0) && (a1 != 0)"), "logical_or": (2, "(a0 != 0) || (a1 != 0)"),
    "negative": (1, "-a0"), "positive": (1, "a0"), "absolute": (1, "a0 < 0 ? -a0 : a0"),
    "exp": (1, "exp(a0)"), "log": (1, "log(a0)"), "tanh": (1, "tanh(a0)"), "sqrt": (1, "sqrt(a0)"),
    "floor": (1, "floor(a0)"), "ceil": (1, "ceil(a0)"), "cos": (1, "cos(a0)"), "sin": (1, "sin(a0)"),
    "square": (1, "a0 * a0"), "reciprocal": (1, "1 / a0"),
    "sign": (1, "(a0 > 0) ? 1 : ((a0 < 0) ? -1 : (a0 == a0 ? 0 : a0))"),
    "isfinite": (1, "isfinite(a0)"), "isnan": (1, "isnan(a0)"), "logical_not": (1, "a0 == 0"),
    "clip": (3, "(((a0 < a1) ? a1 : a0) > a2) ? a2 : ((a0 < a1) ? a1 : a0)"), "where": (3, "(a0 != 0) ? a1 : a2"),
    "copy": (1, "a0"),
}
RUN = 64  # most elements of the last dimension one work item of a strided kernel walks
# Integer forms of the expressions above whose float form guards NaN (a self-comparison on integers).
INTEGER_FORMS = {"maximum": "(a0 > a1) ? a0 : a1", "minimum": "(a0 < a1) ? a0 : a1", "sign": "(a0 > 0) - (a0 < 0)",
                 "floor": "a0", "ceil": "a0"}
# Their result is bool whatever the inputs; the comparison itself runs in the inputs' common type.
PREDICATES = {"greater", "greater_equal", "less", "less_equal", "equal", "not_equal", "isfinite", "isnan",
              "logical_and", "logical_or", "logical_not"}
# Integer inputs need a float type for these C functions (isfinite of an int is always true in numpy).
FLOAT_FUNCTIONS = {"exp", "log", "tanh", "sqrt", "floor", "ceil", "cos", "sin", "isfinite", "isnan", "power"}


def _dummy(operand: Any) -> Any:
    if is_array(operand):
        return np.ones(1, operand.dtype)
    if isinstance(operand, np.generic):
        return operand.dtype.type(1)
    return type(operand)(1)


@cache
def _result_types(name: str, kinds: tuple[Any, ...]) -> tuple[np.dtype, np.dtype]:
    """(result dtype, compute dtype) as numpy's promotion rules give them (Python scalars are weak)."""
    dummies = [np.ones(1, k) if isinstance(k, np.dtype) else k(1) for k in kinds]
    if name == "copy":
        result = np.asarray(dummies[0]).dtype
    elif name == "clip":
        result = np.clip(*dummies).dtype
    elif name == "where":
        result = np.result_type(*dummies[1:])
    else:
        result = getattr(np, name)(*dummies).dtype
    if name in PREDICATES:
        compute = np.result_type(*dummies)
        if name in FLOAT_FUNCTIONS and compute.kind not in "f":
            compute = np.dtype(np.float64)
        return result, compute
    return result, result


def _kind(operand: Any) -> Any:
    if is_array(operand):
        return operand.dtype
    if isinstance(operand, np.generic):
        return operand.dtype
    if isinstance(operand, bool):
        return bool
    if isinstance(operand, int):
        return int
    if isinstance(operand, float):
        return float
    raise TypeError(f"the opencl backend cannot use an operand of type {type(operand).__name__}")


def apply(name: str, *operands: Any, out: ClArray | None = None, dtype: Any = None) -> ClArray:
    """``numpy.<name>(*operands, out=out)`` on device arrays (and Python/numpy scalars)."""
    operands = tuple(op if isinstance(op, ClArray) else _scalar(op) for op in operands)
    if out is not None:  # numpy reads an input that overlaps ``out`` as it was before the call
        operands = tuple(op.copy() if isinstance(op, ClArray) and overlaps(op, out) else op for op in operands)
    # The device is part of the key: a plan's kernel (a transposing copy's) and its vector width are a device's.
    key = (name, dtype, None if out is None else (out.dtype, out.shape, out.estrides, out.device),
           *((op.dtype, op.shape, op.estrides, op.device) if isinstance(op, ClArray) else type(op) for op in operands))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _plan(name, operands, out, dtype)
    if out is None:
        device = next(op.device for op in operands if isinstance(op, ClArray))
        out = empty(device, plan.shape, plan.dtype)
    plan.launch(out, operands)
    return out


class _Plan:
    """Everything about a launch that depends only on dtypes, shapes and strides, computed once."""

    def __init__(self, shape: Shape, dtype: np.dtype, compute: np.dtype, source: tuple[str, str], total: int,
                 items: int, stride_args: list[tuple[int, ...]], shape_args: tuple[int, ...]) -> None:
        self.shape, self.dtype, self.compute, self.source, self.total = shape, dtype, compute, source, total
        self.items, self.stride_args, self.shape_args = items, stride_args, shape_args

    def launch(self, out: ClArray, operands: tuple[Any, ...]) -> None:
        if not self.total:
            return
        strides = self.stride_args
        args: list[Any] = [out.buffer]
        longs = [out.offset, *strides[0]]
        scalars = []
        k = 1
        for op in operands:
            if isinstance(op, ClArray):
                args.append(op.buffer)
                longs += [op.offset, *strides[k]]
                k += 1
            else:
                scalars.append(op)
        device = out.device
        args.append(device.constants((*longs, *self.shape_args)))
        if scalars:
            args.append(device.constants(tuple(scalars), self.compute))
        device.kernel(*self.source)(device.queue, (self.items,), None, *args)


_PLANS: dict[Any, _Plan | transpose.Plan] = {}


def _plan(name: str, operands: tuple[Any, ...], out: ClArray | None, dtype: Any) -> _Plan | transpose.Plan:
    try:
        arity, expr = UFUNCS[name]
    except KeyError:
        raise AttributeError(f"the opencl namespace has no elementwise function {name!r}") from None
    if len(operands) != arity:
        raise TypeError(f"{name} takes {arity} operands; got {len(operands)}")
    arrays = [op for op in operands if isinstance(op, ClArray)]
    if not arrays and out is None:
        raise TypeError(f"{name} needs at least one device array")
    result_dtype, compute = _result_types(name, tuple(_kind(op) for op in operands))
    if dtype is not None:
        result_dtype = compute = np.dtype(dtype)
        if name == "copy" and compute == np.bool_ and arrays:
            compute = arrays[0].dtype  # to bool is "!= 0": 0.5 must not become the integer 0 first
    shape = broadcast_shapes(*(a.shape for a in arrays))
    if out is not None:
        if broadcast_shapes(shape, out.shape) != out.shape:
            raise ValueError(f"non-broadcastable output operand with shape {out.shape} doesn't match the "
                             f"broadcast shape {shape}")
        if name != "copy" and not np.can_cast(result_dtype, out.dtype, "same_kind"):
            raise TypeError(f"cannot cast {name} output from {result_dtype} to {out.dtype} with casting rule "
                            "'same_kind'")
        shape, result_dtype = out.shape, out.dtype
    if compute.kind not in "biuf":
        raise TypeError(f"{name} has no opencl kernel for dtype {compute}")
    if name == "power" and compute.kind != "f":
        raise TypeError(f"power on the opencl backend needs floating-point operands; got {compute} "
                        "(convert with astype(np.float32))")
    if compute.kind != "f":
        expr = INTEGER_FORMS.get(name, expr)
    out_strides = out.estrides if out is not None else contiguous_strides(shape)
    return _geometry(shape, out_strides, result_dtype, operands, expr, compute, name in PREDICATES)


def _geometry(shape: Shape, out_strides: Shape, out_dtype: np.dtype, operands: tuple[Any, ...], expr: str,
              compute: np.dtype, predicate: bool) -> _Plan | transpose.Plan:
    arrays = [op for op in operands if isinstance(op, ClArray)]
    stride_sets = [out_strides, *(broadcast_strides(a.shape, a.estrides, shape) for a in arrays)]
    cshape, csets = collapse(shape, stride_sets)
    if (expr == "a0" and len(operands) == len(arrays) == 1 and compute == out_dtype
            and transpose.fits(cshape, csets, (out_dtype, arrays[0].dtype), arrays[0].device)):
        return transpose.Plan(shape, cshape, csets, out_dtype, arrays[0].device)
    dense = contiguous_strides(cshape)
    patterns = tuple("c" if s == dense else "s" if not any(s) else "g" for s in csets)
    kinds = tuple(op.dtype if isinstance(op, ClArray) else None for op in operands)
    total = math.prod(shape)
    # dense operands index with the global id alone: their strides are not passed at all
    stride_args = [tuple(int(x) for x in s) if p == "g" else () for s, p in zip(csets, patterns)]
    shape_args: tuple[int, ...] = ()
    items = total
    if "g" in patterns:
        last = cshape[-1] if cshape else 1
        blocks = max(-(-last // RUN), 1)  # an empty array launches nothing but still gets a plan
        run_length = -(-last // blocks)  # even runs: 65 elements are 33 + 32, not 64 + 1
        items = total // max(last, 1) * blocks
        shape_args = (*(int(n) for n in cshape), blocks, run_length)
    narrow = items < 2**31 and all(n < 2**31 for n in cshape)
    source = _source(expr, out_dtype, np.dtype(compute), kinds, len(cshape), patterns, predicate, narrow)
    return _Plan(shape, out_dtype, np.dtype(compute), source, total, items, stride_args, shape_args)


def copy_plan(out: ClArray, src: ClArray) -> _Plan | transpose.Plan:
    """The plan ``out.assign(src)`` runs, for a caller that copies between these layouts again and again:
    ``plan.launch(out, (src,))`` copies without the checks (the caller knows that the two do not overlap)."""
    key = ("copy", out.dtype, (out.dtype, out.shape, out.estrides, out.device), (src.dtype, src.shape, src.estrides, src.device))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _plan("copy", (src,), out, out.dtype)
    return plan


def _scalar(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value[()]
    if isinstance(value, (bool, int, float, np.generic)):
        return value
    raise TypeError(f"the opencl backend cannot mix device arrays with {type(value).__name__}; "
                    "copy it to the device first (xp.asarray)")


def run(out: ClArray, expr: str, operands: tuple[Any, ...], compute: Any, predicate: bool = False) -> None:
    """Evaluate the C expression ``expr`` (over ``a0``, ``a1``, ... and ``gid``) elementwise into ``out``."""
    key = ("expr", expr, np.dtype(compute), predicate, (out.dtype, out.shape, out.estrides, out.device),
           *((op.dtype, op.shape, op.estrides, op.device) if isinstance(op, ClArray) else type(op) for op in operands))
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _geometry(out.shape, out.estrides, out.dtype, operands, expr, np.dtype(compute),
                                       predicate)
    plan.launch(out, operands)


def arange(device: Any, start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> ClArray:
    """``numpy.arange`` on ``device``: one elementwise kernel over the global id."""
    if stop is None:
        start, stop = 0, start
    n = max(0, math.ceil((stop - start) / step))
    dtype = np.dtype(dtype) if dtype is not None else np.arange(start, start + step, step).dtype
    out = empty(device, (n,), dtype)
    if n:
        run(out, "a0 + gid * a1", (start, step), dtype)
    return out


@cache
def _source(expr: str, out_dtype: np.dtype, compute: np.dtype, kinds: tuple[np.dtype | None, ...], ndim: int,
            patterns: tuple[str, ...], predicate: bool, narrow: bool = False) -> tuple[str, str]:
    ct, ot = c_type(compute), c_type(out_dtype)
    strided = "g" in patterns
    params = [f"__global {ot}* out"]
    longs = ["out_off", *_stride_params("out", patterns[0], ndim)]  # read from P, in the order launch packs them
    names = ["out"]
    loads = []
    scalars: list[str] = []
    p = 1
    for i, kind in enumerate(kinds):
        if kind is None:
            scalars.append(f"    const {ct} a{i} = S[{len(scalars)}];")
            continue
        params.append(f"__global const {c_type(kind)}* p{i}")
        longs += [f"p{i}_off", *_stride_params(f"p{i}", patterns[p], ndim)]
        loads.append(f"{ct} a{i} = ({ct})p{i}[{_at(patterns[p], f'p{i}', ndim)}];")
        names.append(f"p{i}")
        p += 1
    value = f"({expr})"
    if out_dtype == np.bool_ and not predicate:
        value = f"({value} != 0)"
    store = f"out[{_at(patterns[0], 'out', ndim)}] = ({ot}){value};"
    if strided:
        longs += [f"n{d}_arg" for d in range(ndim)] + ["blocks_arg", "run_arg"]
    params.append("__global const long* restrict P")
    if scalars:  # scalar operands come from a cached buffer too: pocl sets a scalar argument in ~9 µs
        params.append(f"__global const {ct}* restrict S")
    lines = [f"    const long {name} = P[{i}];" for i, name in enumerate(longs)] + scalars
    if not strided:
        lines += ["    long gid = get_global_id(0);", *(f"    {line}" for line in loads), f"    {store}"]
    else:
        ix = "int" if narrow else "long"  # 32-bit divisions are several times cheaper on CPUs
        last = ndim - 1
        lines += [f"    const {ix} n{d} = ({ix})n{d}_arg;" for d in range(ndim)]
        lines += [f"    const {ix} blocks = ({ix})blocks_arg, run = ({ix})run_arg;",
                  f"    const {ix} item = ({ix})get_global_id(0);",
                  f"    {ix} r = item / blocks;",
                  f"    const {ix} j0 = (item - r * blocks) * run;",
                  f"    const {ix} j1 = min(j0 + run, n{last});",
                  f"    const long row = (long)r * n{last};"]
        for d in reversed(range(last)):
            lines.append(f"    const {ix} i{d} = r % n{d}; r /= n{d};" if d else f"    const {ix} i{d} = r;")
        for name, pattern in zip(names, patterns):
            if pattern == "g":
                terms = "".join(f" + (long)i{d} * {name}_s{d}" for d in range(last))
                lines.append(f"    const long {name}_row = {name}_off{terms};")
        lines += [f"    for ({ix} i{last} = j0; i{last} < j1; ++i{last}) {{",
                  f"        const long gid = row + i{last};",
                  *(f"        {line}" for line in loads), f"        {store}", "    }"]
    source = preamble(out_dtype, compute, *(k for k in kinds if k is not None))
    source += f"__kernel void elementwise({', '.join(params)})\n{{\n" + "\n".join(lines) + "\n}\n"
    return source, "elementwise"


def _stride_params(prefix: str, pattern: str, ndim: int) -> list[str]:
    return [f"{prefix}_s{d}" for d in range(ndim)] if pattern == "g" else []


def _at(pattern: str, prefix: str, ndim: int) -> str:
    """The element of operand ``prefix`` that element ``gid`` (in a strided kernel, i{ndim-1} of a run) reads or writes."""
    if pattern == "c":
        return f"{prefix}_off + gid"
    if pattern == "s":
        return f"{prefix}_off"
    return f"{prefix}_row + i{ndim - 1} * {prefix}_s{ndim - 1}"
