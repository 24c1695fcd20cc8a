"""Conv2d: 2-d convolution with stride, padding, dilation and groups, and its backward.

Every convolution computes in NHWC: grouped and dense ones as im2col + GEMM
(``conv_gemm``), depthwise ones as a loop over taps (``conv_depthwise``).
With ``layout="NCHW"`` (the default, as in PyTorch) an op permutes its input
and output; under a Trainer, :mod:`neuroflow.layout_pass` runs a chain of
them in NHWC instead, the first reading NCHW and the last writing it.
DepthwiseConv2d and SeparableConv2d are in :mod:`neuroflow_ops_vision.separable`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from neuroflow import random
from neuroflow.backends.reductions import sum_rows
from neuroflow.layout_pass import LayoutOptions
from neuroflow.operator import MemoryDeclaration
from neuroflow.tensor import Tensor
from neuroflow_ops_vision import conv_depthwise, conv_gemm
from neuroflow_ops_vision.layout import (
    ANY_LAYOUTS,
    ChannelsLastOperator,
    LayoutSwitch,
    check_declared_shape,
    check_feature_map,
    check_grad,
    check_layout,
    from_nhwc_shape,
    layout_options,
    nhwc_shape,
)
from neuroflow_ops_vision.windows import Geometry, check_fits, pair, pair_text
from neuroflow_ops_vision.workspace import Workspace

#: Default bound on one convolution's transient im2col memory (columns, padded input, one tap).
DEFAULT_MAX_WORKSPACE_BYTES = 8 * 2**20


def check_positive(owner: str, **sizes: int) -> None:
    """Raise ValueError naming ``owner`` unless every size is a positive int."""
    for name, value in sizes.items():
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{owner}: {name} must be a positive int; got {value!r}")


def add_bias(ws: Workspace, y: Any, bias: Any, affine: tuple[Any, Any, str | None] | None) -> None:
    """y += bias; under an ``affine`` map (scale, shift, activation), y += shift + bias·scale, then the activation."""
    if affine is None:
        if bias is not None:
            y += bias
        return
    scale, shift, activation = affine
    if activation not in (None, "relu"):
        raise ValueError(f"forward_affine applies activation 'relu' or None; got {activation!r}")
    if bias is not None:
        folded = ws("conv.shift", shift.shape, y.dtype)
        ws.xp.multiply(bias, scale, out=folded)
        shift = ws.xp.add(folded, shift, out=folded)
    y += shift
    if activation == "relu":
        ws.xp.maximum(y, 0, out=y)


class Conv2d(ChannelsLastOperator):
    """2-d convolution: ``weight`` (out, in/groups, kh, kw) and ``bias`` (out), as in PyTorch.

    ``layout`` is the layout of the arrays the op is handed ("NCHW" or
    "NHWC") and ``output_layout`` (default: the same) that of its output;
    computation is always NHWC. Under a Trainer the layout pass chooses both
    for the NCHW model a user writes (the first convolution of a chain reads
    NCHW and writes NHWC, and so on); an NHWC layout given here is a hint it
    leaves as it is. ``max_workspace_bytes`` bounds the
    im2col columns and their companions (padded input and, for a strided
    sweep, one tap's product): the batch is processed in the fewest chunks
    that fit, of even size (at least one sample per chunk); None processes
    the whole batch at once. With ``keep_columns``
    (off by default) and the whole batch in one chunk, the columns stay from
    forward to backward for a weight gradient that would rebuild them (a
    first layer's, a strided sweep's) instead of being rebuilt there. That
    trades memory held across the step's peak for one im2col: on the small
    CNN of ``benchmarks/cnn.py`` (batch 64), 2–3 ms of a 41–47 ms step for an
    arena of 24.5 MiB instead of 17.9. ``needs_input_grad = False`` (the
    Trainer sets it on a model's first layer) skips the gradient of the
    input; backward then returns None.

    Example::

        conv = Conv2d(3, 32, 3, padding=1)
        y = conv.forward(x)        # x: (N, 3, H, W) -> y: (N, 32, H, W)
        gx = conv.backward(gy)     # fills conv.weight.grad and conv.bias.grad
    """

    backward_reads_output = False
    folds_affine = True  # forward_affine: an eval-mode BatchNorm2d after it runs inside (neuroflow.folding)

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = True,
        layout: str = "NCHW",
        max_workspace_bytes: int | None = DEFAULT_MAX_WORKSPACE_BYTES,
        dtype: Any = np.float32,
        output_layout: str | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        check_positive(name, in_channels=in_channels, out_channels=out_channels, groups=groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}")
        self.in_channels, self.out_channels, self.groups = int(in_channels), int(out_channels), int(groups)
        self.geometry = Geometry(
            pair(kernel_size, "kernel_size", name), pair(stride, "stride", name),
            pair(padding, "padding", name, minimum=0), pair(dilation, "dilation", name),
        )
        self.kernel_size, self.stride = self.geometry.kernel, self.geometry.stride
        self.padding, self.dilation = self.geometry.padding, self.geometry.dilation
        self.has_bias = bool(bias)
        self.layout = check_layout(layout, name)
        self.output_layout = self.layout if output_layout is None else check_layout(output_layout, name)
        if max_workspace_bytes is not None and max_workspace_bytes <= 0:
            raise ValueError(f"{name}: max_workspace_bytes must be positive or None; got {max_workspace_bytes}")
        self.max_workspace_bytes = max_workspace_bytes
        self.keep_columns = False
        self.needs_input_grad = True
        # Depthwise (one input channel per group): per-tap multiply-adds instead of degenerate GEMMs.
        self._depthwise = self.groups > 1 and self.groups == self.in_channels
        kh, kw = self.kernel_size
        fan_in = self.in_channels // self.groups * kh * kw
        bound = 1.0 / math.sqrt(fan_in)  # PyTorch's kaiming_uniform_(a=√5) and bias init
        rng = random.generator()
        shape = (self.out_channels, self.in_channels // self.groups, kh, kw)
        self.weight = Tensor(rng.uniform(-bound, bound, shape).astype(dtype), requires_grad=True)
        if self.has_bias:
            self.bias = Tensor(rng.uniform(-bound, bound, self.out_channels).astype(dtype), requires_grad=True)
        self._cols: Any = None

    # ------------------------------------------------------------------ computation
    def forward(self, x: Any) -> Any:
        return self._forward(x, None)

    def forward_affine(self, x: Any, scale: Any, shift: Any, activation: str | None) -> Any:
        """``activation(forward(x) · scale + shift)`` per output channel, the scale folded into the filters and the
        shift into the bias: an eval-mode BatchNorm2d after it, for inference (see :mod:`neuroflow.folding`)."""
        return self._forward(x, (scale, shift, activation))

    def _forward(self, x: Any, affine: tuple[Any, Any, str | None] | None) -> Any:
        check_feature_map(self, x, self.in_channels, self.layout)
        xh = self._to_nhwc(x, self.layout, "x_nhwc")
        n, h, w, _ = xh.shape
        out_hw = self.geometry.out_hw((h, w))
        check_fits(self, tuple(x.shape), (h, w), out_hw, self.kernel_size, self.padding, self.dilation)
        scale = None if affine is None else affine[0]
        with Workspace(self, "forward") as ws:
            y = self._nhwc_result(self.output_layout, "y", (n, out_hw[0], out_hw[1], self.out_channels), x.dtype, ws)
            if self._depthwise:
                conv_depthwise.forward(ws, xh, self._w4(ws, scale), y, self.geometry)
            else:
                chunk = self.chunk_size(xh.shape)
                keep = None
                if self._keeps_columns(chunk, n):
                    shape = conv_gemm.column_shape(n, out_hw, self.geometry, self.groups, self.in_channels)
                    keep = self.buffer("col", shape, x.dtype)
                wmat = self._wmat(ws, scale)
                self._cols = conv_gemm.forward(ws, xh, wmat, y, self.geometry, self.groups, chunk, keep)
            add_bias(ws, y, self.bias.data if self.has_bias else None, affine)
            self.save_input(xh)  # NHWC: what backward reads
            return self._from_nhwc(y, self.output_layout, "y")

    def input_keeper(self) -> Conv2d:
        """This op: backward reads the input only as :attr:`saved_input` (the input itself where it is NHWC)."""
        return self

    def backward(self, grad_out: Any) -> Any:
        x = self.saved_input
        if x is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        xp = self.xp
        n, h, w, _ = x.shape
        out_nhwc = (n, *self.geometry.out_hw((h, w)), self.out_channels)
        check_grad(self, grad_out, from_nhwc_shape(out_nhwc, self.output_layout))
        with Workspace(self, "backward") as ws:
            g = self._to_nhwc(grad_out, self.output_layout, "g_nhwc", ws)
            gx = self._nhwc_result(self.layout, "gx", x.shape, x.dtype, ws) if self.needs_input_grad else None
            want_w = self.weight.requires_grad
            if self._depthwise:
                c, m = self.in_channels, self.out_channels // self.in_channels
                gw = ws("conv.gw", (c, m, *self.kernel_size), x.dtype) if want_w else None
                conv_depthwise.backward(ws, x, g, self._w4(), gw, gx, self.geometry)
                gw_param = None if gw is None else gw.reshape(self.weight.shape)
            else:
                gw_param = None
                # straight into weight.grad when it starts at zero (chunk 0 copies, the others add), else into a
                # workspace added to it, taken only when backward needs it
                zeroed = want_w and self.writes_whole_gradient(self.weight)

                def weight_gradient() -> Any:
                    nonlocal gw_param
                    if zeroed:
                        return self.weight.grad.transpose(0, 2, 3, 1)
                    gw_param = ws("conv.gw", self.weight.shape, x.dtype)
                    return gw_param.transpose(0, 2, 3, 1)

                conv_gemm.backward(ws, x, g, self._wmat, weight_gradient if want_w else None, gx, self.geometry,
                                   self.groups, self.chunk_size(x.shape), self._cols, self.grad_chunk_size(x.shape),
                                   lambda ws: conv_gemm.flip(ws, self.weight.data, self.groups))
            if gw_param is not None:
                self.accumulate_grad(self.weight, gw_param)
            if self.has_bias and self.bias.requires_grad:
                gb = sum_rows(xp, g.reshape(-1, self.out_channels), out=ws("conv.gb", (self.out_channels,), x.dtype))
                self.accumulate_grad(self.bias, gb)
            return None if gx is None else self._from_nhwc(gx, self.layout, "gx")

    def _keeps_columns(self, chunk: int, n: int) -> bool:
        """Whether forward's columns stay for backward: the whole batch in one chunk and more than one tap
        (a 1×1 sweep's columns are a subsample of the input, as cheap to take again as to hold), for a weight
        gradient that would build them again. A stride-1 sweep with an input gradient takes both gradients
        from the output gradient's columns instead (see ``conv_gemm.backward``)."""
        from_gradient = self.needs_input_grad and conv_gemm.takes_gradient_columns(self.geometry)
        return self.keep_columns and chunk >= n and self.kernel_size != (1, 1) and not from_gradient

    def _wmat_shape(self) -> tuple[int, int, int, int]:
        return (self.out_channels, *self.kernel_size, self.in_channels // self.groups)

    def _wmat(self, ws: Workspace, scale: Any = None) -> Any:
        """The weight as (O, kh, kw, C/G): the row order of the column matrix; each output's filter times
        ``scale`` (O,) when given, in the same copy."""
        wmat = ws("conv.wmat", self._wmat_shape(), self.weight.data.dtype)
        w = self.weight.data.transpose(0, 2, 3, 1)
        if scale is None:
            self.xp.copyto(wmat, w)
        else:
            self.xp.multiply(w, scale.reshape(-1, 1, 1, 1), out=wmat)
        return wmat

    def _w4(self, ws: Workspace | None = None, scale: Any = None) -> Any:
        """The depthwise weight as (C, m, kh, kw): a view, or a scaled copy in ``ws`` when ``scale`` (C·m,) is given."""
        c = self.in_channels
        w4 = self.weight.data.reshape(c, self.out_channels // c, *self.kernel_size)
        if scale is None or ws is None:
            return w4
        scaled = ws("conv.w4", w4.shape, w4.dtype)
        self.xp.multiply(w4, scale.reshape(c, -1, 1, 1), out=scaled)
        return scaled

    # ------------------------------------------------------------------ memory
    def workspace_bytes_per_sample(self, hw: tuple[int, int]) -> int:
        """Transient bytes one sample needs in a chunk: padded map, columns and, where the input gradient takes
        the per-tap method (a strided sweep), one tap's product."""
        if self._depthwise or self.geometry.pointwise:
            return 0
        ho, wo = self.geometry.out_hw(hw)
        ph, pw = self.padding
        padded = (hw[0] + 2 * ph) * (hw[1] + 2 * pw) * self.in_channels if (ph or pw) else 0
        cols = ho * wo * self.kernel_size[0] * self.kernel_size[1] * self.in_channels
        tap = ho * wo * self.in_channels if conv_gemm.transposed(self.geometry) is None else 0
        return (padded + cols + tap) * np.dtype(self.weight.data.dtype).itemsize

    def chunk_size(self, nhwc: tuple[int, ...]) -> int:
        """Samples per im2col chunk for an NHWC input shape under ``max_workspace_bytes``."""
        n = int(nhwc[0])
        return self._samples_within_workspace(n, self.workspace_bytes_per_sample((int(nhwc[1]), int(nhwc[2]))))

    def _samples_within_workspace(self, n: int, per_sample: int) -> int:
        """Samples per chunk when ``n`` are split into as few chunks as fit ``max_workspace_bytes`` at
        ``per_sample`` bytes each (at least one sample per chunk), sized evenly: 16 + 16 rather than 22 + 10,
        so no chunk is a small, less efficient GEMM."""
        if self.max_workspace_bytes is None or per_sample == 0:
            return max(n, 1)
        most = max(1, min(n, self.max_workspace_bytes // per_sample))
        chunks = -(-n // most)
        return -(-n // chunks)

    def grad_chunk_size(self, nhwc: tuple[int, ...]) -> int:
        """Samples per chunk of the input gradient's columns under ``max_workspace_bytes``, when it is taken as
        a transposed convolution (padded output gradient and its columns per sample)."""
        n, hw = int(nhwc[0]), (int(nhwc[1]), int(nhwc[2]))
        sweep = conv_gemm.transposed(self.geometry)
        if sweep is None or self._depthwise or self.geometry.pointwise:
            return max(n, 1)
        ho, wo = self.geometry.out_hw(hw)
        (qh, qw), (kh, kw) = sweep.padding, self.kernel_size
        padded = (ho + 2 * qh) * (wo + 2 * qw) * self.out_channels if (qh or qw) else 0
        cols = hw[0] * hw[1] * kh * kw * (self.out_channels // self.groups) * self.groups
        return self._samples_within_workspace(n, (padded + cols) * np.dtype(self.weight.data.dtype).itemsize)

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shape = tuple(input_shape)
        check_declared_shape(self, shape, self.in_channels, self.layout)
        n, h, w, c = nhwc_shape(shape, self.layout)
        out_hw = self.geometry.out_hw((h, w))
        check_fits(self, shape, (h, w), out_hw, self.kernel_size, self.padding, self.dilation)
        out_nhwc = (n, out_hw[0], out_hw[1], self.out_channels)
        cached: list[tuple[int, ...]] = [(n, h, w, c)]
        workspace: list[tuple[int, ...]] = [self.weight.shape, self.weight.shape]  # weight matrix, its gradient
        ph, pw = self.padding
        if self._depthwise:
            workspace += conv_depthwise.workspace_shapes(self.xp, (n, h, w, c), out_nhwc, self.geometry,
                                                         self.weight.data.dtype)
        elif not self.geometry.pointwise:
            chunk = self.chunk_size((n, h, w, c))
            if ph or pw:
                workspace.append((chunk, h + 2 * ph, w + 2 * pw, c))
            columns = conv_gemm.column_shape(chunk, out_hw, self.geometry, self.groups, c)
            (cached if self._keeps_columns(chunk, n) else workspace).append(columns)
            sweep = conv_gemm.transposed(self.geometry)
            if sweep is None:
                workspace.append((chunk * out_hw[0] * out_hw[1], c))  # one tap's product
            else:  # the output gradient's columns, padded map and flipped kernel
                grad_chunk = self.grad_chunk_size((n, h, w, c))
                o, (qh, qw) = self.out_channels, sweep.padding
                workspace.append(conv_gemm.column_shape(grad_chunk, (h, w), sweep, self.groups, o))
                if qh or qw:
                    workspace.append((grad_chunk, out_hw[0] + 2 * qh, out_hw[1] + 2 * qw, o))
        if self.output_layout == "NCHW":
            workspace += [out_nhwc, out_nhwc]  # permuted output and gradient
        if self.layout == "NCHW":
            workspace.append((n, h, w, c))  # permuted input gradient
        return MemoryDeclaration(from_nhwc_shape(out_nhwc, self.output_layout), cached=cached, workspace=workspace)

    # ------------------------------------------------------------------ layouts (neuroflow.layout_pass)
    def layout_options(self) -> LayoutOptions:
        """Any layout in, any out: an NCHW side is permuted here, so the pass lets a chain's first convolution
        read NCHW and its last write NCHW instead of converting beside them."""
        return layout_options((self.layout, self.output_layout), ANY_LAYOUTS, permutes=True)

    def with_layout(self, input_layout: str, output_layout: str) -> LayoutSwitch:
        return LayoutSwitch(self, layout=input_layout, output_layout=output_layout)

    # ------------------------------------------------------------------ description
    def get_config(self) -> dict[str, Any]:
        return {
            "in_channels": self.in_channels, "out_channels": self.out_channels,
            "kernel_size": list(self.kernel_size), "stride": list(self.stride), "padding": list(self.padding),
            "dilation": list(self.dilation), "groups": self.groups, "bias": self.has_bias, "layout": self.layout,
            "max_workspace_bytes": self.max_workspace_bytes, "output_layout": self.output_layout,
        }

    def options_text(self) -> str:
        """The options that differ from the defaults, as the repr shows them: ``k=3, s=2, bias=False``."""
        parts = [f"k={pair_text(self.kernel_size)}"]
        for label, value, default in (("s", self.stride, (1, 1)), ("p", self.padding, (0, 0)), ("d", self.dilation, (1, 1))):
            if value != default:
                parts.append(f"{label}={pair_text(value)}")
        if self.groups != 1 and not self._depthwise:
            parts.append(f"groups={self.groups}")
        if not self.has_bias:
            parts.append("bias=False")
        if self.layout != "NCHW" or self.output_layout != self.layout:
            parts.append(self.layout if self.output_layout == self.layout else f"{self.layout}→{self.output_layout}")
        return ", ".join(parts)

    def __repr__(self) -> str:
        groups = ", depthwise" if self._depthwise else ""
        return f"Conv2d({self.in_channels}→{self.out_channels}, {self.options_text()}{groups})"
