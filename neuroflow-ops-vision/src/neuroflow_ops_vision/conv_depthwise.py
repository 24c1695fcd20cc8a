"""Depthwise convolution (one filter bank per input channel) on NHWC maps, as a loop over taps.

With one input channel per group a GEMM degenerates to a dot product of
length kh·kw, so each tap is instead a broadcast multiply-add over the whole
map: no column buffer, and the work is kh·kw passes over the output.
``weight`` is (C·m, 1, kh, kw) for depth multiplier m, viewed here as (C, m, kh, kw).

On numpy the tap loops run over the batch split between the cores
(:mod:`neuroflow.backends.cpu_parallel`), each chunk a few samples at a time
so a sample's output and product stay in cache across the taps; every
element gets the same operations in the same order as in one pass. The
weight gradient (a sum over the batch) is split over output rows instead.

On numpy with one filter per channel and at least
:data:`WINDOWS_MIN_CHANNELS` channels, the forward (also at a strided width),
the weight gradient and the stride-1 input gradient (a convolution of the
padded output gradient with the flipped kernel) are each one ``einsum`` per
chunk over a strided view of every window (no copy): each output is written
once, where the loops over taps write it twice per tap and read the
gradient once per tap.

With one filter per channel and stride 1 along the width, a tap's window
has its W and C axes as one contiguous run: the tap's weights tiled W times
then make numpy's inner loop W·C elements long instead of C (at 32 channels
the loop's per-call overhead, not the arithmetic, took the time). The same
products in the same order: bit for bit the C-long loops' result.

With numba installed (the extra ``neuroflow-ops-vision[numba]``), a numpy
depthwise convolution with one filter per channel in float32 or float64 runs
compiled loops instead (:mod:`neuroflow_ops_vision.conv_depthwise_numba`):
no padded copy, no per-tap passes over memory. ``NEUROFLOW_NUMBA=0`` (or
:func:`use_numba`) keeps the numpy code, which stays the reference.
"""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import numpy as np

from neuroflow.backends.cpu_parallel import for_chunks, over_batch
from neuroflow.backends.reductions import sum_rows
from neuroflow_ops_vision import compiled
from neuroflow_ops_vision.conv_gemm import padded_shape, transposed
from neuroflow_ops_vision.windows import Geometry, pad_into, window_view
from neuroflow_ops_vision.workspace import Workspace

#: Channels from which a numpy depthwise convolution with one filter per channel takes its forward, its
#: weight gradient and (stride 1) its input gradient as one ``einsum`` over a strided view of the windows,
#: rather than loops over taps (the forward's on W·C-long rows; any channel count when the width is
#: strided). Measured on the detector's maps, 2 threads, caches flushed between calls, ms, einsum against
#: the loops: forward, batch 16: 24×24×64 1.8 vs 3.8, 12×12×384 1.6 vs 4.2, 48×48×32 4.3 vs 4.3, 48×48×32
#: stride 2 1.7 vs 2.1; batch 1: 12×12×384 0.21 vs 0.34, 48×48×32 0.51 vs 0.47; backward, batch 16:
#: 48×48×32 7.0 vs 9.5, 12×12×384 4.4 vs 7.4; weight gradient alone at (8, 128, 128, 4) 3.2 vs 2.9.
WINDOWS_MIN_CHANNELS = 32

_KERNELS = "conv_depthwise_numba"
use_numba = compiled.use_numba  # one switch for every op's compiled kernels
forget_numba_kernels = compiled.forget


def load_numba_kernels() -> ModuleType | None:
    """The compiled kernels' module, imported (and numba with it) on first use; None without a working numba."""
    return compiled.load(_KERNELS)


def numba_kernels(xp: Any, m: int, dtype: Any) -> ModuleType | None:
    """The numba kernels when they run a depthwise convolution of ``dtype`` with ``m`` filters per channel on
    ``xp``: numpy, one filter per channel, float32 or float64, numba installed and not turned off; else None."""
    return compiled.kernels(_KERNELS, xp, dtype) if m == 1 else None


