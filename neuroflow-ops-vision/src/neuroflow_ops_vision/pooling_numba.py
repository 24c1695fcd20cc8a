"""MaxPool2d kernels compiled by numba, for NHWC maps: the maximum and its tap in one pass, the gradient in one.

numpy takes a max-pool forward in four passes per tap (compare, maximum,
the tap's label, the running argmax) and its backward in two per tap (which
outputs the tap won, the gradient times that), each over map-sized arrays.
These loops read each window once, keep the running maximum and its tap in
the output rows, and write each input position's gradient once (windows that
tile the map) or add into a zeroed map in tap order (windows that overlap or
leave positions out), with the same arithmetic as the numpy code: the same
outputs, taps and gradients bit for bit, NaN included. The innermost loop runs
over channels, contiguous in NHWC, so it vectorises.

Both kernels release the GIL and take a range of samples, so
:mod:`neuroflow.backends.cpu_parallel` splits the batch between the cores.
Importing this module imports numba; MaxPool2d imports it at its first NHWC call
(see :mod:`neuroflow_ops_vision.compiled`).
"""

from __future__ import annotations

import functools
from typing import Any

import numba
import numpy as np

from neuroflow.backends.cpu_parallel import for_chunks
from neuroflow_ops_vision import compiled
from neuroflow_ops_vision.windows import Geometry

# Every kernel is compiled with nogil=True (cpu_parallel's threads run chunks at once) and cache=True (compiled
# once per machine, in __pycache__ or NUMBA_CACHE_DIR, not once per process).


@numba.njit(nogil=True, cache=True)
def max_rows(x: Any, kernel: Any, stride: Any, dilation: Any, relu: bool, y: Any, argmax: Any, lo: int,
             hi: int) -> None:  # pragma: no cover
    """``y`` = the maximum of each window of the (padded) NHWC map ``x`` and ``argmax`` its tap (row-major in the
    window; the first maximum wins ties, a NaN propagates and keeps the tap before it, as numpy's
    ``maximum``/``greater`` passes do), then at least 0 with ``relu``, for samples [lo, hi)."""
    _, oh, ow, c = y.shape
    kh, kw = kernel[0], kernel[1]
    sh, sw, dh, dw = stride[0], stride[1], dilation[0], dilation[1]
    for s in range(lo, hi):
        for r in range(oh):
            for q in range(ow):
                best, taps = y[s, r, q], argmax[s, r, q]
                first = x[s, r * sh, q * sw]
                for k in range(c):
                    best[k] = first[k]
                    taps[k] = 0
                for t in range(1, kh * kw):
                    window = x[s, r * sh + (t // kw) * dh, q * sw + (t % kw) * dw]
                    for k in range(c):
                        v, b = window[k], best[k]
                        larger = v > b
                        best[k] = v if larger or v != v else b
                        taps[k] = t if larger else taps[k]
                if relu:
                    for k in range(c):
                        if best[k] < 0:
                            best[k] = 0


@numba.njit(nogil=True, cache=True)
def gradient_rows(g: Any, argmax: Any, y: Any, relu: bool, kernel: Any, stride: Any, padding: Any, dilation: Any,
                  tiles: bool, gx: Any, lo: int, hi: int) -> None:  # pragma: no cover
    """``gx`` (N, H, W, C) for samples [lo, hi) from the output gradient ``g`` (N, Ho, Wo, C): each tap's share is
    g·[y > 0]·[argmax = t] (the first factor with ``relu``), written where windows tile the map (``tiles``), else
    added, tap by tap, into the zeroed map; window positions outside it (padding, ceil_mode) are skipped."""
    _, oh, ow, c = g.shape
    h, w = gx.shape[1], gx.shape[2]
    kh, kw = kernel[0], kernel[1]
    one, zero = g.dtype.type(1), g.dtype.type(0)
    for s in range(lo, hi):
        if not tiles:
            gx[s] = 0
        for t in range(kh * kw):
            i, j = t // kw, t % kw
            for r in range(oh):
                row = r * stride[0] - padding[0] + i * dilation[0]
                if row < 0 or row >= h:
                    continue
                for q in range(ow):
                    col = q * stride[1] - padding[1] + j * dilation[1]
                    if col < 0 or col >= w:
                        continue
                    grad, taps, out, target = g[s, r, q], argmax[s, r, q], y[s, r, q], gx[s, row, col]
                    for k in range(c):
                        v = grad[k]
                        if relu:
                            v = v * (one if out[k] > 0 else zero)
                        v = v * (one if taps[k] == t else zero)
                        if tiles:
                            target[k] = v
                        else:
                            target[k] += v


@functools.cache  # once per sweep, not per step; the kernels only read them
def _geometry(geo: Geometry) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Kernel, stride, padding and dilation as the (2,) int64 arrays the kernels index."""
    kernel, stride, padding, dilation = (np.array(pair, np.int64) for pair in (geo.kernel, geo.stride, geo.padding,
                                                                                geo.dilation))
    return kernel, stride, padding, dilation


def max_forward(x: np.ndarray, geo: Geometry, relu: bool, y: np.ndarray, argmax: np.ndarray) -> None:
    """``y`` and ``argmax`` (N, Ho, Wo, C) of max pooling the padded NHWC map ``x`` under ``geo``; C-contiguous."""
    kernel, stride, _, dilation = _geometry(geo)
    work = y.size * 4 * int(kernel.prod())
    for_chunks(y.shape[0], lambda lo, hi: max_rows(x, kernel, stride, dilation, relu, y, argmax, lo, hi), work)


def max_backward(g: np.ndarray, argmax: np.ndarray, y: np.ndarray | None, geo: Geometry, tiles: bool,
                 gx: np.ndarray) -> None:
    """``gx`` (N, H, W, C) of max pooling from the output gradient ``g`` and the forward's taps ``argmax``, masked
    where the fused ReLU's output ``y`` is not positive (None: no ReLU); ``tiles``: every input position lies in
    exactly one window."""
    kernel, stride, padding, dilation = _geometry(geo)
    relu, out = y is not None, g if y is None else y  # without a ReLU the kernel reads no output: any (N, Ho, Wo, C)
    work = gx.size * 3

    def run(lo: int, hi: int) -> None:
        gradient_rows(g, argmax, out, relu, kernel, stride, padding, dilation, tiles, gx, lo, hi)

    for_chunks(g.shape[0], run, work)


def ready(dtype: Any) -> None:
    """Compile or load the kernels for C-contiguous ``dtype`` maps and one-byte taps now, by running each once on a
    tiny map (an unreadable cache is rebuilt: :func:`neuroflow_ops_vision.compiled.heal_cache`)."""
    compiled.heal_cache(__name__.rsplit(".", 1)[-1], max_rows, lambda: _run_each(np.dtype(dtype)))


def _run_each(dtype: np.dtype) -> None:
    geo = Geometry((2, 2), (2, 2), (0, 0), (1, 1))
    x = np.ones((1, 2, 2, 3), dtype)
    y, argmax = np.empty((1, 1, 1, 3), dtype), np.empty((1, 1, 1, 3), np.uint8)
    for relu in (False, True):
        max_forward(x, geo, relu, y, argmax)
        max_backward(y, argmax, y if relu else None, geo, relu, x)
