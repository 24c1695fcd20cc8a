"""Optimizer updates over the flat parameter buffer: one kernel for all parameters."""

from __future__ import annotations

import math
from functools import cache
from typing import Any

import numpy as np

from neuroflow_opencl.array import ClArray
from neuroflow_opencl.cdtypes import c_type, preamble


def _dense(name: str, **arrays: ClArray) -> None:
    for key, a in arrays.items():
        if not a.is_contiguous:
            raise ValueError(f"{name}: {key} must be a dense 1-D buffer (a FlatParameters view)")


@cache
def _adam_source(dtype: Any) -> str:
    t = c_type(dtype)
    return preamble(dtype) + f"""__kernel void adam(__global {t}* data, long d_off, __global const {t}* grad, long g_off,
                   __global {t}* m, long m_off, __global {t}* v, long v_off, long n,
                   {t} decay, {t} l2, {t} b1, {t} b2, {t} eps_c, {t} step)
{{
    long i = get_global_id(0);
    if (i >= n) return;
    {t} p = data[d_off + i];
    {t} g = grad[g_off + i] + l2 * p;
    {t} mi = b1 * m[m_off + i] + (1 - b1) * g;
    {t} vi = b2 * v[v_off + i] + (1 - b2) * (g * g);
    m[m_off + i] = mi;
    v[v_off + i] = vi;
    data[d_off + i] = p * decay - step * (mi / (sqrt(vi) + eps_c));
}}
"""


def adam_update(device: Any, data: ClArray, grad: ClArray, m: ClArray, v: ClArray, *, lr: float, beta1: float,
                beta2: float, eps: float, weight_decay: float, decoupled: bool, step: int) -> None:
    """Adam/AdamW step ``step`` (1-based) in place, with the bias corrections folded as the generic code does."""
    if step < 1:
        raise ValueError(f"adam_update: step is 1-based; got {step}")
    _dense("adam_update", data=data, grad=grad, m=m, v=v)
    n = data.size
    if not n:
        return
    c = math.sqrt(1.0 - beta2**step)
    t = data.dtype.type
    decay = 1.0 - lr * weight_decay if decoupled and weight_decay else 1.0
    l2 = 0.0 if decoupled else weight_decay
    kernel = device.kernel(_adam_source(data.dtype), "adam")
    kernel(device.queue, (n,), None, data.buffer, np.int64(data.offset), grad.buffer, np.int64(grad.offset),
           m.buffer, np.int64(m.offset), v.buffer, np.int64(v.offset), np.int64(n), t(decay), t(l2), t(beta1),
           t(beta2), t(eps * c), t(lr * c / (1.0 - beta1**step)))


@cache
def _sgd_source(dtype: Any, momentum: bool, nesterov: bool, first: bool) -> str:
    t = c_type(dtype)
    body = [f"    {t} p = data[d_off + i];", f"    {t} g = grad[g_off + i] + wd * p;"]
    if momentum:
        body.append(f"    {t} b = g;" if first else f"    {t} b = mu * buf[b_off + i] + (1 - dampening) * g;")
        body.append("    buf[b_off + i] = b;")
        body.append("    data[d_off + i] = p - lr * g - (lr * mu) * b;" if nesterov else "    data[d_off + i] = p - lr * b;")
    else:
        body.append("    data[d_off + i] = p - lr * g;")
    lines = "\n".join(body)
    return preamble(dtype) + f"""__kernel void sgd(__global {t}* data, long d_off, __global const {t}* grad, long g_off,
                  __global {t}* buf, long b_off, long n, {t} lr, {t} mu, {t} dampening, {t} wd)
{{
    long i = get_global_id(0);
    if (i >= n) return;
{lines}
}}
"""


def sgd_update(device: Any, data: ClArray, grad: ClArray, buf: ClArray | None, *, lr: float, momentum: float = 0.0,
               dampening: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0, first: bool = False) -> None:
    """SGD step in place (PyTorch semantics: the first step copies the gradient into the momentum buffer)."""
    _dense("sgd_update", data=data, grad=grad)
    n = data.size
    if not n:
        return
    has_momentum = bool(momentum) and buf is not None
    t = data.dtype.type
    kernel = device.kernel(_sgd_source(data.dtype, has_momentum, bool(nesterov), bool(first)), "sgd")
    target = buf if has_momentum and buf is not None else grad
    kernel(device.queue, (n,), None, data.buffer, np.int64(data.offset), grad.buffer, np.int64(grad.offset),
           target.buffer, np.int64(target.offset), np.int64(n), t(lr), t(momentum), t(dampening), t(weight_decay))
