"""The cuda backend's fused kernels, registered against their declarations in ``neuroflow.backends.kernels``.

Each entry takes the op's own arrays (CuPy, float32/float64) and writes in
place, so a steady-state step still allocates nothing. The generic
implementation an op falls back to when a backend has no entry is the op's
own code on ``xp``; these must agree with it to float rounding, which
``tests/cuda`` checks against the cpu backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from neuroflow.backends import kernels
from neuroflow_cuda.kernels import activation, linear, optim, softmax_xent

#: Each declared kernel this backend implements → its function(cupy, ...).
KERNELS: dict[kernels.FusedKernel, Callable[..., Any]] = {
    kernels.ADAM_UPDATE: optim.adam_update,
    kernels.SGD_UPDATE: optim.sgd_update,
    kernels.SOFTMAX_CROSS_ENTROPY: softmax_xent.softmax_cross_entropy,
    kernels.SOFTMAX_CROSS_ENTROPY_BACKWARD: softmax_xent.softmax_cross_entropy_backward,
    kernels.ACTIVATION_BACKWARD: activation.activation_backward,
    kernels.LINEAR: linear.linear,
    kernels.LINEAR_WEIGHT_GRAD: linear.linear_weight_grad,
}


def bind(cupy: Any, disabled: frozenset[str] = frozenset()) -> dict[str, Callable[..., Any]]:
    """Every kernel by name with CuPy bound as its first argument, minus the ``disabled`` names."""
    known = [kernel.name for kernel in KERNELS]
    unknown = disabled - set(known)
    if unknown:
        raise ValueError(f"NEUROFLOW_CUDA_DISABLE names unknown kernels {sorted(unknown)}; known: {', '.join(known)}")
    return kernels.implementations("cuda", {kernel: functools.partial(fn, cupy) for kernel, fn in KERNELS.items()
                                            if kernel.name not in disabled})
