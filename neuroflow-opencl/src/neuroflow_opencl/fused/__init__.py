"""The opencl backend's fused kernels, registered against their declarations in ``neuroflow.backends.kernels``.

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

from neuroflow.backends import kernels
from neuroflow_opencl.fused import activation, cross_entropy, linear, optim

#: Each declared kernel (``neuroflow.backends.kernels``) this backend implements → its function(device, ...).
KERNELS: dict[kernels.FusedKernel, Callable[..., Any]] = {
    kernels.ADAM_UPDATE: optim.adam_update,
    kernels.SGD_UPDATE: optim.sgd_update,
    kernels.SOFTMAX_CROSS_ENTROPY: cross_entropy.softmax_cross_entropy,
    kernels.SOFTMAX_CROSS_ENTROPY_BACKWARD: cross_entropy.softmax_cross_entropy_backward,
    kernels.ACTIVATION_BACKWARD: activation.activation_backward,
    kernels.LINEAR: linear.linear,
    kernels.LINEAR_WEIGHT_GRAD: linear.linear_weight_grad,
}


def bind(device: Any) -> dict[str, Callable[..., Any]]:
    """Every fused kernel by name, with ``device`` bound as its first argument (checked against its declaration)."""
    return kernels.implementations("opencl", {kernel: functools.partial(fn, device) for kernel, fn in KERNELS.items()})
