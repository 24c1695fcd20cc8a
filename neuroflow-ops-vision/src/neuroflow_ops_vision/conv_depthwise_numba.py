"""Depthwise convolution kernels compiled by numba: forward, input gradient and the weight gradient's block sums.

numpy runs a depthwise convolution as kh·kw broadcast passes over the whole
map (or one ``einsum`` over strided windows), each reading and writing
memory; these loops read each input row once per tap while the output row
stays in L1, and skip the padding instead of copying the map into a padded
buffer. Every output element gets the same products added in the same tap
order as numpy's loop over taps (no fused multiply-add), so float32 results
agree with it to rounding and float64 ones to 1e-15.

Each kernel runs over a range of rows and releases the GIL, so
:mod:`neuroflow.backends.cpu_parallel` splits the rows between the cores
exactly as it splits the numpy passes; a row is written by one chunk only,
so the result does not depend on the thread count.

Importing this module imports numba (about half a second); the op imports
it on its first depthwise call (see :mod:`neuroflow_ops_vision.conv_depthwise`).
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from neuroflow_ops_vision import compiled

# Every kernel is compiled with nogil=True (cpu_parallel's threads run chunks at once) and cache=True (compiled
# once per machine, in __pycache__ or NUMBA_CACHE_DIR, not once per process: about 2 s for the three).


@numba.njit(inline="always")
def _span(offset: int, stride: int, size: int, count: int) -> tuple[int, int]:
    """The output positions o in [lo, hi) whose input position o·stride + offset lies in [0, size)."""
    lo = 0 if offset >= 0 else (stride - 1 - offset) // stride
    last = size - 1 - offset
    hi = last // stride + 1 if last >= 0 else 0
    return lo, min(hi, count)


@numba.njit(nogil=True, cache=True)
def forward_rows(x: Any, taps: Any, y: Any, lo: int, hi: int, sh: int, sw: int, ph: int, pw: int, dh: int,
                 dw: int) -> None:
    """Rows ``lo:hi`` of ``y`` (N, Ho, Wo, C) viewed as N·Ho rows: the convolution of ``x`` (N, H, W, C) with
    ``taps`` (kh, kw, C)."""
    h, w, c = x.shape[1], x.shape[2], x.shape[3]
    kh, kw = taps.shape[0], taps.shape[1]
    ho, wo = y.shape[1], y.shape[2]
    for r in range(lo, hi):
        n, oh = r // ho, r % ho
        out = y[n, oh]
        out[:, :] = 0
        for i in range(kh):
            ih = oh * sh - ph + i * dh
            if ih < 0 or ih >= h:
                continue
            row = x[n, ih]
            for j in range(kw):
                offset = j * dw - pw
                first, stop = _span(offset, sw, w, wo)
                tap = taps[i, j]
                for ow in range(first, stop):
                    src, dst = row[ow * sw + offset], out[ow]
                    for k in range(c):
                        dst[k] += src[k] * tap[k]


@numba.njit(nogil=True, cache=True)
def input_gradient_rows(g: Any, taps: Any, gx: Any, lo: int, hi: int, sh: int, sw: int, ph: int, pw: int, dh: int,
                        dw: int) -> None:
    """Rows ``lo:hi`` of ``gx`` (N, H, W, C) viewed as N·H rows: the gradient of the input from ``g``
    (N, Ho, Wo, C); each input row gathers from the output rows whose windows cover it."""
    h, w, c = gx.shape[1], gx.shape[2], gx.shape[3]
    kh, kw = taps.shape[0], taps.shape[1]
    ho, wo = g.shape[1], g.shape[2]
    for r in range(lo, hi):
        n, ih = r // h, r % h
        out = gx[n, ih]
        out[:, :] = 0
        for i in range(kh):
            reach = ih + ph - i * dh  # = oh·sh for the output row oh that tap row i reads this row from
            if reach < 0 or reach % sh != 0 or reach // sh >= ho:
                continue
            grow = g[n, reach // sh]
            for j in range(kw):
                offset = j * dw - pw
                first, stop = _span(offset, sw, w, wo)
                tap = taps[i, j]
                for ow in range(first, stop):
                    src, dst = grow[ow], out[ow * sw + offset]
                    for k in range(c):
                        dst[k] += src[k] * tap[k]


@numba.njit(nogil=True, cache=True)
def weight_gradient_blocks(x: Any, g: Any, sums: Any, lo: int, hi: int, rows: int, sh: int, sw: int, ph: int, pw: int,
                           dh: int, dw: int) -> None:
    """Blocks ``lo:hi`` of ``sums`` (blocks, 2, kh, kw, C): ``sums[b, 0]`` is the Σ over the output rows
    ``b·rows`` to ``(b+1)·rows`` (of N·Ho) of each row's Σ over its Wo positions of the input under tap (i, j)
    times the gradient ``g`` (N, Ho, Wo, C); ``sums[b, 1]`` holds the row being summed. Each row is summed
    whole before it is added to its block, so a value passes through Wo + ``rows`` additions here and the
    caller's sum over the blocks (blocked): the bound of the per-row sums it replaces, without a buffer of
    N·Ho rows."""
    h, w, c = x.shape[1], x.shape[2], x.shape[3]
    kh, kw = sums.shape[2], sums.shape[3]
    ho, wo = g.shape[1], g.shape[2]
    total = g.shape[0] * ho
    for b in range(lo, hi):
        block, row_sums = sums[b, 0], sums[b, 1]
        block[:, :, :] = 0
        for r in range(b * rows, min((b + 1) * rows, total)):
            n, oh = r // ho, r % ho
            row_sums[:, :, :] = 0
            grow = g[n, oh]
            for i in range(kh):
                ih = oh * sh - ph + i * dh
                if ih < 0 or ih >= h:
                    continue
                row = x[n, ih]
                for j in range(kw):
                    offset = j * dw - pw
                    first, stop = _span(offset, sw, w, wo)
                    acc = row_sums[i, j]
                    for ow in range(first, stop):
                        src, grad = row[ow * sw + offset], grow[ow]
                        for k in range(c):
                            acc[k] += src[k] * grad[k]
                    into = block[i, j]
                    for k in range(c):
                        into[k] += acc[k]


def ready(dtype: Any) -> None:
    """Compile or load the kernels for C-contiguous ``dtype`` arrays now, by running each once on a tiny map (an
    unreadable cache is rebuilt: :func:`neuroflow_ops_vision.compiled.heal_cache`)."""
    compiled.heal_cache(__name__.rsplit(".", 1)[-1], forward_rows, lambda: _run_each(dtype))


def _run_each(dtype: Any) -> None:
    x = np.ones((1, 2, 2, 1), dtype)
    taps, out = np.ones((1, 1, 1), dtype), np.empty((1, 2, 2, 1), dtype)
    sweep = (1, 1, 0, 0, 1, 1)
    forward_rows(x, taps, out, 0, 2, *sweep)
    input_gradient_rows(x, taps, out, 0, 2, *sweep)
    weight_gradient_blocks(x, x, np.empty((2, 2, 1, 1, 1), dtype), 0, 2, 1, *sweep)
