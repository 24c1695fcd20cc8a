"""Layout planning: a model written in NCHW runs its feature-map chains in the layout its ops compute fastest in.

Vision's convolutions compute channels-last (NHWC) and permute an NCHW input
and output, a copy each way, per layer. :func:`plan_layouts` (the Trainer and
``nf.memory.profile`` run it after :func:`neuroflow.fusion.fuse`, before the
first step) lets every Sequential run a chain of such ops in the layout they
prefer, converting once where the chain starts and once where it ends. The
model itself is not changed. See :mod:`neuroflow.layout_pass.planner` for
how, :mod:`neuroflow.layout_pass.options` for the protocol an op implements,
and ``docs/plugins/write-an-op-plugin.md``.
"""

from neuroflow.layout_pass.options import ELEMENTWISE, LayoutOptions, options_of
from neuroflow.layout_pass.planned import Conversion, LayoutPlanned
from neuroflow.layout_pass.planner import plan_layouts

__all__ = ["ELEMENTWISE", "Conversion", "LayoutOptions", "LayoutPlanned", "options_of", "plan_layouts"]
