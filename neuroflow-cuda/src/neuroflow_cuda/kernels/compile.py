"""Compiling the fused kernels: one CUDA C source per op family, built per dtype on first use.

Each source is written against a typedef ``T`` (float or double) so the same
kernel serves float32 training and float64 checks. Compilation goes through
``cupy.RawModule`` (NVRTC), cached per (family, dtype) for the process and on
disk by CuPy across processes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

C_TYPES = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
THREADS = 256
MAX_BLOCKS = 4096


class KernelFamily:
    """The CUDA C ``source`` of related kernels named in ``functions``, compiled lazily per dtype."""

    def __init__(self, name: str, source: str, functions: tuple[str, ...]) -> None:
        self.name, self.source, self.functions = name, source, functions
        self._modules: dict[np.dtype, Any] = {}

    def code(self, dtype: Any) -> str:
        """The full translation unit for ``dtype``: the typedef, then the family's source."""
        dt = np.dtype(dtype)
        if dt not in C_TYPES:
            raise TypeError(f"fused {self.name} kernels take float32 or float64 arrays; got {dt}")
        return f"typedef {C_TYPES[dt]} T;\n{self.source}"

    def get(self, cupy: Any, function: str, dtype: Any) -> Any:
        """The compiled kernel ``function`` for ``dtype``."""
        if function not in self.functions:
            raise KeyError(f"{self.name} has no kernel {function!r}; it has {', '.join(self.functions)}")
        dt = np.dtype(dtype)
        module = self._modules.get(dt)
        if module is None:
            module = cupy.RawModule(code=self.code(dt), options=("--std=c++14",))
            self._modules[dt] = module
        return module.get_function(function)


def grid_for(n: int, threads: int = THREADS) -> int:
    """Blocks for a grid-stride loop over ``n`` elements: enough to fill the card, never zero."""
    return max(1, min(MAX_BLOCKS, math.ceil(n / threads)))


def scalar(dtype: Any, value: float) -> Any:
    """``value`` as the kernel's ``T``: a Python float would be passed as double whatever T is."""
    return np.dtype(dtype).type(value)


def size(value: int) -> np.int64:
    """An element count or index for a ``long long`` kernel parameter."""
    return np.int64(value)


def check_contiguous(function: str, **arrays: Any) -> None:
    """Raise ValueError naming the argument unless every array is C-contiguous (the kernels index flat)."""
    for name, array in arrays.items():
        if not array.flags.c_contiguous:
            raise ValueError(f"fused kernel {function}: {name} must be C-contiguous; got strides {array.strides} "
                             f"for shape {array.shape}. Pass a contiguous buffer (the op's own output) or use the generic path")
