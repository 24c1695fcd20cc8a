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

With one filter per channel and stride 1 along the width, a tap's window
has its W and C axes as one contiguous run: the tap's weights tiled W times
then make numpy's inner loop W·C elements long instead of C (at 32 channels
the loop's per-call overhead, not the arithmetic, took the time). The same
products in the same order: bit for bit the C-long loops' result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow.backends.cpu_parallel import for_chunks, over_batch
from neuroflow.backends.reductions import sum_rows
from neuroflow_ops_vision.conv_gemm import padded_shape
from neuroflow_ops_vision.windows import Geometry, pad_into
from neuroflow_ops_vision.workspace import Workspace


def _padded(ws: Workspace, x: Any, geo: Geometry) -> Any:
    if geo.padding == (0, 0):
        return x
    xpad = ws("depthwise.xpad", padded_shape(x.shape, geo), x.dtype)
    over_batch(ws.xp, x.shape[0], lambda lo, hi: pad_into(x[lo:hi], geo.padding, xpad[lo:hi]), 2 * xpad.size)
    return xpad


def _rows(a: Any) -> Any:
    """(N, H, W, C) ``a`` as (N, H, W·C): a view (its W and C axes are one contiguous run, checked)."""
    n, h, w, c = a.shape
    if a.strides[2] != c * a.strides[3]:
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
    xpad = _padded(ws, x, geo)
    # With one filter per channel everything stays 4-d: a trailing axis of 1 would make numpy's inner loops one long.
    out = y if m == 1 else y.reshape(n, ho, wo, c, m)
    t = ws("depthwise.tap", out.shape, y.dtype)
    taps = list(geo.taps())
    weights = [w4[:, 0, i, j] if m == 1 else w4[:, :, i, j] for i, j in taps]
    long_rows = _long_rows(xp, m, geo)
    if long_rows:
        weights = list(_tiled(ws, w4, geo, wo))

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


def backward(ws: Workspace, x: Any, grad: Any, w4: Any, gw4: Any | None, gx: Any | None, geo: Geometry) -> None:
    """Write the weight gradient into ``gw4`` (C, m, kh, kw) and the input gradient into ``gx``; None skips either."""
    xp = ws.xp
    n, ho, wo, _ = grad.shape
    c, m = w4.shape[0], w4.shape[1]
    g = grad if m == 1 else grad.reshape(n, ho, wo, c, m)
    if gw4 is not None:
        xpad = _padded(ws, x, geo)
        # Each tap's Σ over N·Ho·Wo: over the batch per pixel, then over the pixels blocked (float32 keeps its digits).
        per_pixel = ws("depthwise.gw_pixel", (ho, wo, c) if m == 1 else (ho, wo, c, m), grad.dtype)
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
    if gx is None:
        return
    t = ws("depthwise.gtap", x.shape[:1] + (ho, wo, c), grad.dtype)
    long_rows = _long_rows(xp, m, geo)
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
