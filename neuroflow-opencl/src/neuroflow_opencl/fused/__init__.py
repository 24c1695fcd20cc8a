"""The opencl backend's fused kernels, by the names ops look them up with (``Backend.kernel(name)``).

Each replaces a run of generic ``xp`` calls (an Adam step is fourteen
elementwise passes; softmax-cross-entropy nine launches) with one launch —
on pocl every launch costs tens of microseconds, so the count matters more
than the arithmetic. They write into the caller's buffers and agree with the
generic code to float rounding (tests/opencl checks both paths).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from neuroflow_opencl.fused import activation, cross_entropy, linear, optim

KERNELS: dict[str, Callable[..., Any]] = {
    "adam_update": optim.adam_update,
    "sgd_update": optim.sgd_update,
    "softmax_cross_entropy": cross_entropy.softmax_cross_entropy,
    "softmax_cross_entropy_backward": cross_entropy.softmax_cross_entropy_backward,
    "activation_backward": activation.activation_backward,
    "linear": linear.linear,
    "linear_weight_grad": linear.linear_weight_grad,
}


def bind(device: Any) -> dict[str, Callable[..., Any]]:
    """Every fused kernel with ``device`` bound as its first argument."""
    return {name: functools.partial(fn, device) for name, fn in KERNELS.items()}
