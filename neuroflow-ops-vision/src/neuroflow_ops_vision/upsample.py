"""Upsample: nearest or bilinear resizing of feature maps, with PyTorch's coordinate conventions.

Integer nearest upsampling is a broadcast copy (backward: a sum over the
repeated block). Everything else is separable: resizing along H and then W
are products with small (out × in) interpolation matrices, so forward and
backward are GEMMs and need no scatter.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from neuroflow.backends import blas_threads
from neuroflow.errors import ShapeError
from neuroflow.layout_pass import LayoutOptions
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow_ops_vision.layout import (
    SAME_LAYOUT,
    LayoutSwitch,
    check_declared_shape,
    check_feature_map,
    check_grad,
    check_layout,
    layout_options,
)
from neuroflow_ops_vision.windows import spatial_shape
from neuroflow_ops_vision.workspace import Workspace

MODES = ("nearest", "bilinear")


def interpolation_matrix(size_in: int, size_out: int, mode: str, align_corners: bool, scale: float | None) -> np.ndarray:
    """The (size_out, size_in) matrix that resizes one axis as ``torch.nn.functional.interpolate`` does.

    ``scale`` is the user's scale factor when one was given (PyTorch then maps
    coordinates with 1/scale rather than size_in/size_out).
    """
    ratio = 1.0 / scale if scale is not None else size_in / size_out
    out = np.arange(size_out, dtype=np.float64)
    matrix = np.zeros((size_out, size_in))
    if mode == "nearest":
        src = np.minimum(np.floor(out * ratio).astype(np.int64), size_in - 1)
        matrix[np.arange(size_out), src] = 1.0
        return matrix
    if align_corners:
        src = out * ((size_in - 1) / (size_out - 1)) if size_out > 1 else np.zeros(size_out)
    else:
        src = np.maximum((out + 0.5) * ratio - 0.5, 0.0)
    low = np.minimum(np.floor(src).astype(np.int64), size_in - 1)
    high = np.minimum(low + 1, size_in - 1)
    frac = src - low
    np.add.at(matrix, (np.arange(size_out), low), 1.0 - frac)
    np.add.at(matrix, (np.arange(size_out), high), frac)
    return matrix


class Upsample(Operator):
    """Resizes H and W by ``scale_factor`` or to ``size``; ``mode`` is "nearest" or "bilinear"."""

    backward_reads_input = False  # backward reads the shapes alone: the planner may give both maps away
    backward_reads_output = False

    def __init__(self, scale_factor: float | tuple[float, float] | None = None, size: int | tuple[int, int] | None = None,
                 mode: str = "nearest", align_corners: bool | None = None, layout: str = "NCHW") -> None:
        super().__init__()
        if (scale_factor is None) == (size is None):
            raise ValueError("Upsample: give exactly one of scale_factor and size")
        if mode not in MODES:
            raise ValueError(f"Upsample: unknown mode {mode!r}; expected one of {', '.join(MODES)}")
        if align_corners is not None and mode == "nearest":
            raise ValueError("Upsample: align_corners applies to mode='bilinear' only")
        self.scale_factor = None if scale_factor is None else self._two(scale_factor, float, "scale_factor")
        self.size = None if size is None else self._two(size, int, "size")
        self.mode, self.align_corners = mode, bool(align_corners)
        self.layout = check_layout(layout, "Upsample")
        self._in_shape: tuple[int, ...] = ()
        self._matrices: dict[tuple[int, ...], tuple[Any, Any]] = {}

    @staticmethod
    def _two(value: Any, kind: type, name: str) -> tuple[Any, Any]:
        items = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
        if len(items) != 2 or any(not isinstance(v, (int, float)) or v <= 0 for v in items):
            raise ValueError(f"Upsample: {name} must be a positive number or a pair; got {value!r}")
        return (kind(items[0]), kind(items[1]))

    def _out_hw(self, hw: tuple[int, int]) -> tuple[int, int]:
        if self.size is not None:
            return self.size
        sh, sw = self.scale_factor or (1.0, 1.0)
        return (math.floor(hw[0] * sh), math.floor(hw[1] * sw))

    def _integer_factor(self, hw: tuple[int, int], out_hw: tuple[int, int]) -> tuple[int, int] | None:
        """(sh, sw) when nearest upsampling repeats each pixel an integer number of times."""
        if self.mode != "nearest" or out_hw[0] % hw[0] or out_hw[1] % hw[1]:
            return None
        factor = (out_hw[0] // hw[0], out_hw[1] // hw[1])
        if self.scale_factor is not None and any(float(f) != s for f, s in zip(factor, self.scale_factor)):
            return None
        return factor

    def _out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        hw = spatial_shape(shape, self.layout)
        out_hw = self._out_hw(hw)
        if min(out_hw) <= 0:
            raise ShapeError(f"{self!r} got input of shape {shape}; the output would be {out_hw[0]}×{out_hw[1]}")
        n = shape[0]
        return (n, shape[1], *out_hw) if self.layout == "NCHW" else (n, *out_hw, shape[3])

    def _interp(self, hw: tuple[int, int], out_hw: tuple[int, int], dtype: Any) -> tuple[Any, Any]:
        key = (*hw, *out_hw, np.dtype(dtype).num)
        if key not in self._matrices:
            scales = self.scale_factor or (None, None)
            mats = tuple(self.xp.asarray(interpolation_matrix(i, o, self.mode, self.align_corners, s).astype(dtype))
                         for i, o, s in zip(hw, out_hw, scales))
            self._matrices[key] = (mats[0], mats[1])
        return self._matrices[key]

    def forward(self, x: Any) -> Any:
        check_feature_map(self, x, None, self.layout)
        xp = self.xp
        out_shape = self._out_shape(tuple(x.shape))
        hw, out_hw = spatial_shape(x.shape, self.layout), spatial_shape(out_shape, self.layout)
        self._in_shape = tuple(x.shape)
        y = self.buffer("y", out_shape, x.dtype)
        factor = self._integer_factor(hw, out_hw)
        if factor is not None:
            xp.copyto(self._blocks(y, hw, factor), self._expand(x))
            return y
        ah, aw = self._interp(hw, out_hw, x.dtype)
        n = x.shape[0]
        with Workspace(self, "forward") as ws:
            if self.layout == "NHWC":
                c = x.shape[3]
                t = ws("upsample.t", (n, out_hw[0], hw[1] * c), x.dtype)
                blas_threads.matmul(xp, ah, x.reshape(n, hw[0], -1), out=t)
                blas_threads.matmul(xp, aw, t.reshape(n * out_hw[0], hw[1], c), out=y.reshape(n * out_hw[0], out_hw[1], c))
            else:
                nc = n * x.shape[1]
                t = ws("upsample.t", (nc, out_hw[0], hw[1]), x.dtype)
                blas_threads.matmul(xp, ah, x.reshape(nc, hw[0], hw[1]), out=t)
                blas_threads.matmul(xp, t, aw.T, out=y.reshape(nc, out_hw[0], out_hw[1]))
        return y

    def backward(self, grad_out: Any) -> Any:
        if not self._in_shape:
            raise RuntimeError(f"{self!r}.backward called before forward")
        shape = self._in_shape
        check_grad(self, grad_out, self._out_shape(shape))
        xp = self.xp
        hw, out_hw = spatial_shape(shape, self.layout), spatial_shape(grad_out.shape, self.layout)
        gx = self.buffer("gx", shape, grad_out.dtype)
        factor = self._integer_factor(hw, out_hw)
        if factor is not None:
            axes = (3, 5) if self.layout == "NCHW" else (2, 4)
            xp.sum(self._blocks(grad_out, hw, factor), axis=axes, out=gx)
            return gx
        ah, aw = self._interp(hw, out_hw, grad_out.dtype)
        n = shape[0]
        with Workspace(self, "backward") as ws:
            if self.layout == "NHWC":
                c = shape[3]
                t = ws("upsample.gt", (n * out_hw[0], hw[1], c), grad_out.dtype)
                blas_threads.matmul(xp, aw.T, grad_out.reshape(n * out_hw[0], out_hw[1], c), out=t)
                blas_threads.matmul(xp, ah.T, t.reshape(n, out_hw[0], hw[1] * c), out=gx.reshape(n, hw[0], -1))
            else:
                nc = n * shape[1]
                t = ws("upsample.gt", (nc, out_hw[0], hw[1]), grad_out.dtype)
                blas_threads.matmul(xp, grad_out.reshape(nc, out_hw[0], out_hw[1]), aw, out=t)
                blas_threads.matmul(xp, ah.T, t, out=gx.reshape(nc, hw[0], hw[1]))
        return gx

    def _blocks(self, a: Any, hw: tuple[int, int], factor: tuple[int, int]) -> Any:
        """The upsampled map as (…, H, sh, W, sw, …) blocks of repeated pixels."""
        n = a.shape[0]
        if self.layout == "NCHW":
            return a.reshape(n, a.shape[1], hw[0], factor[0], hw[1], factor[1])
        return a.reshape(n, hw[0], factor[0], hw[1], factor[1], a.shape[3])

    def _expand(self, x: Any) -> Any:
        return x[:, :, :, None, :, None] if self.layout == "NCHW" else x[:, :, None, :, None, :]

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shape = tuple(input_shape)
        check_declared_shape(self, shape, None, self.layout)
        out = self._out_shape(shape)
        return MemoryDeclaration(out, cached=[], workspace=[out])

    def layout_options(self) -> LayoutOptions:  # see neuroflow.layout_pass
        return layout_options((self.layout, self.layout), SAME_LAYOUT)

    def with_layout(self, input_layout: str, output_layout: str) -> LayoutSwitch:
        return LayoutSwitch(self, layout=input_layout)

    def get_config(self) -> dict[str, Any]:
        return {"scale_factor": None if self.scale_factor is None else list(self.scale_factor),
                "size": None if self.size is None else list(self.size), "mode": self.mode,
                "align_corners": self.align_corners if self.mode == "bilinear" else None, "layout": self.layout}

    def __repr__(self) -> str:
        how = f"size={self.size}" if self.size is not None else f"scale_factor={self.scale_factor}"
        corners = ", align_corners=True" if self.align_corners else ""
        layout = ", NHWC" if self.layout == "NHWC" else ""
        return f"Upsample({how}, mode={self.mode!r}{corners}{layout})"
