"""Depthwise convolution (one filter bank per input channel) on NHWC maps, as a loop over taps.

With one input channel per group a GEMM degenerates to a dot product of
length kh·kw, so each tap is instead a broadcast multiply-add over the whole
map: no column buffer, and the work is kh·kw passes over the output.
``weight`` is (C·m, 1, kh, kw) for depth multiplier m, viewed here as (C, m, kh, kw).
"""

from __future__ import annotations

from typing import Any

from neuroflow.backends.reductions import sum_rows
from neuroflow_ops_vision.conv_gemm import padded_shape
from neuroflow_ops_vision.windows import Geometry, pad_into
from neuroflow_ops_vision.workspace import Workspace


def _padded(ws: Workspace, x: Any, geo: Geometry) -> Any:
    if geo.padding == (0, 0):
        return x
    return pad_into(x, geo.padding, ws("depthwise.xpad", padded_shape(x.shape, geo), x.dtype))


def forward(ws: Workspace, x: Any, w4: Any, y: Any, geo: Geometry) -> None:
    """y (N, Ho, Wo, C·m) = depthwise conv of x (N, H, W, C) with w4 (C, m, kh, kw)."""
    xp = ws.xp
    n, ho, wo, _ = y.shape
    c, m = w4.shape[0], w4.shape[1]
    xpad = _padded(ws, x, geo)
    # With one filter per channel everything stays 4-d: a trailing axis of 1 would make numpy's inner loops one long.
    out = y if m == 1 else y.reshape(n, ho, wo, c, m)
    t = ws("depthwise.tap", out.shape, y.dtype)
    for k, (i, j) in enumerate(geo.taps()):
        window = xpad[:, geo.rows(i, ho), geo.cols(j, wo), :]
        weight = w4[:, 0, i, j] if m == 1 else w4[:, :, i, j]
        if m != 1:
            window = window[..., None]
        xp.multiply(window, weight, out=out if k == 0 else t)
        if k:
            out += t


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
        for i, j in geo.taps():
            window = xpad[:, geo.rows(i, ho), geo.cols(j, wo), :]
            if m == 1:
                xp.einsum("nhwc,nhwc->hwc", window, g, out=per_pixel)
            else:
                xp.einsum("nhwc,nhwcm->hwcm", window, g, out=per_pixel)
            gw4[:, :, i, j] = sum_rows(xp, per_pixel.reshape(ho * wo, c * m)).reshape(c, m)
    if gx is None:
        return
    gx[...] = 0
    t = ws("depthwise.gtap", x.shape[:1] + (ho, wo, c), grad.dtype)
    for i, j in geo.taps():
        clip = geo.clipped(i, j, (x.shape[1], x.shape[2]), (ho, wo))
        if clip is None:
            continue
        ro, co, ri, ci = clip
        part = t[:, ro, co, :]
        if m == 1:
            xp.multiply(g[:, ro, co, :], w4[:, 0, i, j], out=part)
        else:
            part[...] = xp.einsum("nhwcm,cm->nhwc", g[:, ro, co], w4[:, :, i, j])
        gx[:, ri, ci, :] += part
