"""Which array namespace (numpy, cupy, NeuroFlow's OpenCL one) an array belongs to."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np


def array_namespace(array: Any) -> Any:
    """The namespace of ``array``: its ``__array_namespace__``, CuPy for CuPy arrays, numpy otherwise."""
    if isinstance(array, np.ndarray):
        return np
    namespace = getattr(array, "__array_namespace__", None)
    if namespace is not None:
        return namespace()
    cupy = sys.modules.get("cupy")  # CuPy 13/14 arrays have no __array_namespace__
    if cupy is not None and isinstance(array, cupy.ndarray):
        return cupy
    return np
