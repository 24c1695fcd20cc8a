"""numpy dtypes and the OpenCL C types that hold them."""

from __future__ import annotations

from typing import Any

import numpy as np

_C_TYPES = {
    np.dtype(np.float32): "float", np.dtype(np.float64): "double",
    np.dtype(np.int8): "char", np.dtype(np.uint8): "uchar", np.dtype(np.bool_): "uchar",
    np.dtype(np.int16): "short", np.dtype(np.uint16): "ushort",
    np.dtype(np.int32): "int", np.dtype(np.uint32): "uint",
    np.dtype(np.int64): "long", np.dtype(np.uint64): "ulong",
}


def c_type(dtype: Any) -> str:
    """The OpenCL C type for ``dtype``; bool is stored as one byte (0 or 1), as numpy does."""
    dt = np.dtype(dtype)
    try:
        return _C_TYPES[dt]
    except KeyError:
        supported = ", ".join(sorted({str(d) for d in _C_TYPES}))
        raise TypeError(f"the opencl backend has no kernels for dtype {dt}; supported: {supported}") from None


def supported(dtype: Any) -> bool:
    return np.dtype(dtype) in _C_TYPES


def preamble(*dtypes: Any) -> str:
    """The pragma a kernel needs when any of ``dtypes`` is double precision."""
    if any(np.dtype(d) == np.float64 for d in dtypes):
        return "#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n"
    return ""


def vector_types(*types: str, widths: tuple[int, ...]) -> str:
    """Typedefs ``<type><width>_u``: each vector type aligned as its element, for ``vector_load``/``vector_store``."""
    return "".join(f"typedef {t}{w} __attribute__((aligned(sizeof({t})))) {t}{w}_u;\n"
                   for t in dict.fromkeys(types) for w in dict.fromkeys(widths))


def vector_load(t: str, width: int, address: str) -> str:
    """A load of ``width`` elements of type ``t`` from ``address`` (any element offset), as ``vload<width>`` reads.

    Through a pointer to the element-aligned vector type (``vector_types``), the compiler emits one vector
    instruction; pocl 3.0 instead calls ``vloadN``/``vstoreN`` (like its other builtins) as functions, and a
    call spills every vector register: the MLP's first-layer GEMM ran 4× slower with them.
    """
    return f"(*(__global const {t}{width}_u*)({address}))"


def vector_store(t: str, width: int, value: str, address: str) -> str:
    """The statement storing the ``width``-vector ``value`` at ``address`` (see ``vector_load``)."""
    return f"*(__global {t}{width}_u*)({address}) = {value};"
