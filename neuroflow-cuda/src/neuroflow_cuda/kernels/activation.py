"""The activations' backward in one pass: ``gx = g · act'`` from what the core op caches.

Generic CuPy builds the derivative with two or three elementwise launches and
temporaries; here it is one kernel. The activation is chosen at run time by
code, so one compiled module serves every activation.
"""

from __future__ import annotations

from typing import Any

from neuroflow_cuda.kernels.compile import THREADS, KernelFamily, check_contiguous, grid_for, scalar, size

#: Activation names the kernel knows (the core ops' ``fused_name``); what each caches is what the core op caches.
ACTIVATIONS = {"relu": 1, "leaky_relu": 2, "sigmoid": 3, "tanh": 4}

SOURCE = r"""
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

extern "C" __global__ void act_backward_kernel(const T* cached, const T* g, T* gx, long long n, int kind, T slope) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        gx[i] = act_backward(cached[i], g[i], kind, slope);
    }
}
"""

FAMILY = KernelFamily("activation", SOURCE, ("act_backward_kernel",))


def activation_backward(cupy: Any, cached: Any, g: Any, gx: Any, activation: str = "relu", slope: float = 0.01) -> Any:
    """``gx = g · act'`` (``kernels.ACTIVATION_BACKWARD``); returns ``gx``."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"fused activation {activation!r} is not supported; supported: {', '.join(ACTIVATIONS)}")
    check_contiguous("activation_backward", cached=cached, g=g, gx=gx)
    n = int(g.size)
    kernel = FAMILY.get(cupy, "act_backward_kernel", g.dtype)
    kernel((grid_for(n),), (THREADS,), (cached, g, gx, size(n), ACTIVATIONS[activation], scalar(g.dtype, slope)))
    return gx
