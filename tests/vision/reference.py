"""Naive float64 references for the vision ops: direct loops over output pixels and kernel taps.

Nothing here is shared with the ops: no im2col, no strided views, no GEMM.
Inputs and outputs are NCHW.
"""

from __future__ import annotations

import numpy as np


def to_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """An NCHW array in ``layout`` (a contiguous copy for NHWC)."""
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1)) if layout == "NHWC" else x


def from_layout(x: np.ndarray, layout: str) -> np.ndarray:
    """An array in ``layout`` as NCHW."""
    return x.transpose(0, 3, 1, 2) if layout == "NHWC" and x.ndim == 4 else x


def conv2d(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: tuple[int, int], padding: tuple[int, int],
           dilation: tuple[int, int], groups: int) -> np.ndarray:
    """y[n, o, i, j] = b[o] + Σ_{c, a, e} x_pad[n, g·Cg + c, i·s + a·d, j·s + e·d] · w[o, c, a, e]."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    wo = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    y = np.zeros((n, o, ho, wo))
    for oc in range(o):
        g = oc // og
        for i in range(ho):
            for j in range(wo):
                total = np.zeros(n)
                for ci in range(cg):
                    for a in range(kh):
                        for e in range(kw):
                            total += xp[:, g * cg + ci, i * sh + a * dh, j * sw + e * dw] * w[oc, ci, a, e]
                y[:, oc, i, j] = total + (0.0 if b is None else b[oc])
    return y


def conv2d_grads(x: np.ndarray, w: np.ndarray, gy: np.ndarray, stride: tuple[int, int], padding: tuple[int, int],
                 dilation: tuple[int, int], groups: int) -> tuple[np.ndarray, np.ndarray]:
    """(gx, gw) of Σ y·gy by the adjoint of the loops in :func:`conv2d`."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw))
    xp[:, :, ph:ph + h, pw:pw + wd] = x
    gxp = np.zeros_like(xp)
    gw = np.zeros_like(w)
    og = o // groups
    for oc in range(o):
        g = oc // og
        for i in range(gy.shape[2]):
            for j in range(gy.shape[3]):
                for ci in range(cg):
                    for a in range(kh):
                        for e in range(kw):
                            r, s = i * sh + a * dh, j * sw + e * dw
                            gw[oc, ci, a, e] += np.dot(gy[:, oc, i, j], xp[:, g * cg + ci, r, s])
                            gxp[:, g * cg + ci, r, s] += gy[:, oc, i, j] * w[oc, ci, a, e]
    return gxp[:, :, ph:ph + h, pw:pw + wd], gw


def max_pool2d(x: np.ndarray, k: int, s: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """(y, gx for an all-ones output gradient): the first maximum of each window (row-major) gets the gradient."""
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * p, w + 2 * p), -np.inf)
    xp[:, :, p:p + h, p:p + w] = x
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y = np.empty((n, c, ho, wo))
    gxp = np.zeros_like(xp)
    for b in range(n):
        for ch in range(c):
            for i in range(ho):
                for j in range(wo):
                    window = xp[b, ch, i * s:i * s + k, j * s:j * s + k]
                    flat = int(np.argmax(window))  # argmax returns the first maximum
                    y[b, ch, i, j] = window.flat[flat]
                    gxp[b, ch, i * s + flat // k, j * s + flat % k] += 1.0
    return y, gxp[:, :, p:p + h, p:p + w]


def avg_pool2d(x: np.ndarray, k: int, s: int, p: int) -> np.ndarray:
    """Mean over each window, padding counted as zeros (count_include_pad=True)."""
    n, c, h, w = x.shape
    xp = np.zeros((n, c, h + 2 * p, w + 2 * p))
    xp[:, :, p:p + h, p:p + w] = x
    ho, wo = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    y = np.empty((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            y[:, :, i, j] = xp[:, :, i * s:i * s + k, j * s:j * s + k].mean(axis=(2, 3))
    return y


def batch_norm_train(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=(0, 2, 3), keepdims=True)
    var = x.var(axis=(0, 2, 3), keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * gamma[:, None, None] + beta[:, None, None]
