"""Softmax-cross-entropy: one launch forward (a work item per row), one backward (per element).

Offsets, strides and the smoothing constants come from cached parameter buffers (``Device.constants``):
pocl charges ~9 µs per scalar kernel argument.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from neuroflow_opencl.array import ClArray
from neuroflow_opencl.cdtypes import c_type, preamble


@cache
def _forward_source(dtype: Any, label_dtype: Any) -> str:
    t, lt = c_type(dtype), c_type(label_dtype)
    return preamble(dtype) + f"""__kernel void xent(__global const {t}* logits, __global const {lt}* labels,
                   __global {t}* probs, __global {t}* row_loss, __global const long* restrict P,
                   __global const {t}* restrict F)
{{
    const long l_off = P[0], l_rs = P[1], l_cs = P[2], y_off = P[3], y_s = P[4], p_off = P[5], r_off = P[6], c = P[7];
    const {t} eps = F[0];
    long row = get_global_id(0);
    __global const {t}* z = logits + l_off + row * l_rs;
    __global {t}* p = probs + p_off + row * c;
    {t} top = z[0];
    for (long j = 1; j < c; ++j) top = fmax(top, z[j * l_cs]);
    {t} total = 0, shifted_sum = 0;
    for (long j = 0; j < c; ++j) {{
        {t} s = z[j * l_cs] - top;
        shifted_sum += s;
        {t} e = exp(s);
        p[j] = e;
        total += e;
    }}
    {t} inv = 1 / total;
    for (long j = 0; j < c; ++j) p[j] *= inv;
    {t} log_norm = log(total);
    long label = (long)labels[y_off + row * y_s];
    // an out-of-range label reads nothing and makes the loss NaN; the core loss then names the bad label
    {t} nll = (label >= 0 && label < c) ? log_norm - (z[label * l_cs] - top) : NAN;
    row_loss[r_off + row] = (1 - eps) * nll + eps * (log_norm - shifted_sum / c);
}}
"""


def softmax_cross_entropy(device: Any, logits: ClArray, labels: ClArray, probs: ClArray, row_loss: ClArray,
                          smoothing: float = 0.0) -> float:
    """Mean cross-entropy of ``logits`` (n, c) against ``labels``; ``probs`` receives the softmax.

    The loss value read back here is the training step's one host wait. An
    out-of-range label reads no memory and makes the loss NaN.
    """
    n, c = logits.shape
    if not (probs.is_contiguous and row_loss.is_contiguous):
        raise ValueError("softmax_cross_entropy: probs and row_loss must be dense buffers")
    kernel = device.kernel(_forward_source(logits.dtype, labels.dtype), "xent")
    params = device.constants((logits.offset, *logits.estrides, labels.offset, labels.estrides[0], probs.offset,
                               row_loss.offset, c))
    kernel(device.queue, (n,), None, logits.buffer, labels.buffer, probs.buffer, row_loss.buffer, params,
           device.constants((smoothing,), logits.dtype))
    return float(row_loss.get().mean(dtype=np.float64))


@cache
def _backward_source(dtype: Any, label_dtype: Any) -> str:
    t, lt = c_type(dtype), c_type(label_dtype)
    return preamble(dtype) + f"""__kernel void xent_grad(__global {t}* probs, __global const {lt}* labels,
                        __global const long* restrict P, __global const {t}* restrict F)
{{
    const long p_off = P[0], y_off = P[1], y_s = P[2], c = P[3];
    const {t} off_value = F[0], hit = F[1], scale = F[2];
    long i = get_global_id(0);
    long row = i / c;
    {t} g = probs[p_off + i] - off_value;
    if ((long)labels[y_off + row * y_s] == i - row * c) g -= hit;
    probs[p_off + i] = g * scale;
}}
"""


def softmax_cross_entropy_backward(device: Any, probs: ClArray, labels: ClArray, scale: float = 1.0,
                                   smoothing: float = 0.0) -> ClArray:
    """Turn ``probs`` into the logits' gradient in place (times ``scale``, over the batch mean); returns it."""
    n, c = probs.shape
    if n == 0:
        return probs
    kernel = device.kernel(_backward_source(probs.dtype, labels.dtype), "xent_grad")
    params = device.constants((probs.offset, labels.offset, labels.estrides[0], c))
    factors = device.constants((smoothing / c, 1.0 - smoothing, scale / max(n, 1)), probs.dtype)
    kernel(device.queue, (n * c,), None, probs.buffer, labels.buffer, params, factors)
    return probs
