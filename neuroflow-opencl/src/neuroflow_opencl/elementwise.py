"""Elementwise kernels: one generated OpenCL C kernel per expression, dtypes and stride pattern.

Operands are views — (buffer, offset, strides) — broadcast to the output's
shape with zero strides; neighbouring dimensions every operand walks densely
are merged first, so the common cases (dense arrays, a bias row, a scalar)
compile to kernels that index with the global id alone.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from neuroflow_opencl.array import ClArray, empty, is_array
from neuroflow_opencl.cdtypes import c_type, preamble
from neuroflow_opencl.views import broadcast_shapes, broadcast_strides, collapse, contiguous_strides

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
    "clip": (3, "(a0 < a1) ? a1 : ((a0 > a2) ? a2 : a0)"), "where": (3, "(a0 != 0) ? a1 : a2"),
    "copy": (1, "a0"),
}
# Integer forms of the expressions above whose float form guards NaN (a self-comparison on integers).
INTEGER_FORMS = {"maximum": "(a0 > a1) ? a0 : a1", "minimum": "(a0 < a1) ? a0 : a1", "sign": "(a0 > 0) - (a0 < 0)"}
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
    arity, expr = UFUNCS[name]
    if len(operands) != arity:
        raise TypeError(f"{name} takes {arity} operands; got {len(operands)}")
    device = next((op.device for op in operands if is_array(op)), None)
    if device is None:
        device = out.device if out is not None else None
    operands = tuple(_scalar(op) if not is_array(op) else op for op in operands)
    result_dtype, compute = _result_types(name, tuple(_kind(op) for op in operands))
    if dtype is not None:
        result_dtype = compute = np.dtype(dtype)
    shape = broadcast_shapes(*(op.shape for op in operands if is_array(op)))
    if out is None:
        if device is None:
            raise TypeError(f"{name} needs at least one device array")
        out = empty(device, shape, result_dtype)
    else:
        if not is_array(out):
            raise TypeError(f"out= must be an opencl array; got {type(out).__name__}")
        if broadcast_shapes(shape, out.shape) != out.shape:
            raise ValueError(f"non-broadcastable output operand with shape {out.shape} doesn't match the "
                             f"broadcast shape {shape}")
        if not np.can_cast(result_dtype, out.dtype, "same_kind") and name != "copy":
            raise TypeError(f"cannot cast {name} output from {result_dtype} to {out.dtype} with casting rule "
                            "'same_kind'")
        shape = out.shape
    if np.dtype(compute).kind not in "biuf":
        raise TypeError(f"{name} has no opencl kernel for dtype {compute}")
    if np.dtype(compute).kind != "f":
        expr = INTEGER_FORMS.get(name, expr)
    run(out, expr, operands, compute, predicate=name in PREDICATES)
    return out


def _scalar(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value[()]
    if isinstance(value, (bool, int, float, np.generic)):
        return value
    raise TypeError(f"the opencl backend cannot mix device arrays with {type(value).__name__}; "
                    "copy it to the device first (xp.asarray)")


def run(out: ClArray, expr: str, operands: tuple[Any, ...], compute: Any, predicate: bool = False) -> None:
    """Evaluate ``expr`` (over ``a0``, ``a1``, ...) elementwise into ``out``."""
    shape = out.shape
    total = math.prod(shape)
    if total == 0:
        return
    arrays = [op for op in operands if is_array(op)]
    stride_sets = [out.estrides, *(broadcast_strides(a.shape, a.estrides, shape) for a in arrays)]
    cshape, csets = collapse(shape, stride_sets)
    dense = contiguous_strides(cshape)
    patterns = tuple("c" if s == dense else "s" if not any(s) else "g" for s in csets)
    kinds = tuple(str(op.dtype) if is_array(op) else "scalar" for op in operands)
    kernel = out.device.kernel(*_source(expr, str(out.dtype), str(np.dtype(compute)), kinds, len(cshape),
                                        patterns, predicate))
    args: list[Any] = [out.buffer, np.int64(out.offset), *(np.int64(s) for s in csets[0])]
    k = 1
    ctype = np.dtype(compute).type
    for op in operands:
        if is_array(op):
            args += [op.buffer, np.int64(op.offset), *(np.int64(s) for s in csets[k])]
            k += 1
        else:
            args.append(ctype(op))
    args += [np.int64(n) for n in cshape]
    kernel(out.device.queue, (total,), None, *args)


@cache
def _source(expr: str, out_dtype: str, compute: str, kinds: tuple[str, ...], ndim: int,
            patterns: tuple[str, ...], predicate: bool) -> tuple[str, str]:
    ct, ot = c_type(compute), c_type(out_dtype)
    params = [f"__global {ot}* out", "long out_off", *(f"long out_s{d}" for d in range(ndim))]
    loads = []
    p = 1
    for i, kind in enumerate(kinds):
        if kind == "scalar":
            params.append(f"{ct} a{i}")
            continue
        params += [f"__global const {c_type(kind)}* p{i}", f"long p{i}_off", *(f"long p{i}_s{d}" for d in range(ndim))]
        loads.append(f"    {ct} a{i} = ({ct})p{i}[p{i}_off + {_index(patterns[p], f'p{i}', ndim)}];")
        p += 1
    params += [f"long n{d}" for d in range(ndim)]
    value = f"({expr})"
    if np.dtype(out_dtype) == np.bool_ and not predicate:
        value = f"({value} != 0)"
    lines = ["    long gid = get_global_id(0);"]
    if "g" in patterns:
        lines.append("    long r = gid;")
        for d in reversed(range(ndim)):
            lines.append(f"    long i{d} = r % n{d}; r /= n{d};" if d else f"    long i{d} = r;")
    lines += loads
    lines.append(f"    out[out_off + {_index(patterns[0], 'out', ndim)}] = ({ot}){value};")
    name = "elementwise"
    source = preamble(out_dtype, compute, *(k for k in kinds if k != "scalar"))
    source += f"__kernel void {name}({', '.join(params)})\n{{\n" + "\n".join(lines) + "\n}\n"
    return source, name


def _index(pattern: str, prefix: str, ndim: int) -> str:
    if pattern == "c":
        return "gid"
    if pattern == "s":
        return "0"
    return " + ".join(f"i{d} * {prefix}_s{d}" for d in range(ndim))
