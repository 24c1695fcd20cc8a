"""Activation backward in one pass: ``gx = g · act'`` from what the op cached."""

from __future__ import annotations

from typing import Any

from neuroflow_opencl.array import ClArray
from neuroflow_opencl.elementwise import run

# a0 is the cached array (the output, or the input for leaky_relu), a1 the incoming gradient, a2 the slope;
# the products are ordered as the generic code orders them, so both round alike.
_DERIVATIVES = {
    "relu": "(a0 > 0) ? a1 : 0",
    "leaky_relu": "(a0 > 0) ? a1 : a1 * a2",
    "sigmoid": "((1 - a0) * a0) * a1",
    "tanh": "(1 - a0 * a0) * a1",
}


def activation_backward(device: Any, cached: ClArray, g: ClArray, gx: ClArray, activation: str,
                        slope: float = 0.0) -> ClArray:
    try:
        expr = _DERIVATIVES[activation]
    except KeyError:
        raise ValueError(f"activation_backward knows {', '.join(_DERIVATIVES)}; got {activation!r}") from None
    run(gx, expr, (cached, g, float(slope)), gx.dtype)
    return gx
