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


#: The build option under which ``vector_load``/``vector_store`` go through element-aligned vector pointers.
ELEMENT_ALIGNED_VECTORS = "NF_ELEMENT_ALIGNED_VECTORS"


def vector_types(*types: str, widths: tuple[int, ...]) -> str:
    """The macros ``vector_load``/``vector_store`` expand to, for each type and width.

    Built with ``-D NF_ELEMENT_ALIGNED_VECTORS`` (pocl, see :func:`element_aligned_vectors`), an access is
    a dereference of a pointer to the vector type typedef'd with its element's alignment, which clang
    turns into one vector instruction; pocl 3.0 instead calls ``vloadN``/``vstoreN`` (like its other
    builtins) as functions, and a call spills every vector register: the MLP's first-layer GEMM ran 4×
    slower with them. Other drivers get the standard ``vloadN``/``vstoreN``, which every OpenCL C
    compiler accepts at any element offset.
    """
    aligned, standard = [], []
    for t in dict.fromkeys(types):
        for w in dict.fromkeys(widths):
            v = f"{t}{w}"
            aligned += [f"typedef {v} __attribute__((aligned(sizeof({t})))) {v}_u;",
                        f"#define NF_LOAD_{v}(p) (*(__global const {v}_u*)(p))",
                        f"#define NF_STORE_{v}(v, p) (*(__global {v}_u*)(p) = (v))"]
            standard += [f"#define NF_LOAD_{v}(p) vload{w}(0, (__global const {t}*)(p))",
                         f"#define NF_STORE_{v}(v, p) vstore{w}((v), 0, (__global {t}*)(p))"]
    return "\n".join([f"#ifdef {ELEMENT_ALIGNED_VECTORS}", *aligned, "#else", *standard, "#endif", ""])


def vector_load(t: str, width: int, address: str) -> str:
    """A load of ``width`` elements of type ``t`` from ``address`` (any element offset), as ``vload<width>``
    reads (the macro :func:`vector_types` defines)."""
    return f"NF_LOAD_{t}{width}({address})"


def vector_convert(source: str, target: str, width: int, value: str) -> str:
    """``value``, a ``width``-vector of C type ``source``, as a vector of ``target``: the value itself when the
    types agree (no builtin call: pocl 3.0's LLVM 14 crashed compiling an identity ``convert_float16`` for a
    CPU without AVX-512; see ``Device.vector_bytes``)."""
    return value if source == target else f"convert_{target}{width}({value})"


def vector_store(t: str, width: int, value: str, address: str) -> str:
    """The statement storing the ``width``-vector ``value`` at ``address`` (see ``vector_load``)."""
    return f"NF_STORE_{t}{width}({value}, {address});"


def element_aligned_vectors(platform: str) -> bool:
    """Whether kernels for a device of ``platform`` are built with :data:`ELEMENT_ALIGNED_VECTORS`: on
    pocl, where it is measured and tested. Elsewhere an under-aligned vector type is a clang extension that
    other compilers may reject or emit as an aligned load."""
    return platform == "Portable Computing Language"
