"""Transposing copies: a dense-rows output from an input whose columns are dense (``W.T`` copied, for one).

The generic elementwise copy walks the output's rows and reads the input a column at a time, an element per
load and store. Here a work item moves a square tile of ``lanes`` × ``lanes`` elements (one 64-byte vector a
side, or 32 bytes where ``Device.vector_bytes`` says so): ``lanes`` vector loads of the input's columns, a transpose in registers, ``lanes`` vector stores of the
output's rows. Measured on pocl (2-core AVX-512 Xeon), copying the MLP's first weight transposed (784 × 128
float32) took 41–47 µs elementwise and ~30 µs in tiles (device time, alone). Sizes and strides are compiled in
(the geometry repeats every step); the offsets are scalar arguments of declared type, as for the GEMM.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from neuroflow_opencl.array import ClArray
from neuroflow_opencl.cdtypes import c_type, preamble, vector_load, vector_store, vector_types
from neuroflow_opencl.views import Shape

GROUP = 8  # tiles per work group, along the output's rows


def fits(shape: Shape, strides: list[Shape], dtypes: tuple[np.dtype, np.dtype], device: Any) -> bool:
    """Whether a copy of collapsed ``shape`` with (output, input) ``strides`` is a tiled transpose on ``device``:
    two dimensions of at least one tile, the output's rows and the input's columns dense, one 4- or 8-byte
    dtype."""
    if len(shape) != 2 or dtypes[0] != dtypes[1] or dtypes[0].itemsize not in (4, 8):
        return False
    lanes = device.vector_bytes // dtypes[0].itemsize
    (o_rows, o_cols), (i_rows, i_cols) = strides
    return min(shape) >= lanes and o_cols == 1 and i_rows == 1 and o_rows > 0 and i_cols > 0


class Plan:
    """A transposing copy of one geometry, with ``elementwise``'s plan interface (``shape``, ``dtype``, ``launch``)."""

    def __init__(self, shape: Shape, collapsed: Shape, strides: list[Shape], dtype: np.dtype, device: Any) -> None:
        self.shape, self.dtype = shape, dtype
        rows, cols = collapsed
        lanes = device.vector_bytes // dtype.itemsize
        self.kernel = device.kernel(_source(c_type(dtype), lanes, rows, cols, strides[0][0], strides[1][1],
                                            preamble(dtype)), "transpose")
        self.kernel.set_scalar_arg_dtypes([None, None, np.int64, np.int64])
        # pocl makes one work group of a small grid (both cores idle but one): groups of GROUP tiles each
        tiles = (math.ceil(cols / lanes), math.ceil(rows / lanes))
        self.local = (min(GROUP, tiles[0]), 1)
        self.size = (math.ceil(tiles[0] / self.local[0]) * self.local[0], tiles[1])
        self.queue = device.queue

    def launch(self, out: ClArray, operands: tuple[Any, ...]) -> None:
        src = operands[0]
        self.kernel(self.queue, self.size, self.local, out.buffer, src.buffer, out.offset, src.offset)


@cache
def _source(t: str, lanes: int, rows: int, cols: int, out_stride: int, in_stride: int, pre: str) -> str:
    """Tile (get_global_id(1), get_global_id(0)) of out[i, j] = in[i, j], out's rows and in's columns dense."""
    loads = [f"        const {t}{lanes} v{j} = {vector_load(t, lanes, f'src + {j} * {in_stride}')};" for j in range(lanes)]
    stores = []
    for i in range(lanes):
        row = ", ".join(f"v{j}.s{i:x}" for j in range(lanes))
        stores.append(f"        {vector_store(t, lanes, f'({t}{lanes})({row})', f'dst + {i * out_stride}')}")
    return pre + vector_types(t, widths=(lanes,)) + f"""__kernel void transpose(__global {t}* out, __global const {t}* in, long out_off, long in_off)
{{
    const long i0 = (long)get_global_id(1) * {lanes}, j0 = (long)get_global_id(0) * {lanes};
    __global {t}* dst = out + out_off + i0 * {out_stride} + j0;
    __global const {t}* src = in + in_off + i0 + j0 * {in_stride};
    if (i0 + {lanes} <= {rows} && j0 + {lanes} <= {cols}) {{
{chr(10).join(loads)}
{chr(10).join(stores)}
    }} else {{
        const long i1 = i0 + {lanes} < {rows} ? i0 + {lanes} : {rows}, j1 = j0 + {lanes} < {cols} ? j0 + {lanes} : {cols};
        for (long i = 0; i < i1 - i0; ++i)
            for (long j = 0; j < j1 - j0; ++j) dst[i * {out_stride} + j] = src[i + j * {in_stride}];
    }}
}}
"""
