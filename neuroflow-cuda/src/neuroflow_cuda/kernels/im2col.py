"""im2col and col2im for channels-last (NHWC) maps, in the vision ops' column layout.

Columns are (N, Ho, Wo, G, kh, kw, C/G), read from an already padded map
(N, Hp, Wp, C). col2im is a gather: each input element sums the column
entries that read it, so there are no atomics, the result is deterministic
and the gradient map needs no zeroing first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow_cuda.kernels.compile import THREADS, KernelFamily, check_contiguous, grid_for, size

SOURCE = r"""
#define GEO_PARAMS int hp, int wp, int c, int ho, int wo, int g, int kh, int kw, int cg, int sh, int sw, int dh, int dw

extern "C" __global__ void im2col_nhwc(const T* x, T* col, long long total, GEO_PARAMS) {
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        long long r = idx;
        int cc = r % cg; r /= cg;
        int j = r % kw; r /= kw;
        int i = r % kh; r /= kh;
        int gi = r % g; r /= g;
        int ow = r % wo; r /= wo;
        int oh = r % ho;
        long long n = r / ho;
        int h = oh * sh + i * dh, w = ow * sw + j * dw;
        col[idx] = x[((n * hp + h) * wp + w) * c + gi * cg + cc];
    }
}

extern "C" __global__ void col2im_nhwc(const T* col, T* gx, long long total, GEO_PARAMS) {
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)blockDim.x * gridDim.x) {
        long long r = idx;
        int ch = r % c; r /= c;
        int w = r % wp; r /= wp;
        int h = r % hp;
        long long n = r / hp;
        int gi = ch / cg, cc = ch - gi * cg;
        T acc = T(0);
        for (int i = 0; i < kh; ++i) {
            int th = h - i * dh;
            if (th < 0 || th % sh) continue;
            int oh = th / sh;
            if (oh >= ho) continue;
            for (int j = 0; j < kw; ++j) {
                int tw = w - j * dw;
                if (tw < 0 || tw % sw) continue;
                int ow = tw / sw;
                if (ow >= wo) continue;
                acc += col[(((((n * ho + oh) * wo + ow) * g + gi) * kh + i) * kw + j) * cg + cc];
            }
        }
        gx[idx] = acc;
    }
}
"""

FAMILY = KernelFamily("im2col", SOURCE, ("im2col_nhwc", "col2im_nhwc"))


def _geometry(xpad_shape: tuple[int, ...], col_shape: tuple[int, ...], stride: tuple[int, int],
              dilation: tuple[int, int]) -> tuple[np.int32, ...]:
    if len(xpad_shape) != 4 or len(col_shape) != 7:
        raise ValueError(f"im2col/col2im: expected a (N, Hp, Wp, C) map and (N, Ho, Wo, G, kh, kw, C/G) columns; "
                         f"got {tuple(xpad_shape)} and {tuple(col_shape)}")
    n, hp, wp, c = xpad_shape
    n2, ho, wo, g, kh, kw, cg = col_shape
    if n2 != n or g * cg != c:
        raise ValueError(f"im2col/col2im: columns {tuple(col_shape)} do not match the map {tuple(xpad_shape)}")
    return tuple(np.int32(v) for v in (hp, wp, c, ho, wo, g, kh, kw, cg, *stride, *dilation))


def im2col(cupy: Any, xpad: Any, col: Any, stride: tuple[int, int], dilation: tuple[int, int] = (1, 1)) -> Any:
    """Fill ``col`` (N, Ho, Wo, G, kh, kw, C/G) with the windows of the padded NHWC map ``xpad``."""
    check_contiguous("im2col", xpad=xpad, col=col)
    geo = _geometry(tuple(xpad.shape), tuple(col.shape), stride, dilation)
    total = int(col.size)
    FAMILY.get(cupy, "im2col_nhwc", xpad.dtype)((grid_for(total),), (THREADS,), (xpad, col, size(total), *geo))
    return col


def col2im(cupy: Any, col: Any, gxpad: Any, stride: tuple[int, int], dilation: tuple[int, int] = (1, 1)) -> Any:
    """Write into ``gxpad`` (N, Hp, Wp, C) the sum of the column entries that read each element."""
    check_contiguous("col2im", col=col, gxpad=gxpad)
    geo = _geometry(tuple(gxpad.shape), tuple(col.shape), stride, dilation)
    total = int(gxpad.size)
    FAMILY.get(cupy, "col2im_nhwc", col.dtype)((grid_for(total),), (THREADS,), (col, gxpad, size(total), *geo))
    return gxpad
