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
