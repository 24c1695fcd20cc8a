"""ChannelConcat: runs branches on one feature map and stacks their outputs along the channel axis."""

from __future__ import annotations

from typing import Any

from neuroflow.composites import Concat
from neuroflow.errors import ShapeError
from neuroflow.layout_pass import LayoutOptions
from neuroflow.operator import Operator
from neuroflow_ops_vision.layout import (
    SAME_LAYOUT,
    LayoutSwitch,
    channel_axis,
    check_feature_map,
    check_layout,
    layout_options,
)


class ChannelConcat(Concat):
    """Inception/FPN-style branch concat: ``[b(x) for b in branches]`` joined along C.

    The core ``Concat`` with the channel axis of ``layout`` (1 for NCHW, 3
    for NHWC) and an error that names the branch whose map does not fit.
    """

    def __init__(self, *branches: Operator, layout: str = "NCHW") -> None:
        name = check_layout(layout, "ChannelConcat")
        super().__init__(*branches, axis=channel_axis(name))
        self.layout = name

    def forward(self, x: Any) -> Any:
        check_feature_map(self, x, None, self.layout)
        return super().forward(x)

    def memory_declaration(self, input_shape: tuple[int, ...]) -> Any:
        shapes = [b.output_shape(tuple(input_shape)) for b in self.branches]
        spatial = [tuple(s[:self.axis]) + tuple(s[self.axis + 1:]) for s in shapes]
        for i, (shape, rest) in enumerate(zip(shapes, spatial)):
            if len(shape) != 4 or rest != spatial[0]:
                raise ShapeError(
                    f"{self!r}: branch {i} ({self.branches[i]!r}) gives {shape}; "
                    f"branch 0 gives {shapes[0]}; all must agree outside the channel axis"
                )
        return super().memory_declaration(input_shape)

    def layout_options(self) -> LayoutOptions:
        """Either layout, the branches planned in the same (see neuroflow.layout_pass)."""
        return layout_options((self.layout, self.layout), SAME_LAYOUT, branches=tuple(self.branches))

    def with_layout(self, input_layout: str, output_layout: str) -> LayoutSwitch:
        return LayoutSwitch(self, layout=input_layout, axis=channel_axis(input_layout))

    def get_config(self) -> dict[str, Any]:
        return {"layout": self.layout}

    def __repr__(self) -> str:
        inner = ", ".join(map(repr, self.branches))
        return f"ChannelConcat({inner}{', NHWC' if self.layout == 'NHWC' else ''})"
