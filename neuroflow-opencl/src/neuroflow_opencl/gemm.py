"""Matrix products: a register-blocked GEMM over strided views (transposes are free), batched.

Each work item computes a TM×TN block of C, keeping it in registers while
it walks K; loads at the edges are clamped into the matrix rather than
branched on, and only the stores are guarded. Unit strides are compiled in
as constants so the compiler can vectorise (pocl vectorises across work items).
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from neuroflow_opencl.array import ClArray, empty, is_array
from neuroflow_opencl.cdtypes import c_type, preamble
from neuroflow_opencl.views import broadcast_shapes, broadcast_strides, collapse

TM, TN = 4, 4


def matmul(a: ClArray, b: ClArray, out: ClArray | None = None) -> ClArray:
    """``numpy.matmul(a, b, out=out)`` for device arrays of one float dtype."""
    if not (is_array(a) and is_array(b)):
        raise TypeError("matmul on the opencl backend takes two device arrays")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError("matmul: input operand does not have enough dimensions")
    a2 = a.reshape(1, a.shape[0]) if a.ndim == 1 else a
    b2 = b.reshape(b.shape[0], 1) if b.ndim == 1 else b
    m, k = a2.shape[-2:]
    k2, n = b2.shape[-2:]
    if k != k2:
        raise ValueError(f"matmul: mismatch in core dimension: {a.shape} @ {b.shape} (size {k} is different from {k2})")
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    full = (*batch, m, n)
    shape = full
    if a.ndim == 1:
        shape = (*batch, n)
    if b.ndim == 1:
        shape = (*shape[:-1],) if a.ndim != 1 else tuple(batch)
    dtype = np.result_type(a.dtype, b.dtype)
    if dtype.kind != "f":
        raise TypeError(f"matmul on the opencl backend needs floating-point arrays; got {a.dtype} and {b.dtype}")
    if out is None:
        out = empty(a.device, shape, dtype)
    elif out.shape != shape:
        raise ValueError(f"matmul: output operand has shape {out.shape}; expected {shape}")
    c2 = out.reshape(full) if out.shape != full else out
    _gemm(a2, b2, c2, batch, m, n, k)
    return out


def _gemm(a: ClArray, b: ClArray, c: ClArray, batch: tuple[int, ...], m: int, n: int, k: int) -> None:
    if m == 0 or n == 0:
        return
    sa = broadcast_strides(a.shape[:-2], a.estrides[:-2], batch)
    sb = broadcast_strides(b.shape[:-2], b.estrides[:-2], batch)
    bshape, (bsa, bsb, bsc) = collapse(batch, [sa, sb, c.estrides[:-2]])
    if len(bshape) > 1:  # batch axes that no single stride can walk: one launch per outer index
        for i in range(bshape[0]):
            _gemm(_slice(a, sa, i), _slice(b, sb, i), c[i] if c.ndim > 2 else c, batch[1:], m, n, k)
        return
    nb = bshape[0] if bshape else 1
    strides = (a.estrides[-2], a.estrides[-1], b.estrides[-2], b.estrides[-1], c.estrides[-2], c.estrides[-1])
    unit = tuple(s == 1 for s in strides)
    source = _source(str(c.dtype), str(a.dtype), str(b.dtype), unit)
    kernel = c.device.kernel(source, "gemm")
    args = [a.buffer, np.int64(a.offset), b.buffer, np.int64(b.offset), c.buffer, np.int64(c.offset),
            *(np.int64(s) for s in strides),
            np.int64(bsa[0] if bshape else 0), np.int64(bsb[0] if bshape else 0), np.int64(bsc[0] if bshape else 0),
            np.int64(m), np.int64(n), np.int64(k)]
    kernel(c.device.queue, (math.ceil(n / TN), math.ceil(m / TM), nb), None, *args)


def _slice(x: ClArray, batch_strides: tuple[int, ...], i: int) -> ClArray:
    return x._view(x.offset + i * batch_strides[0], x.shape[-2:], x.estrides[-2:]) if x.ndim > 2 else x


@cache
def _source(out_dtype: str, a_dtype: str, b_dtype: str, unit: tuple[bool, ...]) -> str:
    t, ta, tb = c_type(out_dtype), c_type(a_dtype), c_type(b_dtype)
    names = ("a_sm", "a_sk", "b_sk", "b_sn", "c_sm", "c_sn")
    params = [f"__global const {ta}* A", "long a_off", f"__global const {tb}* B", "long b_off",
              f"__global {t}* C", "long c_off", *(f"long {n}_arg" for n in names),
              "long a_sb", "long b_sb", "long c_sb", "long M", "long N", "long K"]
    consts = "\n".join(f"    const long {n} = {'1' if u else n + '_arg'};" for n, u in zip(names, unit))
    rows = "\n".join(f"    const long r{i} = min(m0 + {i}, M - 1);" for i in range(TM))
    cols = "\n".join(f"    const long q{j} = min(n0 + {j}, N - 1);" for j in range(TN))
    acc = "\n".join(f"    {t} c{i}{j} = 0;" for i in range(TM) for j in range(TN))
    loads_a = "\n".join(f"        {t} x{i} = A[a_off + r{i} * a_sm + p * a_sk];" for i in range(TM))
    loads_b = "\n".join(f"        {t} y{j} = B[b_off + p * b_sk + q{j} * b_sn];" for j in range(TN))
    fmas = "\n".join(f"        c{i}{j} += x{i} * y{j};" for i in range(TM) for j in range(TN))
    stores = "\n".join(
        f"    if (m0 + {i} < M && n0 + {j} < N) C[c_off + (m0 + {i}) * c_sm + (n0 + {j}) * c_sn] = c{i}{j};"
        for i in range(TM) for j in range(TN))
    return preamble(out_dtype, a_dtype, b_dtype) + f"""__kernel void gemm({', '.join(params)})
{{
{consts}
    const long n0 = get_global_id(0) * {TN};
    const long m0 = get_global_id(1) * {TM};
    const long batch = get_global_id(2);
    a_off += batch * a_sb; b_off += batch * b_sb; c_off += batch * c_sb;
{rows}
{cols}
{acc}
    for (long p = 0; p < K; ++p) {{
{loads_a}
{loads_b}
{fmas}
    }}
{stores}
}}
"""
