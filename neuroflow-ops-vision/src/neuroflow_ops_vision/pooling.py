"""Pooling: MaxPool2d, AvgPool2d and GlobalAvgPool2d, in NCHW or NHWC.

Max and average pooling loop over the kernel's taps, each a strided slice of
the map. Max pooling records the winning tap per output in one byte (the
first maximum wins ties, as in PyTorch) so backward needs neither the input
nor the output; gradients go back by a strided assignment when windows tile
the map exactly, by clipped strided adds otherwise. On NHWC numpy maps, once
numba is loaded (by another op or the user: max pools never load it, see
:data:`neuroflow_ops_vision.compiled.RIDERS`), max pooling runs compiled loops
instead (:mod:`neuroflow_ops_vision.pooling_numba`): one pass each way, same results.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from neuroflow.backends.cpu_parallel import over_batch
from neuroflow.backends.reductions import sum_last, sum_rows
from neuroflow.layout_pass import LayoutOptions
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow_ops_vision import compiled
from neuroflow_ops_vision.layout import (
    LAYOUTS,
    SAME_LAYOUT,
    LayoutSwitch,
    check_declared_shape,
    check_feature_map,
    check_grad,
    check_layout,
    layout_options,
)
from neuroflow_ops_vision.windows import Geometry, check_fits, pad_into, pair, pair_text, spatial_index, spatial_shape
from neuroflow_ops_vision.workspace import Workspace

_KERNELS = "pooling_numba"


def _with_spatial(shape: tuple[int, ...], hw: tuple[int, int], layout: str) -> tuple[int, ...]:
    n = shape[0]
    if layout == "NCHW":
        return (n, shape[1], hw[0], hw[1])
    return (n, hw[0], hw[1], shape[3])


class _WindowPool(Operator):
    """Shared plumbing of the windowed pools: geometry, checks, padding, and the backward scatter."""

    backward_reads_input = False  # backward scatters from the input's shape (and max-pool's argmax) alone
    backward_reads_output = False

    def __init__(self, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool, layout: str) -> None:
        super().__init__()
        name = type(self).__name__
        kernel = pair(kernel_size, "kernel_size", name)
        self.geometry = Geometry(kernel, pair(stride if stride is not None else kernel, "stride", name),
                                 pair(padding, "padding", name, minimum=0), pair(dilation, "dilation", name),
                                 bool(ceil_mode))
        if any(2 * p > k for p, k in zip(self.geometry.padding, kernel)):
            raise ValueError(f"{name}: padding {self.geometry.padding} must be at most half the kernel {kernel}")
        self.kernel_size, self.stride = self.geometry.kernel, self.geometry.stride
        self.padding, self.dilation, self.ceil_mode = self.geometry.padding, self.geometry.dilation, bool(ceil_mode)
        self.layout = check_layout(layout, name)
        self._in_shape: tuple[int, ...] = ()

    def _out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        hw = spatial_shape(shape, self.layout)
        out_hw = self.geometry.out_hw(hw)
        check_fits(self, shape, hw, out_hw, self.kernel_size, self.padding, self.dilation)
        return _with_spatial(shape, out_hw, self.layout)

    def _source(self, x: Any, out_hw: tuple[int, int], fill: float, ws: Workspace) -> Any:
        """``x``, or a padded copy in a workspace when windows read outside it."""
        h, w = spatial_shape(x.shape, self.layout)
        ph, pw = self.padding
        need = self.geometry.padded_hw(out_hw)
        rows, cols = max(h + 2 * ph, need[0]), max(w + 2 * pw, need[1])
        if (rows, cols) == (h, w):
            return x
        buf = ws("pool.xpad", _with_spatial(x.shape, (rows, cols), self.layout), x.dtype)
        return pad_into(x, (ph, pw), buf, fill, self.layout)

    def _tap(self, a: Any, i: int, j: int, out_hw: tuple[int, int]) -> Any:
        return a[spatial_index(self.layout, self.geometry.rows(i, out_hw[0]), self.geometry.cols(j, out_hw[1]))]

    def _tiles_exactly(self, hw: tuple[int, int], out_hw: tuple[int, int]) -> bool:
        """Whether every input position lies in exactly one window (gradients can be assigned, not added)."""
        g = self.geometry
        return (g.padding == (0, 0) and g.dilation == (1, 1) and g.stride == g.kernel
                and out_hw[0] * g.kernel[0] == hw[0] and out_hw[1] * g.kernel[1] == hw[1])

    def _scatter(self, tap_grad: Any, shape: tuple[int, ...], out_hw: tuple[int, int], dtype: Any, ws: Workspace) -> Any:
        """gx of ``shape`` from per-tap gradients: ``tap_grad(t, out, lo, hi)`` writes tap t's gradient for samples
        lo:hi into ``out``. On numpy the batch is split between the cores (each sample's sums in tap order)."""
        hw = spatial_shape(shape, self.layout)
        gx = self.buffer("gx", shape, dtype)
        exact = self._tiles_exactly(hw, out_hw)
        part = ws("pool.part", _with_spatial(shape, out_hw, self.layout), dtype)
        taps = list(enumerate(self.geometry.taps()))

        def run(lo: int, hi: int) -> None:
            gxs = gx[lo:hi]
            if not exact:
                gxs[...] = 0
            for t, (i, j) in taps:
                if exact:
                    tap_grad(t, self._tap(gxs, i, j, out_hw), lo, hi)
                    continue
                clip = self.geometry.clipped(i, j, hw, out_hw)
                if clip is None:
                    continue
                ro, co, ri, ci = clip
                tap_grad(t, part[lo:hi], lo, hi)
                gxs[spatial_index(self.layout, ri, ci)] += part[lo:hi][spatial_index(self.layout, ro, co)]

        over_batch(self.xp, shape[0], run, gx.size * 3)
        return gx

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shape = tuple(input_shape)
        check_declared_shape(self, shape, None, self.layout)
        out = self._out_shape(shape)
        return MemoryDeclaration(out, cached=[out], workspace=[shape, out, out])

    def layout_options(self) -> LayoutOptions:
        return layout_options((self.layout, self.layout), SAME_LAYOUT)

    def with_layout(self, input_layout: str, output_layout: str) -> LayoutSwitch:
        return LayoutSwitch(self, layout=input_layout)

    def get_config(self) -> dict[str, Any]:
        return {"kernel_size": list(self.kernel_size), "stride": list(self.stride), "padding": list(self.padding),
                "ceil_mode": self.ceil_mode, "layout": self.layout}

    def __repr__(self) -> str:
        parts = [f"k={pair_text(self.kernel_size)}"]
        if self.stride != self.kernel_size:
            parts.append(f"s={pair_text(self.stride)}")
        if self.padding != (0, 0):
            parts.append(f"p={pair_text(self.padding)}")
        if self.dilation != (1, 1):
            parts.append(f"d={pair_text(self.dilation)}")
        if self.ceil_mode:
            parts.append("ceil_mode=True")
        if self.layout == "NHWC":
            parts.append("NHWC")
        return f"{type(self).__name__}({', '.join(parts)})"


class MaxPool2d(_WindowPool):
    """Maximum over each window; ``stride`` defaults to the kernel size, padding reads as −∞.

    The gradient goes to one tap per window: taps in row-major order, a later one taking over only where it is
    strictly larger than the maximum so far, so the first of equal values wins (as in PyTorch). A NaN makes the
    window's output NaN, and as nothing is larger than it, the gradient stays on the maximum before it (PyTorch
    sends it to the NaN).

    ``activation="relu"`` gives relu(maxpool(x)), which equals maxpool(relu(x))
    (the maximum commutes with a monotone function) at a quarter of a separate
    ReLU's passes for 2×2 windows: write ``Conv2d → MaxPool2d(2, activation="relu")``
    for ``Conv2d → ReLU → MaxPool2d`` (a Sequential under the Trainer runs that pair so by itself:
    see :mod:`neuroflow.fusion`).
    """

    absorbs_activation_after = ("relu",)
    absorbs_activation_before = ("relu",)  # relu∘max = max∘relu

    def __init__(self, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
                 padding: int | tuple[int, int] = 0, dilation: int | tuple[int, int] = 1,
                 ceil_mode: bool = False, layout: str = "NCHW", activation: str | None = None) -> None:
        super().__init__(kernel_size, stride, padding, dilation, ceil_mode, layout)
        if activation not in (None, "relu"):
            raise ValueError(f"MaxPool2d: activation must be None or 'relu'; got {activation!r}")
        self.activation = activation
        self.backward_reads_output = activation == "relu"  # the fused ReLU's mask is the output
        taps = self.kernel_size[0] * self.kernel_size[1]
        self._index_dtype = np.uint8 if taps <= 255 else np.int32
        self._argmax: Any = None
        self._out: Any = None

    def forward(self, x: Any) -> Any:
        check_feature_map(self, x, None, self.layout)
        out_shape = self._out_shape(tuple(x.shape))
        with Workspace(self, "forward") as ws:
            src = self._source(x, spatial_shape(out_shape, self.layout), -np.inf, ws)
            y = self.buffer("y", out_shape, x.dtype)
            argmax = self.buffer("argmax", out_shape, self._index_dtype)
            kernels = self._compiled(src, y, argmax)
            if kernels is not None:
                kernels.max_forward(src, self.geometry, self.activation == "relu", y, argmax)
            else:
                self._max_on_numpy(src, y, argmax, ws)
            self._in_shape, self._argmax, self._out = tuple(x.shape), argmax, y
            return y

    def _max_on_numpy(self, src: Any, y: Any, argmax: Any, ws: Workspace) -> None:
        """``y`` and ``argmax`` from the (padded) map ``src``, tap by tap over slices of it, the batch split between
        the cores."""
        xp, out_hw = self.xp, spatial_shape(y.shape, self.layout)
        better = ws("pool.better", y.shape, bool)
        label = ws("pool.label", y.shape, self._index_dtype)
        taps, index, relu = list(enumerate(self.geometry.taps())), self._index_dtype, self.activation == "relu"

        def run(lo: int, hi: int) -> None:
            ys, am, bt, lb = y[lo:hi], argmax[lo:hi], better[lo:hi], label[lo:hi]
            for t, (i, j) in taps:
                window = self._tap(src[lo:hi], i, j, out_hw)
                if t == 0:
                    xp.copyto(ys, window)
                    am[...] = 0
                    continue
                # argmax = max(argmax, t·[window > y]): a strictly larger value moves the index to the later tap
                xp.greater(window, ys, out=bt)
                xp.maximum(ys, window, out=ys)
                xp.multiply(bt, index(t), out=lb)
                xp.maximum(am, lb, out=am)
            if relu:
                xp.maximum(ys, 0, out=ys)

        over_batch(xp, y.shape[0], run, y.size * 5 * len(taps))

    def _compiled(self, *maps: Any) -> ModuleType | None:
        """numba's kernels where they run ``maps``: NHWC numpy maps of one float dtype, C-contiguous; else None."""
        if self.layout != "NHWC" or not all(m.flags.c_contiguous for m in maps if isinstance(m, np.ndarray)):
            return None
        return compiled.kernels(_KERNELS, self.xp, maps[0].dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "dilation": list(self.dilation), "activation": self.activation}

    def __repr__(self) -> str:
        text = super().__repr__()
        return text[:-1] + ", activation='relu')" if self.activation else text

    def backward(self, grad_out: Any) -> Any:
        if self._argmax is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        check_grad(self, grad_out, self._argmax.shape)
        xp = self.xp
        kernels = self._compiled(grad_out, self._argmax, self._out)
        if kernels is not None:
            hw = spatial_shape(self._in_shape, self.layout)
            gx = self.buffer("gx", self._in_shape, grad_out.dtype)
            kernels.max_backward(grad_out, self._argmax, self._out if self.activation == "relu" else None,
                                 self.geometry, self._tiles_exactly(hw, spatial_shape(grad_out.shape, self.layout)), gx)
            return gx
        with Workspace(self, "backward") as ws:
            hit = ws("pool.hit", grad_out.shape, bool)
            argmax = self._argmax
            if self.activation == "relu":  # the gradient passes where the output is positive
                xp.greater(self._out, 0, out=hit)
                grad_out = xp.multiply(grad_out, hit, out=ws("pool.masked", grad_out.shape, grad_out.dtype))

            def tap_grad(t: int, out: Any, lo: int, hi: int) -> None:
                xp.equal(argmax[lo:hi], t, out=hit[lo:hi])
                xp.multiply(grad_out[lo:hi], hit[lo:hi], out=out)

            return self._scatter(tap_grad, self._in_shape, spatial_shape(argmax.shape, self.layout), grad_out.dtype,
                                 ws)


class AvgPool2d(_WindowPool):
    """Mean over each window; padding counts as zeros unless ``count_include_pad=False``."""

    def __init__(self, kernel_size: int | tuple[int, int], stride: int | tuple[int, int] | None = None,
                 padding: int | tuple[int, int] = 0, ceil_mode: bool = False, count_include_pad: bool = True,
                 layout: str = "NCHW") -> None:
        super().__init__(kernel_size, stride, padding, 1, ceil_mode, layout)
        self.count_include_pad = bool(count_include_pad)
        self._scale: Any = None
        self._out_seen: tuple[int, ...] = ()

    def _divisors(self, hw: tuple[int, int], out_hw: tuple[int, int]) -> Any:
        """1 / window size per output position (a scalar when all windows are full), as PyTorch counts it."""
        factors = []
        for size, count, k, s, p in zip(hw, out_hw, self.kernel_size, self.stride, self.padding):
            start = np.arange(count) * s - p
            end = np.minimum(start + k, size + p)
            inside = np.minimum(end, size) - np.maximum(start, 0)
            factors.append(end - start if self.count_include_pad else inside)
        area = np.outer(factors[0], factors[1]).astype(np.float64)
        if np.all(area == area.flat[0]):
            return 1.0 / float(area.flat[0])
        inv = 1.0 / area
        return self.xp.asarray(inv if self.layout == "NCHW" else inv[:, :, None])

    def forward(self, x: Any) -> Any:
        check_feature_map(self, x, None, self.layout)
        xp = self.xp
        out_shape = self._out_shape(tuple(x.shape))
        hw, out_hw = spatial_shape(x.shape, self.layout), spatial_shape(out_shape, self.layout)
        with Workspace(self, "forward") as ws:
            src = self._source(x, out_hw, 0.0, ws)
            y = self.buffer("y", out_shape, x.dtype)
            for t, (i, j) in enumerate(self.geometry.taps()):
                window = self._tap(src, i, j, out_hw)
                if t == 0:
                    xp.copyto(y, window)
                else:
                    y += window
            scale = self._divisors(hw, out_hw)
            y *= scale if isinstance(scale, float) else scale.astype(x.dtype)
            self._in_shape, self._out_seen, self._scale = tuple(x.shape), out_shape, scale
            return y

    def backward(self, grad_out: Any) -> Any:
        if self._scale is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        check_grad(self, grad_out, self._out_seen)
        xp = self.xp
        with Workspace(self, "backward") as ws:
            scaled = ws("pool.scaled", grad_out.shape, grad_out.dtype)
            xp.multiply(grad_out, self._scale if isinstance(self._scale, float) else self._scale.astype(grad_out.dtype),
                        out=scaled)

            def tap_grad(t: int, out: Any, lo: int, hi: int) -> None:
                xp.copyto(out, scaled[lo:hi])

            return self._scatter(tap_grad, self._in_shape, spatial_shape(grad_out.shape, self.layout), grad_out.dtype,
                                 ws)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["count_include_pad"] = self.count_include_pad
        return config


class GlobalAvgPool2d(Operator):
    """Mean over H and W: (N, C, H, W) → (N, C), or (N, C, 1, 1) with ``keepdims=True``.

    Used before the classifier of ResNet and NeuroFlow-CNN (PyTorch's
    ``AdaptiveAvgPool2d(1)`` followed by ``Flatten``).
    """

    backward_reads_input = False
    backward_reads_output = False

    def __init__(self, keepdims: bool = False, layout: str = "NCHW") -> None:
        super().__init__()
        self.keepdims = bool(keepdims)
        self.layout = check_layout(layout, "GlobalAvgPool2d")
        self._in_shape: tuple[int, ...] | None = None

    def _out_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        c = shape[1] if self.layout == "NCHW" else shape[3]
        if not self.keepdims:
            return (shape[0], c)
        return _with_spatial(shape, (1, 1), self.layout)

    def forward(self, x: Any) -> Any:
        check_feature_map(self, x, None, self.layout)
        n = x.shape[0]
        c = x.shape[1] if self.layout == "NCHW" else x.shape[3]
        y = self.buffer("y", self._out_shape(tuple(x.shape)), x.dtype)
        y2 = y.reshape(n, c)
        # blocked sums (neuroflow.backends.reductions): an NHWC mean runs across rows, which numpy adds in sequence
        if self.layout == "NCHW":
            sum_last(self.xp, x.reshape(n, c, -1), out=y2)
        else:
            sum_rows(self.xp, x.reshape(n, -1, c), out=y2)
        h, w = spatial_shape(x.shape, self.layout)
        y2 *= 1.0 / (h * w)
        self._in_shape = tuple(x.shape)
        return y

    def backward(self, grad_out: Any) -> Any:
        shape = self._in_shape
        if shape is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        check_grad(self, grad_out, self._out_shape(shape))
        n = shape[0]
        c = shape[1] if self.layout == "NCHW" else shape[3]
        h, w = spatial_shape(shape, self.layout)
        gx = self.buffer("gx", shape, grad_out.dtype)
        g = grad_out.reshape(n, c) * (1.0 / (h * w))
        self.xp.copyto(gx, g[:, :, None, None] if self.layout == "NCHW" else g[:, None, None, :])
        return gx

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shape = tuple(input_shape)
        check_declared_shape(self, shape, None, self.layout)
        return MemoryDeclaration(self._out_shape(shape))

    def layout_options(self) -> LayoutOptions:
        """Either layout in; the (N, C) output is no map (the pass ends a chain here without a conversion)."""
        if self.keepdims:
            return layout_options((self.layout, self.layout), SAME_LAYOUT)
        return layout_options((self.layout, None), tuple((layout, None) for layout in LAYOUTS))

    def with_layout(self, input_layout: str, output_layout: str | None) -> LayoutSwitch:
        return LayoutSwitch(self, layout=input_layout)

    def get_config(self) -> dict[str, Any]:
        return {"keepdims": self.keepdims, "layout": self.layout}

    def __repr__(self) -> str:
        parts = (["keepdims=True"] if self.keepdims else []) + (["NHWC"] if self.layout == "NHWC" else [])
        return f"GlobalAvgPool2d({', '.join(parts)})"
