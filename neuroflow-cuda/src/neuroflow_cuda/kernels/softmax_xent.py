"""Softmax cross-entropy: probabilities and per-row loss in one kernel, the gradient in place in another.

Generic CuPy runs max, subtract, exp, sum, divide, gather and log as seven
launches with temporaries; here forward is one block per row (reductions in
shared memory) and the only host wait is reading the mean loss.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow_cuda.kernels.compile import THREADS, KernelFamily, check_contiguous, grid_for, scalar, size

SOURCE = r"""
#define BLOCK 256

__device__ void block_reduce(T* red, int op) {  // op 0: sum, 1: max; result in red[0]
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            T a = red[threadIdx.x], b = red[threadIdx.x + s];
            red[threadIdx.x] = op ? (a > b ? a : b) : a + b;
        }
        __syncthreads();
    }
}

extern "C" __global__ void softmax_xent_forward(const T* logits, const long long* labels, T* probs, T* row_loss,
                                                long long n, long long c, T smoothing) {
    __shared__ T red[BLOCK];
    long long row = blockIdx.x;
    if (row >= n) return;
    const T* z = logits + row * c;
    T* p = probs + row * c;
    int t = threadIdx.x;

    T m = z[0];
    for (long long j = t; j < c; j += BLOCK) m = z[j] > m ? z[j] : m;
    red[t] = m;
    __syncthreads();
    block_reduce(red, 1);
    m = red[0];
    __syncthreads();

    T s = T(0), shifted = T(0);
    for (long long j = t; j < c; j += BLOCK) {
        T d = z[j] - m;
        T e = exp(d);
        p[j] = e;
        s += e;
        shifted += d;
    }
    red[t] = s;
    __syncthreads();
    block_reduce(red, 0);
    s = red[0];
    __syncthreads();
    red[t] = shifted;
    __syncthreads();
    block_reduce(red, 0);
    shifted = red[0];

    T inv = T(1) / s;
    for (long long j = t; j < c; j += BLOCK) p[j] *= inv;
    if (t == 0) {
        T log_norm = log(s);
        long long label = labels[row];
        // an out-of-range label reads nothing and makes the loss NaN; the caller then names the bad label
        T nll = (label >= 0 && label < c) ? log_norm - (z[label] - m) : T(nan(""));
        T smooth = log_norm - shifted / T(c);
        row_loss[row] = (T(1) - smoothing) * nll + smoothing * smooth;
    }
}

// In place: probabilities become d loss / d logits = (p - target) * scale / n.
extern "C" __global__ void softmax_xent_backward(T* p, const long long* labels, long long n, long long c,
                                                 T smoothing, T factor) {
    long long total = n * c;
    T off = smoothing / T(c);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        long long row = i / c, col = i - row * c;
        T target = off + (col == labels[row] ? T(1) - smoothing : T(0));  // a bad label never matches a column
        p[i] = (p[i] - target) * factor;
    }
}
"""

FAMILY = KernelFamily("softmax_xent", SOURCE, ("softmax_xent_forward", "softmax_xent_backward"))
BLOCK = 256  # must match the source's BLOCK


def _labels(cupy: Any, labels: Any, n: int) -> Any:
    if tuple(labels.shape) != (n,) or labels.dtype.kind not in "iu":
        raise ValueError(f"softmax_cross_entropy: labels must be ({n},) integers; got {tuple(labels.shape)} {labels.dtype}")
    return labels if labels.dtype == np.int64 and labels.flags.c_contiguous else cupy.ascontiguousarray(labels, dtype=np.int64)


def softmax_cross_entropy(cupy: Any, logits: Any, labels: Any, probs: Any, row_loss: Any, smoothing: float = 0.0) -> float:
    """Mean cross-entropy of ``logits`` (n, c) against integer ``labels``; ``probs`` receives the softmax.

    ``row_loss`` is an (n,) workspace of the logits' dtype. Labels are not
    range-checked here: the caller validates them (the core loss does).
    """
    check_contiguous("softmax_cross_entropy", logits=logits, probs=probs, row_loss=row_loss)
    n, c = (int(d) for d in logits.shape)
    if n == 0:
        return 0.0
    kernel = FAMILY.get(cupy, "softmax_xent_forward", logits.dtype)
    kernel((n,), (BLOCK,), (logits, _labels(cupy, labels, n), probs, row_loss, size(n), size(c),
                            scalar(logits.dtype, smoothing)))
    return float(row_loss.mean())


def softmax_cross_entropy_backward(cupy: Any, probs: Any, labels: Any, scale: float = 1.0, smoothing: float = 0.0) -> Any:
    """Turn ``probs`` (from the forward) into the logits' gradient in place, times ``scale``; returns it."""
    check_contiguous("softmax_cross_entropy_backward", probs=probs)
    n, c = (int(d) for d in probs.shape)
    total = n * c
    kernel = FAMILY.get(cupy, "softmax_xent_backward", probs.dtype)
    kernel((grid_for(total),), (THREADS,), (probs, _labels(cupy, labels, n), size(n), size(c),
                                            scalar(probs.dtype, smoothing), scalar(probs.dtype, scale / max(n, 1))))
    return probs
