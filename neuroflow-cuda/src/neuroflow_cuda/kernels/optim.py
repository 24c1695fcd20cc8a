"""Optimizer updates over the flat parameter buffer: one kernel launch updates every parameter.

The core's Adam is ten whole-buffer passes on numpy (cheap there: no launch
cost, memory-bound either way); on a GPU each pass is a launch plus a trip
through memory, so the update is one pass reading grad, m, v, p once and
writing them once. The arithmetic follows the core's exactly (bias
corrections folded into eps and the step size), so results agree to
float rounding.
"""

from __future__ import annotations

import math
from typing import Any

from neuroflow_cuda.kernels.compile import THREADS, KernelFamily, check_contiguous, grid_for, scalar, size

SOURCE = r"""
extern "C" __global__ void adam_update(T* p, const T* grad, T* m, T* v, long long n, T decay, T l2, T beta1,
                                       T beta2, T eps_c, T step) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        T pi = p[i] * decay;
        T g = grad[i] + l2 * pi;
        T mi = beta1 * m[i] + (T(1) - beta1) * g;
        T vi = beta2 * v[i] + (T(1) - beta2) * g * g;
        m[i] = mi;
        v[i] = vi;
        p[i] = pi - step * mi / (sqrt(vi) + eps_c);
    }
}

extern "C" __global__ void sgd_update(T* p, const T* grad, T* buf, long long n, T lr, T momentum, T damp,
                                      T weight_decay, int first, int nesterov, int has_momentum) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
        T g = grad[i] + weight_decay * p[i];
        if (has_momentum) {
            T b = first ? g : momentum * buf[i] + (T(1) - damp) * g;
            buf[i] = b;
            g = nesterov ? g + momentum * b : b;
        }
        p[i] -= lr * g;
    }
}
"""

FAMILY = KernelFamily("optim", SOURCE, ("adam_update", "sgd_update"))


def adam_update(cupy: Any, data: Any, grad: Any, m: Any, v: Any, *, lr: float, beta1: float, beta2: float,
                eps: float, weight_decay: float, decoupled: bool, step: int) -> None:
    """Adam/AdamW step number ``step`` (1-based) on flat buffers, in place, as ``neuroflow.optim.Adam`` does it."""
    if step < 1:
        raise ValueError(f"adam_update: step is 1-based; got {step}")
    check_contiguous("adam_update", data=data, grad=grad, m=m, v=v)
    n = int(data.size)
    c = math.sqrt(1.0 - beta2**step)
    decay = 1.0 - lr * weight_decay if decoupled and weight_decay else 1.0
    l2 = 0.0 if decoupled else weight_decay
    dt = data.dtype
    FAMILY.get(cupy, "adam_update", dt)((grid_for(n),), (THREADS,), (
        data, grad, m, v, size(n), scalar(dt, decay), scalar(dt, l2), scalar(dt, beta1), scalar(dt, beta2),
        scalar(dt, eps * c), scalar(dt, lr * c / (1.0 - beta1**step))))


def sgd_update(cupy: Any, data: Any, grad: Any, buf: Any | None, *, lr: float, momentum: float = 0.0,
               dampening: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0, first: bool = False) -> None:
    """SGD step on flat buffers in place (PyTorch semantics: the first step copies g into the momentum buffer)."""
    check_contiguous("sgd_update", data=data, grad=grad)
    n = int(data.size)
    has_momentum = bool(momentum) and buf is not None
    dt = data.dtype
    FAMILY.get(cupy, "sgd_update", dt)((grid_for(n),), (THREADS,), (
        data, grad, buf if has_momentum else grad, size(n), scalar(dt, lr), scalar(dt, momentum),
        scalar(dt, dampening), scalar(dt, weight_decay), int(first), int(nesterov), int(has_momentum)))
