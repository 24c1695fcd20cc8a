"""Bias + activation, forward and backward, in one pass each (Linear/Conv epilogues).

Unfused, a Linear followed by ReLU reads and writes the output three times
(bias add, max, and again in backward for the mask and the bias sum); here
each direction is one kernel. The activation is chosen at run time by code,
so one compiled module serves every activation.
"""

from __future__ import annotations

from typing import Any

from neuroflow_cuda.kernels.compile import THREADS, KernelFamily, check_contiguous, grid_for, scalar, size

#: Activation names the kernels know; what each caches for backward is what the core op caches.
ACTIVATIONS = {"identity": 0, "relu": 1, "leaky_relu": 2, "sigmoid": 3, "tanh": 4}
#: For each activation, whether backward reads the op's output (True) or its input (False).
READS_OUTPUT = {"identity": True, "relu": True, "leaky_relu": False, "sigmoid": True, "tanh": True}

SOURCE = r"""
__device__ __forceinline__ T act_forward(T v, int kind, T slope) {
    switch (kind) {
        case 1: return v > T(0) ? v : T(0);
        case 2: return v > T(0) ? v : v * slope;
        case 3: return T(0.5) * (tanh(T(0.5) * v) + T(1));  // the core's overflow-free sigmoid
        case 4: return tanh(v);
        default: return v;
    }
}

// d act / d v times g, from what the op caches: the output y (relu, sigmoid, tanh) or the input (leaky).
__device__ __forceinline__ T act_backward(T cached, T g, int kind, T slope) {
    switch (kind) {
        case 1: return cached > T(0) ? g : T(0);
        case 2: return cached > T(0) ? g : g * slope;
        case 3: return g * cached * (T(1) - cached);
        case 4: return g * (T(1) - cached * cached);
        default: return g;
    }
}

extern "C" __global__ void bias_act_forward(const T* x, const T* bias, T* y, long long n, long long c,
                                            int has_bias, int kind, T slope) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        T v = x[i];
        if (has_bias) v += bias[i % c];
        y[i] = act_forward(v, kind, slope);
    }
}

extern "C" __global__ void act_backward_kernel(const T* cached, const T* g, T* gx, long long n, int kind, T slope) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        gx[i] = act_backward(cached[i], g[i], kind, slope);
    }
}

// Block (32, 8) per 32 columns: writes gx and reduces its column sums (the bias gradient) in shared
// memory, so the sum needs no second pass over gx and no atomics (deterministic).
extern "C" __global__ void bias_act_backward(const T* cached, const T* g, T* gx, T* gbias, long long rows,
                                             long long c, int kind, T slope) {
    __shared__ T part[8][33];
    long long col = blockIdx.x * 32LL + threadIdx.x;
    T acc = T(0);
    if (col < c) {
        for (long long r = threadIdx.y; r < rows; r += 8) {
            long long i = r * c + col;
            T v = act_backward(cached[i], g[i], kind, slope);
            gx[i] = v;
            acc += v;
        }
    }
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        T s = T(0);
        for (int k = 0; k < 8; ++k) s += part[k][threadIdx.x];
        gbias[col] = s;
    }
}
"""

FAMILY = KernelFamily("activation", SOURCE, ("bias_act_forward", "act_backward_kernel", "bias_act_backward"))


def _kind(activation: str) -> int:
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused activation {activation!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[activation]


def bias_activation(cupy: Any, x: Any, bias: Any | None, out: Any, activation: str = "relu", slope: float = 0.01) -> Any:
    """``out = act(x + bias)`` with ``bias`` broadcast over the last axis; ``out`` may be ``x``."""
    kind = _kind(activation)
    check_contiguous("bias_activation", x=x, out=out)
    c = int(x.shape[-1]) if x.ndim else 1
    if bias is not None and tuple(bias.shape) != (c,):
        raise ValueError(f"bias_activation: bias has shape {tuple(bias.shape)}; expected ({c},) for input {tuple(x.shape)}")
    kernel = FAMILY.get(cupy, "bias_act_forward", x.dtype)
    n = int(x.size)
    kernel((grid_for(n),), (THREADS,), (x, x if bias is None else bias, out, size(n), size(max(c, 1)),
                                         int(bias is not None), kind, scalar(x.dtype, slope)))
    return out


def activation_backward(cupy: Any, cached: Any, g: Any, gx: Any, activation: str = "relu", slope: float = 0.01,
                        gbias: Any | None = None) -> Any:
    """``gx = g · act'``; with ``gbias`` also its sums over every axis but the last (the bias gradient)."""
    kind = _kind(activation)
    check_contiguous("activation_backward", cached=cached, g=g, gx=gx)
    if gbias is None:
        n = int(g.size)
        kernel = FAMILY.get(cupy, "act_backward_kernel", g.dtype)
        kernel((grid_for(n),), (THREADS,), (cached, g, gx, size(n), kind, scalar(g.dtype, slope)))
        return gx
    c = int(g.shape[-1])
    rows = int(g.size) // max(c, 1)
    kernel = FAMILY.get(cupy, "bias_act_backward", g.dtype)
    kernel(((c + 31) // 32,), (32, 8), (cached, g, gx, gbias, size(rows), size(c), kind, scalar(g.dtype, slope)))
    return gx
