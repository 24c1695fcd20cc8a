"""The cuda backend's fast kernels, by the names ops look them up with (``Backend.kernel(name)``).

Each entry takes the op's own arrays (CuPy, contiguous, float32/float64) and
writes in place, so a steady-state step still allocates nothing. The generic
implementation an op falls back to when a backend has no entry is the op's
own code on ``xp``; these must agree with it to float rounding, which
``tests/cuda`` checks against the cpu backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from neuroflow_cuda.kernels import activation, batchnorm, im2col, optim, softmax_xent

#: name → function(cupy, ...); the signatures are the contract listed in this package's README.
KERNELS: dict[str, Callable[..., Any]] = {
    "bias_activation": activation.bias_activation,
    "activation_backward": activation.activation_backward,
    "softmax_cross_entropy": softmax_xent.softmax_cross_entropy,
    "softmax_cross_entropy_backward": softmax_xent.softmax_cross_entropy_backward,
    "batchnorm_forward": batchnorm.batchnorm_forward,
    "batchnorm_backward": batchnorm.batchnorm_backward,
    "im2col": im2col.im2col,
    "col2im": im2col.col2im,
    "adam_update": optim.adam_update,
    "sgd_update": optim.sgd_update,
}


def bind(cupy: Any, disabled: frozenset[str] = frozenset()) -> dict[str, Callable[..., Any]]:
    """Every kernel with CuPy bound as its first argument, minus the ``disabled`` names."""
    unknown = disabled - set(KERNELS)
    if unknown:
        raise ValueError(f"NEUROFLOW_CUDA_DISABLE names unknown kernels {sorted(unknown)}; known: {', '.join(KERNELS)}")
    return {name: functools.partial(fn, cupy) for name, fn in KERNELS.items() if name not in disabled}
