"""Linear forward with its bias: ``out = x Wᵀ + b``, the bias added by the GEMM before its store (one launch
where the generic code makes two; a pass over the output fewer)."""

from __future__ import annotations

from typing import Any

from neuroflow_opencl.array import ClArray
from neuroflow_opencl.gemm import matmul


def linear(device: Any, x: ClArray, weight: ClArray, bias: ClArray, out: ClArray) -> ClArray:
    """``x`` (n, in), ``weight`` (out, in), ``bias`` (out,) into ``out`` (n, out); returns ``out``."""
    return matmul(x, weight.T, out=out, bias=bias)
