"""Linear forward with its bias: ``out = x Wᵀ + b``, the bias added by the GEMM before its store (one launch
where the generic code makes two; a pass over the output fewer); and its weight and bias gradients in one
launch, the bias gradient summed from the values the weight gradient's product loads."""

from __future__ import annotations

from typing import Any

from neuroflow_opencl.array import ClArray
from neuroflow_opencl.gemm import matmul, matmul_and_row_sums


def linear(device: Any, x: ClArray, weight: ClArray, bias: ClArray, out: ClArray) -> ClArray:
    """``x`` (n, in), ``weight`` (out, in), ``bias`` (out,) into ``out`` (n, out); returns ``out``."""
    return matmul(x, weight.T, out=out, bias=bias)


def linear_weight_grad(device: Any, g: ClArray, x: ClArray, gw: ClArray, gb: ClArray) -> None:
    """``gw = gᵀ x`` and ``gb = g.sum(axis=0)`` for ``g`` (n, out) and ``x`` (n, in), into the caller's buffers."""
    matmul_and_row_sums(g.T, x, gw, gb)
