"""BatchNorm over channels-last rows (NHWC maps viewed as (rows, C)): statistics, normalise, backward.

One block of (32, 8) threads owns 32 channels and walks every row, so each
channel's reductions finish in shared memory without atomics. Forward makes
three passes (mean, centred variance, output) where generic CuPy makes about
eight; backward makes two. What is cached matches the vision op: the input,
the per-channel mean and 1/σ.
"""

from __future__ import annotations

from typing import Any

from neuroflow_cuda.kernels.compile import KernelFamily, check_contiguous, scalar, size

SOURCE = r"""
__device__ T column_sum(T* part, T acc, long long col, long long c) {
    part[threadIdx.y * 33 + threadIdx.x] = acc;
    __syncthreads();
    T s = T(0);
    for (int k = 0; k < 8; ++k) s += part[k * 33 + threadIdx.x];
    __syncthreads();
    return s;
}

extern "C" __global__ void bn_forward_train(const T* x, const T* gamma, const T* beta, T* y, T* mean_out,
                                            T* invstd_out, T* running_mean, T* running_var, long long rows,
                                            long long c, T eps, T momentum, int affine, int relu, int track) {
    __shared__ T part[8 * 33];
    long long col = blockIdx.x * 32LL + threadIdx.x;
    bool live = col < c;
    T acc = T(0);
    if (live) for (long long r = threadIdx.y; r < rows; r += 8) acc += x[r * c + col];
    T mean = column_sum(part, acc, col, c) / T(rows);
    acc = T(0);
    if (live) for (long long r = threadIdx.y; r < rows; r += 8) { T d = x[r * c + col] - mean; acc += d * d; }
    T var = column_sum(part, acc, col, c) / T(rows);  // two-pass: no cancellation when the mean is large
    if (!live) return;
    T invstd = T(1) / sqrt(var + eps);
    T scale = affine ? invstd * gamma[col] : invstd;
    T shift = (affine ? beta[col] : T(0)) - mean * scale;
    for (long long r = threadIdx.y; r < rows; r += 8) {
        T v = x[r * c + col] * scale + shift;
        y[r * c + col] = (relu && v < T(0)) ? T(0) : v;
    }
    if (threadIdx.y == 0) {
        mean_out[col] = mean;
        invstd_out[col] = invstd;
        if (track) {
            running_mean[col] = (T(1) - momentum) * running_mean[col] + momentum * mean;
            running_var[col] = (T(1) - momentum) * running_var[col] + momentum * var * T(rows) / T(rows - 1);
        }
    }
}

// gx = a·(g − mean(g) − x̂·mean(g·x̂)) with a = γ/σ; also dγ = Σ g·x̂ and dβ = Σ g. With relu, g is
// masked where the forward output y was not positive.
extern "C" __global__ void bn_backward_train(const T* x, const T* g, const T* y, const T* gamma, const T* mean,
                                             const T* invstd, T* gx, T* ggamma, T* gbeta, long long rows,
                                             long long c, int affine, int relu) {
    __shared__ T part[8 * 33];
    long long col = blockIdx.x * 32LL + threadIdx.x;
    bool live = col < c;
    T mu = live ? mean[col] : T(0), is = live ? invstd[col] : T(0);
    T sg = T(0), sgx = T(0);
    if (live) {
        for (long long r = threadIdx.y; r < rows; r += 8) {
            long long i = r * c + col;
            T gi = (relu && !(y[i] > T(0))) ? T(0) : g[i];
            sg += gi;
            sgx += gi * (x[i] - mu) * is;
        }
    }
    sg = column_sum(part, sg, col, c);
    sgx = column_sum(part, sgx, col, c);
    if (!live) return;
    T a = affine ? gamma[col] * is : is;
    T inv_rows = T(1) / T(rows);
    for (long long r = threadIdx.y; r < rows; r += 8) {
        long long i = r * c + col;
        T gi = (relu && !(y[i] > T(0))) ? T(0) : g[i];
        T xhat = (x[i] - mu) * is;
        gx[i] = a * (gi - sg * inv_rows - xhat * sgx * inv_rows);
    }
    if (threadIdx.y == 0 && affine) {
        ggamma[col] = sgx;
        gbeta[col] = sg;
    }
}
"""

FAMILY = KernelFamily("batchnorm", SOURCE, ("bn_forward_train", "bn_backward_train"))


def _rows(x2: Any, c: int, name: str) -> int:
    if x2.ndim != 2 or int(x2.shape[1]) != c:
        raise ValueError(f"{name}: expected a (rows, {c}) channels-last view; got shape {tuple(x2.shape)}")
    rows = int(x2.shape[0])
    if rows < 2:
        raise ValueError(f"{name}: training batch statistics need more than one value per channel; got {rows}")
    return rows


def batchnorm_forward(cupy: Any, x2: Any, gamma: Any | None, beta: Any | None, y2: Any, mean: Any, invstd: Any,
                      eps: float, momentum: float | None = None, running_mean: Any | None = None,
                      running_var: Any | None = None, relu: bool = False) -> Any:
    """Training forward on (rows, C): fills ``y2``, ``mean`` and ``invstd``; updates running stats when given."""
    c = int(mean.shape[0])
    rows = _rows(x2, c, "batchnorm_forward")
    check_contiguous("batchnorm_forward", x2=x2, y2=y2)
    track = running_mean is not None and running_var is not None and momentum is not None
    affine = gamma is not None and beta is not None
    kernel = FAMILY.get(cupy, "bn_forward_train", x2.dtype)
    kernel(((c + 31) // 32,), (32, 8), (
        x2, gamma if affine else mean, beta if affine else mean, y2, mean, invstd,
        running_mean if track else mean, running_var if track else invstd, size(rows), size(c),
        scalar(x2.dtype, eps), scalar(x2.dtype, momentum or 0.0), int(affine), int(relu), int(track)))
    return y2


def batchnorm_backward(cupy: Any, x2: Any, g2: Any, gamma: Any | None, mean: Any, invstd: Any, gx2: Any,
                       ggamma: Any | None = None, gbeta: Any | None = None, y2: Any | None = None) -> Any:
    """Training backward on (rows, C): fills ``gx2`` and, for an affine layer, ``ggamma``/``gbeta``.

    ``y2`` is the forward output when the layer fused a ReLU (the gradient is
    masked where it was not positive).
    """
    c = int(mean.shape[0])
    rows = _rows(x2, c, "batchnorm_backward")
    check_contiguous("batchnorm_backward", x2=x2, g2=g2, gx2=gx2)
    affine = gamma is not None and ggamma is not None and gbeta is not None
    kernel = FAMILY.get(cupy, "bn_backward_train", x2.dtype)
    kernel(((c + 31) // 32,), (32, 8), (
        x2, g2, g2 if y2 is None else y2, gamma if affine else mean, mean, invstd, gx2,
        ggamma if affine else mean, gbeta if affine else mean, size(rows), size(c), int(affine), int(y2 is not None)))
    return gx2
