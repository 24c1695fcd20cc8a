"""SqueezeExcite: channel attention that rescales each channel by a gate computed from the whole map.

y = x · σ(fc2(relu(fc1(mean_hw(x))))), with fc1/fc2 as 1×1 convolutions so the
parameters carry torchvision's ``SqueezeExcitation`` names and shapes:
``fc1.weight`` (C/r, C, 1, 1), ``fc1.bias``, ``fc2.weight`` (C, C/r, 1, 1), ``fc2.bias``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow.layout_pass import LayoutOptions
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow_ops_vision.conv import Conv2d
from neuroflow_ops_vision.layout import (
    SAME_LAYOUT,
    LayoutSwitch,
    check_declared_shape,
    check_feature_map,
    check_grad,
    check_layout,
    layout_options,
)
from neuroflow_ops_vision.workspace import Workspace


class SqueezeExcite(Operator):
    """Squeeze-and-excitation (Hu et al., 2018) over ``channels`` with a ``channels // reduction`` bottleneck.

    ``squeeze_channels`` sets the bottleneck width directly (as torchvision's
    ``SqueezeExcitation`` does); it overrides ``reduction``.
    """

    def __init__(self, channels: int, reduction: int = 4, squeeze_channels: int | None = None,
                 layout: str = "NCHW", dtype: Any = np.float32) -> None:
        super().__init__()
        if not isinstance(channels, int) or channels <= 0:
            raise ValueError(f"SqueezeExcite: channels must be a positive int; got {channels!r}")
        if squeeze_channels is None:
            if not isinstance(reduction, int) or reduction <= 0:
                raise ValueError(f"SqueezeExcite: reduction must be a positive int; got {reduction!r}")
            squeeze_channels = max(1, channels // reduction)
        self.channels, self.reduction, self.squeeze_channels = channels, reduction, int(squeeze_channels)
        self.layout = check_layout(layout, "SqueezeExcite")
        # The gate path runs on (N, 1, 1, C): 1×1 convolutions there are plain GEMMs.
        self.fc1 = Conv2d(channels, self.squeeze_channels, 1, layout="NHWC", dtype=dtype)
        self.fc2 = Conv2d(self.squeeze_channels, channels, 1, layout="NHWC", dtype=dtype)
        # Cached for backward as plain attributes (the memory tracer follows attributes, not tuples).
        self._x: Any = None
        self._gate: Any = None
        self._hidden: Any = None

    def _gate_view(self, a: Any) -> Any:
        """(N, C) → broadcastable against the map in this layout."""
        return a[:, :, None, None] if self.layout == "NCHW" else a[:, None, None, :]

    def forward(self, x: Any) -> Any:
        check_feature_map(self, x, self.channels, self.layout)
        xp = self.xp
        n, c = x.shape[0], self.channels
        squeezed = self.buffer("squeezed", (n, 1, 1, c), x.dtype)
        axes = (2, 3) if self.layout == "NCHW" else (1, 2)
        xp.mean(x, axis=axes, out=squeezed.reshape(n, c))
        z = self.fc1.forward(squeezed)
        hidden = self.buffer("hidden", z.shape, x.dtype)
        xp.maximum(z, 0, out=hidden)
        gate = self.buffer("gate", (n, c), x.dtype)
        # σ(t) = ½(1 + tanh(t/2)): no overflow for large |t|
        xp.multiply(self.fc2.forward(hidden).reshape(n, c), 0.5, out=gate)
        xp.tanh(gate, out=gate)
        gate += 1.0
        gate *= 0.5
        y = self.buffer("y", x.shape, x.dtype)
        xp.multiply(x, self._gate_view(gate), out=y)
        self._x, self._gate, self._hidden = x, gate, hidden
        return y

    def backward(self, grad_out: Any) -> Any:
        if self._x is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        x, gate, hidden = self._x, self._gate, self._hidden
        check_grad(self, grad_out, x.shape)
        xp = self.xp
        n, c = gate.shape
        spec = "nchw,nchw->nc" if self.layout == "NCHW" else "nhwc,nhwc->nc"
        with Workspace(self, "backward") as ws:
            ggate = ws("se.ggate", (n, 1, 1, c), x.dtype)
            g2 = ggate.reshape(n, c)
            g2[...] = xp.einsum(spec, grad_out, x)
            g2 *= gate
            g2 *= 1.0 - gate
            ghidden = self.fc2.backward(ggate)
        ghidden = ghidden * (hidden > 0)
        gsqueezed = self.fc1.backward(ghidden).reshape(n, c)
        area = x.shape[2] * x.shape[3] if self.layout == "NCHW" else x.shape[1] * x.shape[2]
        gx = self.buffer("gx", x.shape, x.dtype)
        xp.multiply(grad_out, self._gate_view(gate), out=gx)
        gx += self._gate_view(gsqueezed * (1.0 / area))
        return gx

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shape = tuple(input_shape)
        check_declared_shape(self, shape, self.channels, self.layout)
        n = shape[0]
        return MemoryDeclaration(shape, cached=[shape, (n, self.channels), (n, self.squeeze_channels)])

    def layout_options(self) -> LayoutOptions:  # see neuroflow.layout_pass; the gate path is NHWC either way
        return layout_options((self.layout, self.layout), SAME_LAYOUT)

    def with_layout(self, input_layout: str, output_layout: str) -> LayoutSwitch:
        return LayoutSwitch(self, layout=input_layout)

    def get_config(self) -> dict[str, Any]:
        return {"channels": self.channels, "reduction": self.reduction,
                "squeeze_channels": self.squeeze_channels, "layout": self.layout}

    def __repr__(self) -> str:
        layout = ", NHWC" if self.layout == "NHWC" else ""
        return f"SqueezeExcite({self.channels}→{self.squeeze_channels}→{self.channels}{layout})"
