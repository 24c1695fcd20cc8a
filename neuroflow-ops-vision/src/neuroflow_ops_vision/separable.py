"""Depthwise and depthwise-separable convolutions: DepthwiseConv2d and SeparableConv2d, built on Conv2d.

A depthwise convolution convolves each input channel with its own filters
(a loop over taps, ``conv_depthwise``); a separable one follows it with a 1×1
pointwise convolution, for about k² times fewer multiply-adds than a dense
k×k Conv2d.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow.composites import read_on_pool
from neuroflow.layout_pass import LayoutOptions
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow_ops_vision import conv_depthwise
from neuroflow_ops_vision.conv import Conv2d, add_bias, check_positive
from neuroflow_ops_vision.layout import (
    SAME_LAYOUT,
    ChannelsLastOperator,
    LayoutSwitch,
    check_declared_shape,
    check_feature_map,
    check_layout,
    from_nhwc_shape,
    layout_options,
    nhwc_shape,
)
from neuroflow_ops_vision.workspace import Workspace


class DepthwiseConv2d(Conv2d):
    """Depthwise convolution: each input channel convolved with its own ``depth_multiplier`` filters.

    The same parameters as PyTorch's ``Conv2d(C, C·m, k, groups=C)``:
    ``weight`` (C·m, 1, kh, kw), ``bias`` (C·m).
    """

    def __init__(
        self,
        channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
        depth_multiplier: int = 1,
        layout: str = "NCHW",
        dtype: Any = np.float32,
    ) -> None:
        check_positive("DepthwiseConv2d", channels=channels, depth_multiplier=depth_multiplier)
        super().__init__(channels, channels * depth_multiplier, kernel_size, stride, padding, dilation,
                         groups=channels, bias=bias, layout=layout, dtype=dtype)
        self._depthwise = True  # also with one channel
        self.depth_multiplier = int(depth_multiplier)

    def writes_output_again(self) -> bool:
        """An NHWC output can be written again from the input backward keeps: one depthwise pass buys the memory
        of a feature map. Not on numpy without the compiled loops, whose kh·kw passes over the map cost more than
        the memory is worth: there the detector's batch-16 step took 15 % longer (115 against 101 ms), where on
        the compiled loops it took 5–10 % longer (66 against 61 ms) for a predicted peak of 37.6 MiB against 45.5."""
        if self.output_layout != "NHWC":
            return False
        m = self.out_channels // self.in_channels
        return self.xp is not np or conv_depthwise.numba_kernels(np, m, self.weight.data.dtype) is not None

    def write_output_again(self) -> Any:
        x = self.saved_input
        if x is None:
            raise RuntimeError(f"{self!r}.write_output_again called before forward")
        n, h, w, _ = x.shape
        y = self.buffer("recomputed.output", (n, *self.geometry.out_hw((h, w)), self.out_channels), x.dtype)
        with Workspace(self, "recompute") as ws:
            conv_depthwise.forward(ws, x, self._w4(ws), y, self.geometry)
            add_bias(ws, y, self.bias.data if self.has_bias else None, None)
        return y

    def get_config(self) -> dict[str, Any]:
        return {
            "channels": self.in_channels, "kernel_size": list(self.kernel_size), "stride": list(self.stride),
            "padding": list(self.padding), "dilation": list(self.dilation), "bias": self.has_bias,
            "depth_multiplier": self.depth_multiplier, "layout": self.layout,
        }

    def __repr__(self) -> str:
        mult = f"→{self.out_channels}" if self.depth_multiplier != 1 else ""
        return f"DepthwiseConv2d({self.in_channels}{mult}, {self.options_text()})"


class SeparableConv2d(ChannelsLastOperator):
    """Depthwise-separable convolution: a k×k depthwise conv, then a 1×1 pointwise conv.

    Children ``depthwise`` (no bias) and ``pointwise`` (with ``bias``) run in
    NHWC; about k² times fewer multiply-adds than a dense k×k Conv2d.
    """

    folds_affine = True  # forward_affine, in the pointwise convolution (neuroflow.folding)
    #: Whether a training step lets go of the depthwise output between forward and backward, writing it again
    #: (:meth:`DepthwiseConv2d.write_output_again`) just before the pointwise convolution's backward, as
    #: :attr:`Sequential.recompute_outputs <neuroflow.Sequential.recompute_outputs>` does for its layers; False
    #: keeps it (set it on the instance).
    recompute_outputs: bool = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        bias: bool = True,
        depth_multiplier: int = 1,
        layout: str = "NCHW",
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        self.layout = check_layout(layout, "SeparableConv2d")
        self.depthwise = DepthwiseConv2d(in_channels, kernel_size, stride, padding, dilation, bias=False,
                                         depth_multiplier=depth_multiplier, layout="NHWC", dtype=dtype)
        self.pointwise = Conv2d(in_channels * depth_multiplier, out_channels, 1, bias=bias, layout="NHWC", dtype=dtype)
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self._refilling = False  # whether backward writes the depthwise output again (set by forward)

    @property
    def needs_input_grad(self) -> bool:
        return self.depthwise.needs_input_grad

    @needs_input_grad.setter
    def needs_input_grad(self, value: bool) -> None:
        self.depthwise.needs_input_grad = bool(value)

    def forward(self, x: Any) -> Any:
        return self._forward(x, None)

    def forward_affine(self, x: Any, scale: Any, shift: Any, activation: str | None) -> Any:
        """``activation(forward(x) · scale + shift)`` per output channel, folded into the pointwise convolution
        (see :meth:`Conv2d.forward_affine`); inference only."""
        return self._forward(x, (scale, shift, activation))

    def _forward(self, x: Any, affine: tuple[Any, Any, str | None] | None) -> Any:
        check_feature_map(self, x, self.in_channels, self.layout)
        depthwise = self.depthwise.forward(self._to_nhwc(x, self.layout, "x_nhwc"))
        y = self.pointwise.forward(depthwise) if affine is None else self.pointwise.forward_affine(depthwise, *affine)
        pool = self.buffer_pool
        # As a chain of two: on a step's planned buffers the depthwise output dies here when backward can write it
        # again for the pointwise convolution, else with the pointwise's backward.
        let_go = affine is None and self.training and self.recompute_outputs
        self._refilling = pool is not None and read_on_pool(pool, self.depthwise, self.pointwise, depthwise, y,
                                                            let_go) is not None
        return self._from_nhwc(y, self.layout, "y")

    def input_keeper(self) -> Operator | None:
        """The depthwise convolution, which keeps the input as given when it is NHWC already."""
        return self.depthwise.input_keeper()

    def backward(self, grad_out: Any) -> Any:
        pool: Any = self.buffer_pool
        tracing = pool is not None and pool.tracing
        with Workspace(self, "backward") as ws:
            g = self._to_nhwc(grad_out, self.layout, "g_nhwc", ws)
            if self._refilling:  # to the keeper read_on_pool found: the pointwise convolution itself
                self.pointwise.input_keeper().save_input(self.depthwise.write_output_again())
            g_depthwise = self.pointwise.backward(g)
            if tracing:  # each child's end, as a chain reports it: its buffers and the gradient it read die now
                pool.handoff(g, g_depthwise, self.pointwise)
            gx = self.depthwise.backward(g_depthwise)
            if tracing:
                pool.handoff(g_depthwise, gx, self.depthwise)
            return None if gx is None else self._from_nhwc(gx, self.layout, "gx")

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shape = tuple(input_shape)
        check_declared_shape(self, shape, self.in_channels, self.layout)
        nhwc = nhwc_shape(shape, self.layout)
        out = self.pointwise.output_shape(self.depthwise.output_shape(nhwc))
        return MemoryDeclaration(from_nhwc_shape(out, self.layout))

    def layout_options(self) -> LayoutOptions:
        return layout_options((self.layout, self.layout), SAME_LAYOUT, permutes=True)

    def with_layout(self, input_layout: str, output_layout: str) -> LayoutSwitch:
        return LayoutSwitch(self, layout=input_layout)

    def get_config(self) -> dict[str, Any]:
        d = self.depthwise
        return {
            "in_channels": self.in_channels, "out_channels": self.out_channels, "kernel_size": list(d.kernel_size),
            "stride": list(d.stride), "padding": list(d.padding), "dilation": list(d.dilation),
            "bias": self.pointwise.has_bias, "depth_multiplier": d.depth_multiplier, "layout": self.layout,
        }

    def __repr__(self) -> str:
        bias = self.pointwise.has_bias
        options = self.depthwise.options_text().replace(", bias=False", "").replace(", NHWC", "")
        return (f"SeparableConv2d({self.in_channels}→{self.out_channels}, {options}"
                f"{'' if bias else ', bias=False'}{', NHWC' if self.layout == 'NHWC' else ''})")