def gradient_blocks(rows: int) -> tuple[int, int]:
    """(rows per block, blocks) for the compiled weight gradient over ``rows`` output rows: about √rows each, so a
    value passes through about Wo + 2·√rows additions, the bound of :func:`~neuroflow.backends.reductions.sum_rows`
    over per-row sums, with a workspace of about √rows rows instead of ``rows``."""
    per_block = max(math.isqrt(rows), 1)
    return per_block, -(-rows // per_block)


def _sweep(geo: Geometry) -> tuple[int, int, int, int, int, int]:
    return (*geo.stride, *geo.padding, *geo.dilation)


def _taps(ws: Workspace, w4: Any) -> Any:
    """The weight (C, 1, kh, kw) as contiguous (kh, kw, C): each tap's C weights one run, as the kernels read them."""
    taps = ws("depthwise.taps", (w4.shape[2], w4.shape[3], w4.shape[0]), w4.dtype)
    np.copyto(taps, w4[:, 0].transpose(1, 2, 0))
    return taps


def workspace_shapes(xp: Any, x_shape: tuple[int, ...], y_shape: tuple[int, ...], geo: Geometry,
                     dtype: Any) -> list[tuple[int, ...]]:
    """The transient buffers a forward and backward take for an NHWC input ``x_shape`` and output ``y_shape``
    (the planner's declaration of them)."""
    n, h, w, c = x_shape
    ho, wo, out = y_shape[1], y_shape[2], y_shape[3]
    kh, kw = geo.kernel
    if numba_kernels(xp, out // c, dtype) is not None:
        return [(kh, kw, c), (gradient_blocks(n * ho)[1], 2, kh, kw, c)]  # contiguous taps; the weight gradient's sums
    (ph, pw) = geo.padding
    padded = [(n, h + 2 * ph, w + 2 * pw, c)] if ph or pw else []
    # a tap's product in forward and in backward; the last: the weight gradient's per-pixel sums over the batch
    return padded + [y_shape, (n, ho, wo, c), (ho, wo, out)]


def _padded(ws: Workspace, x: Any, geo: Geometry, role: str = "depthwise.xpad") -> Any:
    if geo.padding == (0, 0):
        return x
    xpad = ws(role, padded_shape(x.shape, geo), x.dtype)
    over_batch(ws.xp, x.shape[0], lambda lo, hi: pad_into(x[lo:hi], geo.padding, xpad[lo:hi]), 2 * xpad.size)
    return xpad


def _rows(a: Any) -> Any:
    """(N, H, W, C) ``a`` as (N, H, W·C): a view (its W and C axes are one contiguous run, checked)."""
    n, h, w, c = a.shape
    if a.strides[2] != c * a.strides[3] and w > 1 and c > 1:  # an axis of one merges whatever its stride
        raise ValueError(f"depthwise: a window of strides {a.strides} has no contiguous W·C rows")
    return a.reshape(n, h, w * c)


def _long_rows(xp: Any, m: int, geo: Geometry) -> bool:
    """Whether the taps run on W·C-long rows (see the module's docstring): numpy, one filter per channel, width
    stride 1."""
    return xp is np and m == 1 and geo.stride[1] == 1


def _tiled(ws: Workspace, w4: Any, geo: Geometry, wo: int) -> Any:
    """(taps, wo·C): row k is tap k's weights (C,) repeated ``wo`` times; its first w·C entries serve a tap that
    covers w output columns. One copy into a workspace, for a weight that may change between calls."""
    c, (kh, kw) = w4.shape[0], geo.kernel
    tiled = ws("depthwise.tiled_weights", (kh * kw, wo * c), w4.dtype)
    np.copyto(tiled.reshape(kh * kw, wo, c), w4[:, 0].reshape(c, kh * kw).T[:, None, :])
    return tiled


def forward(ws: Workspace, x: Any, w4: Any, y: Any, geo: Geometry) -> None:
    """y (N, Ho, Wo, C·m) = depthwise conv of x (N, H, W, C) with w4 (C, m, kh, kw)."""
    xp = ws.xp
    n, ho, wo, _ = y.shape
    c, m = w4.shape[0], w4.shape[1]
    kernels = numba_kernels(xp, m, y.dtype)
    if kernels is not None:
        taps, sweep = _taps(ws, w4), _sweep(geo)
        for_chunks(n * ho, lambda lo, hi: kernels.forward_rows(x, taps, y, lo, hi, *sweep),
                   y.size * taps.shape[0] * taps.shape[1] * 2)
        return
    xpad = _padded(ws, x, geo)
    long_rows = _long_rows(xp, m, geo)
    if xp is np and m == 1 and (c >= WINDOWS_MIN_CHANNELS or not long_rows):
        view = window_view(xp, xpad, geo, (ho, wo), 1)
        if view is not None:
            _forward_windows(ws, view[:, :, :, 0], w4, y)
            return
    # With one filter per channel everything stays 4-d: a trailing axis of 1 would make numpy's inner loops one long.
    out = y if m == 1 else y.reshape(n, ho, wo, c, m)
    t = ws("depthwise.tap", out.shape, y.dtype)
    taps = list(geo.taps())
    weights = list(_tiled(ws, w4, geo, wo)) if long_rows else [w4[:, 0, i, j] if m == 1 else w4[:, :, i, j]
                                                                for i, j in taps]

    def run(lo: int, hi: int) -> None:
        for k, (i, j) in enumerate(taps):
            window = xpad[lo:hi, geo.rows(i, ho), geo.cols(j, wo), :]
            target = out[lo:hi] if k == 0 else t[lo:hi]
            if long_rows:
                window, target = _rows(window), _rows(target)
            elif m != 1:
                window = window[..., None]
            xp.multiply(window, weights[k], out=target)
            if k:
                out[lo:hi] += t[lo:hi]

    over_batch(xp, n, run, out.size * len(taps) * 4, out[0].nbytes)


def _forward_windows(ws: Workspace, windows: Any, w4: Any, y: Any) -> None:
    """y (N, Ho, Wo, C) = Σ over taps of ``windows`` (N, Ho, Wo, kh, kw, C), a strided view of the padded input,
    times the weights (C, 1, kh, kw): one ``einsum`` per chunk of samples, which reads each window in place and
    writes each output once, where the loop over taps takes two passes over the output per tap."""
    n, kh, kw = windows.shape[0], windows.shape[3], windows.shape[4]
    taps = _taps(ws, w4)

    def run(lo: int, hi: int) -> None:
        np.einsum("nhwijc,ijc->nhwc", windows[lo:hi], taps, out=y[lo:hi])

    over_batch(np, n, run, y.size * kh * kw * 2)


def _weight_gradient_windows(ws: Workspace, windows: Any, grad: Any, gw4: Any) -> None:
    """gw4 (C, 1, kh, kw) = Σ over N·Ho·Wo of ``windows`` (N, Ho, Wo, kh, kw, C) times ``grad`` (N, Ho, Wo, C).

    One ``einsum`` per chunk of output rows sums each row's Wo positions for every tap at once (the loop over
    taps reads the gradient once per tap); the N·Ho row sums are then added blocked, so no value passes
    through more than about Wo + 2·√(N·Ho) additions (float32 keeps its digits; see
    :mod:`neuroflow.backends.reductions`)."""
    n, ho, kh, kw, c = windows.shape[0], windows.shape[1], windows.shape[3], windows.shape[4], windows.shape[5]
    per_row = ws("depthwise.gw_row", (n, ho, kh, kw, c), grad.dtype)

    def rows(lo: int, hi: int) -> None:
        np.einsum("nhwijc,nhwc->nhijc", windows[:, lo:hi], grad[:, lo:hi], out=per_row[:, lo:hi])

    for_chunks(ho, rows, 2 * grad.size * kh * kw)
    total = sum_rows(np, per_row.reshape(n * ho, kh * kw * c))
    np.copyto(gw4[:, 0], total.reshape(kh, kw, c).transpose(2, 0, 1))


def _weight_gradient_taps(ws: Workspace, xpad: Any, g: Any, gw4: Any, geo: Geometry) -> None:
    """gw4 (C, m, kh, kw) tap by tap from the padded input ``xpad`` and the gradient ``g`` ((N, Ho, Wo, C) with one
    filter per channel, else (N, Ho, Wo, C, m))."""
    xp = ws.xp
    ho, wo, c = g.shape[1], g.shape[2], g.shape[3]
    m = 1 if g.ndim == 4 else g.shape[4]
    # Each tap's Σ over N·Ho·Wo: over the batch per pixel, then over the pixels blocked (float32 keeps its digits).
    per_pixel = ws("depthwise.gw_pixel", (ho, wo, c) if m == 1 else (ho, wo, c, m), g.dtype)
    spec = "nhwc,nhwc->hwc" if m == 1 else "nhwc,nhwcm->hwcm"
    for i, j in geo.taps():
        window = xpad[:, geo.rows(i, ho), geo.cols(j, wo), :]

        def rows(lo: int, hi: int, window: Any = window) -> None:  # each output row's Σ over n, whole
            xp.einsum(spec, window[:, lo:hi], g[:, lo:hi], out=per_pixel[lo:hi])

        if xp is np:
            for_chunks(ho, rows, 2 * g.size)
        else:
            rows(0, ho)
        gw4[:, :, i, j] = sum_rows(xp, per_pixel.reshape(ho * wo, c * m)).reshape(c, m)


def backward(ws: Workspace, x: Any, grad: Any, w4: Any, gw4: Any | None, gx: Any | None, geo: Geometry) -> None:
    """Write the weight gradient into ``gw4`` (C, m, kh, kw) and the input gradient into ``gx``; None skips either."""
    xp = ws.xp
    n, ho, wo, _ = grad.shape
    c, m = w4.shape[0], w4.shape[1]
    kernels = numba_kernels(xp, m, grad.dtype)
    if kernels is not None:
        _backward_numba(kernels, ws, x, grad, w4, gw4, gx, geo)
        return
    g = grad if m == 1 else grad.reshape(n, ho, wo, c, m)
    if gw4 is not None:
        xpad = _padded(ws, x, geo)
        view = window_view(xp, xpad, geo, (ho, wo), 1) if xp is np and m == 1 and c >= WINDOWS_MIN_CHANNELS else None
        if view is not None:
            _weight_gradient_windows(ws, view[:, :, :, 0], grad, gw4)
        else:
            _weight_gradient_taps(ws, xpad, g, gw4, geo)
    if gx is None:
        return
    long_rows = _long_rows(xp, m, geo)
    sweep = transposed(geo)
    if xp is np and m == 1 and c >= WINDOWS_MIN_CHANNELS and sweep is not None:
        # stride 1: the input gradient is the depthwise convolution of the output gradient, padded by
        # d·(k−1)−p, with the kernel flipped in both axes; one einsum over its windows, as in forward
        gpad = _padded(ws, grad, sweep, "depthwise.gpad")
        view = window_view(xp, gpad, sweep, (x.shape[1], x.shape[2]), 1)
        if view is not None:
            _forward_windows(ws, view[:, :, :, 0], w4[:, :, ::-1, ::-1], gx)
            return
    t = ws("depthwise.gtap", x.shape[:1] + (ho, wo, c), grad.dtype)
    tiled = _tiled(ws, w4, geo, wo) if long_rows else None
    clips = []
    for k, (i, j) in enumerate(geo.taps()):
        clip = geo.clipped(i, j, (x.shape[1], x.shape[2]), (ho, wo))
        if clip is None:
            continue
        if tiled is not None:  # the tap's weights tiled over the output columns it covers
            weight = tiled[k, :(clip[1].stop - clip[1].start) * c]
        else:
            weight = w4[:, 0, i, j] if m == 1 else w4[:, :, i, j]
        clips.append((clip, weight))

    def run(lo: int, hi: int) -> None:
        gx[lo:hi] = 0
        for (ro, co, ri, ci), weight in clips:
            part, into = t[lo:hi, ro, co, :], gx[lo:hi, ri, ci, :]
            if long_rows:
                part, into = _rows(part), _rows(into)
                xp.multiply(_rows(g[lo:hi, ro, co, :]), weight, out=part)
            elif m == 1:
                xp.multiply(g[lo:hi, ro, co, :], weight, out=part)
            else:
                part[...] = xp.einsum("nhwcm,cm->nhwc", g[lo:hi, ro, co], weight)
            into += part

    over_batch(xp, x.shape[0], run, gx.size * (1 + 4 * len(clips)), gx[0].nbytes + t[0].nbytes)


def _backward_numba(kernels: ModuleType, ws: Workspace, x: Any, grad: Any, w4: Any, gw4: Any | None, gx: Any | None,
                    geo: Geometry) -> None:
    """:func:`backward` with the compiled kernels: the weight gradient as sums over blocks of output rows (each
    row summed whole first; :func:`gradient_blocks`) added blocked, the input gradient gathered row by row."""
    n, ho, wo, c = grad.shape
    kh, kw = geo.kernel
    sweep = _sweep(geo)
    work = grad.size * kh * kw * 2
    if gw4 is not None:
        rows, count = gradient_blocks(n * ho)
        sums = ws("depthwise.gw_blocks", (count, 2, kh, kw, c), grad.dtype)
        for_chunks(count, lambda lo, hi: kernels.weight_gradient_blocks(x, grad, sums, lo, hi, rows, *sweep), work)
        total = sum_rows(np, sums[:, 0].reshape(count, kh * kw * c))
        np.copyto(gw4[:, 0], total.reshape(kh, kw, c).transpose(2, 0, 1))
    if gx is not None:
        taps = _taps(ws, w4)
        for_chunks(n * x.shape[1], lambda lo, hi: kernels.input_gradient_rows(grad, taps, gx, lo, hi, *sweep), work)
