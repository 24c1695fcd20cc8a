"""Linear's fused kernels: the forward with its bias, and the weight and bias gradients.

Both products are cuBLAS GEMMs through ``cupy.matmul``, as in the generic
code, so the forward's output is the generic code's bit for bit. The bias is
added in one pass over the output; the bias gradient is summed over the rows
by one kernel that reads each column in blocks of 32 rows per thread and adds
the partial sums in shared memory, deterministically (no atomics) and
without the temporaries of a CuPy reduction. ``g`` may be a strided view (a
slice of a concatenated gradient): the sum reads it through its strides.
"""

from __future__ import annotations

from typing import Any

from neuroflow_cuda.kernels.compile import THREADS, KernelFamily, check_contiguous, grid_for, size

SOURCE = r"""
extern "C" __global__ void add_bias_rows(T* out, const T* bias, long long total, long long c) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        out[i] += bias[i % c];
    }
}

// Block (32, 32) per 32 columns: thread (x, y) sums rows y, y + 32, ... of column x, then row 0 of the
// block adds the 32 partial sums. Element (r, col) of g is g[r * row_stride + col * col_stride].
extern "C" __global__ void column_sums(const T* g, T* out, long long rows, long long c, long long row_stride,
                                       long long col_stride) {
    __shared__ T part[32][33];
    long long col = blockIdx.x * 32LL + threadIdx.x;
    T acc = T(0);
    if (col < c) {
        for (long long r = threadIdx.y; r < rows; r += 32) acc += g[r * row_stride + col * col_stride];
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        T s = T(0);
        for (int k = 0; k < 32; ++k) s += part[k][threadIdx.x];
        out[col] = s;
    }
}
"""

FAMILY = KernelFamily("linear", SOURCE, ("add_bias_rows", "column_sums"))


def _check_vector(function: str, name: str, vector: Any, length: int) -> None:
    if tuple(vector.shape) != (length,):
        raise ValueError(f"fused kernel {function}: {name} has shape {tuple(vector.shape)}; expected ({length},)")


def linear(cupy: Any, x: Any, weight: Any, bias: Any, out: Any) -> Any:
    """``out = x @ weight.T + bias`` (``kernels.LINEAR``) for ``x`` (n, in) and ``out`` (n, out); returns ``out``."""
    check_contiguous("linear", bias=bias, out=out)
    n, c = (int(d) for d in out.shape)
    _check_vector("linear", "bias", bias, c)
    cupy.matmul(x, weight.T, out=out)
    total = n * c
    if total:
        FAMILY.get(cupy, "add_bias_rows", out.dtype)((grid_for(total),), (THREADS,), (out, bias, size(total), size(c)))
    return out


def linear_weight_grad(cupy: Any, g: Any, x: Any, gw: Any, gb: Any) -> None:
    """``gw = g.T @ x`` and ``gb = g.sum(axis=0)`` (``kernels.LINEAR_WEIGHT_GRAD``) into the caller's buffers."""
    check_contiguous("linear_weight_grad", gb=gb)
    rows, c = (int(d) for d in g.shape)
    _check_vector("linear_weight_grad", "gb", gb, c)
    cupy.matmul(g.T, x, out=gw)
    item = g.dtype.itemsize
    FAMILY.get(cupy, "column_sums", g.dtype)(((c + 31) // 32,), (32, 32), (
        g, gb, size(rows), size(c), size(g.strides[0] // item), size(g.strides[1] // item)))
