"""ResNet-18 with torchvision's parameter names, running in NHWC after one layout conversion.

``resnet18(num_classes=10, small_input=True)`` is the CIFAR variant (3×3
stride-1 stem, no max-pool: 11,173,962 parameters for 10 classes);
``small_input=False`` is the ImageNet stem (7×7 stride 2, then 3×3 max-pool).
``named_parameters()`` yields ``conv1.weight``, ``bn1.weight``, …,
``layer2.0.downsample.0.weight``, …, ``fc.bias`` in torchvision's order, so
state dicts move between the two by name.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from neuroflow import debug, folding
from neuroflow.composites import Sequential, report_forward_read
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow.ops.linear import Linear
from neuroflow_ops_vision.batchnorm import BatchNorm2d
from neuroflow_ops_vision.conv import Conv2d
from neuroflow_ops_vision.layout import check_grad, check_layout
from neuroflow_ops_vision.pooling import GlobalAvgPool2d, MaxPool2d
from neuroflow_ops_vision.workspace import Workspace

#: Column memory per chunk of a ResNet convolution. The 4×4 maps of the last stage at batch 32 need 11.3 MiB of
#: gradient columns in one chunk; in two, the 9 MiB kernel is flipped again and its gradient added for the second
#: (about 8 ms a convolution here). Measured on ResNet-18 at batch 32 (one process, steps alternated): 884 ms at
#: 12 MiB against 941 ms at the 8 MiB default, for an arena of 149.4 MiB instead of 139.3.
RESNET_MAX_WORKSPACE_BYTES = 12 * 2**20


class BasicBlock(Operator):
    """Two 3×3 convolutions with BatchNorm and a shortcut: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).

    The shortcut is the identity, or ``downsample`` (1×1 conv + BatchNorm)
    when the stride or width changes. The ReLUs are fused: the first into
    ``bn1``, the second with the residual add into one pass over ``bn2``'s output.
    ``bn1``'s output (``conv2``'s input) is not kept from forward to backward:
    backward recomputes it from ``bn1``'s cached input in one elementwise pass,
    so a block keeps three feature maps instead of four; two in a
    :class:`ResNet` that recomputes its blocks' outputs
    (:meth:`recompute_output`). The shortcut's output is added into the
    block's and dies there: a planned step reuses its memory before the peak
    (ResNet-18 at batch 32: 7 MiB of the arena).
    """

    def __init__(self, in_planes: int, planes: int, stride: int = 1, layout: str = "NHWC", dtype: Any = np.float32) -> None:
        super().__init__()
        self.in_planes, self.planes, self.stride = int(in_planes), int(planes), int(stride)
        self.layout = check_layout(layout, "BasicBlock")
        conv = functools.partial(Conv2d, bias=False, layout=self.layout, max_workspace_bytes=RESNET_MAX_WORKSPACE_BYTES,
                                 dtype=dtype)
        self.conv1 = conv(in_planes, planes, 3, stride, 1)
        self.bn1 = BatchNorm2d(planes, activation="relu", layout=self.layout, dtype=dtype)
        self.conv2 = conv(planes, planes, 3, 1, 1)
        self.bn2 = BatchNorm2d(planes, layout=self.layout, dtype=dtype)
        self.has_downsample = stride != 1 or in_planes != planes
        if self.has_downsample:
            self.downsample = Sequential(
                conv(in_planes, planes, 1, stride),
                BatchNorm2d(planes, layout=self.layout, dtype=dtype),
            )
        self._out: Any = None

    def forward(self, x: Any) -> Any:
        xp = self.xp
        if folding.active():  # predict or evaluate: each BatchNorm runs inside the convolution before it
            out = folding.run_pair(self.conv2, self.bn2, folding.run_pair(self.conv1, self.bn1, x))
        else:
            c1 = self.conv1.forward(x)
            with Workspace(self, "forward") as ws:
                c2 = self.conv2.forward(self.bn1.forward(c1, out=ws("block.h", c1.shape, c1.dtype)))
            out = self.bn2.forward(c2)
        # bn2 does not keep its output for backward, so the add and the ReLU may write into it.
        if self.has_downsample:
            shortcut = self.downsample.forward(x)
            out += shortcut
            pool = self._pool
            if pool is not None and pool.tracing:  # the shortcut's BatchNorm does not read its output again
                pool.drop(shortcut, out)
        else:
            out += x
        xp.maximum(out, 0, out=out)
        self._out = out
        return out

    def backward(self, grad_out: Any, overwrite_grad_out: bool = False) -> Any:
        """The input gradient; with ``overwrite_grad_out`` (a caller that reads ``grad_out`` no more, as
        :class:`ResNet` does) the ReLU's masked gradient is written over ``grad_out`` instead of into a
        workspace of its size."""
        out = self._out
        if out is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        check_grad(self, grad_out, out.shape)
        xp = self.xp
        pool = self._pool
        tracing = pool is not None and pool.tracing
        with Workspace(self, "backward") as ws:
            g = grad_out if overwrite_grad_out else ws("block.g", out.shape, out.dtype)
            with Workspace(self, "backward.relu") as relu_ws:
                mask = relu_ws("block.mask", out.shape, bool)
                xp.greater(out, 0, out=mask)
                xp.multiply(grad_out, mask, out=g)
            if tracing:
                # Read for the last time (any consumer's backward ran before this one): its memory may serve the rest.
                pool.drop(out, g)
                # Both branches read g: the first one's handoff must not end it.
                pool.keep(g)
            gx = self._chain_backward(g)
            # conv1's gradient buffer is ours to add into: conv1 does not read it again.
            if self.has_downsample:
                shortcut = self.downsample.backward(g)
                gx += shortcut
                if tracing:  # read for the last time
                    pool.release(shortcut)
            else:
                gx += g
            if tracing:
                pool.release(g, kept=True)
            return gx

    def _chain_backward(self, g: Any) -> Any:
        """conv1 ← bn1 ← conv2 ← bn2 backward; while tracing, each layer's end is reported as Sequential does."""
        pool = self._pool
        tracing = pool is not None and pool.tracing

        def step(layer: Operator, g: Any) -> Any:
            produced = layer.backward(g)
            if tracing:
                pool.handoff(g, produced, layer)
            return produced

        g = step(self.bn2, g)
        with Workspace(self, "recompute") as ws:
            h = self.bn1.recompute(ws("block.h", self.bn1.saved_input.shape, g.dtype))
            self.conv2.save_input(h)  # conv2's input, dropped after forward
            g = step(self.bn1, step(self.conv2, g))
        return step(self.conv1, g)

    def recompute_output(self, x: Any) -> Any:
        """Write the last forward's output again, bit for bit, into a buffer of the block's own, and return it.

        From what backward keeps anyway: ``bn2``'s input, and the shortcut's
        (``downsample``'s BatchNorm input, or ``x``, the block's input, for an
        identity shortcut; None is fine with a downsample). The block reads the
        new buffer as its output from then on (its ReLU's mask).
        """
        if self._out is None:
            raise RuntimeError(f"{self!r}.recompute_output called before forward")
        if not self.has_downsample and x is None:
            raise ValueError(f"{self!r}: an identity shortcut needs the block's input to recompute the output")
        xp = self.xp
        out = self.bn2.recompute(self.buffer("recomputed.out", self._out.shape, self._out.dtype))
        if self.has_downsample:
            with Workspace(self, "recompute") as ws:
                shortcut_bn = cast(BatchNorm2d, self.downsample[1])
                out += shortcut_bn.recompute(ws("block.shortcut", out.shape, out.dtype))
        else:
            out += x
        xp.maximum(out, 0, out=out)
        self._out = out
        return out

    def read_input_from(self, x: Any) -> None:
        """Backward reads the block's input from ``x`` (the same values, recomputed into other memory)."""
        self.conv1.save_input(x)
        if self.has_downsample:
            self.downsample[0].save_input(x)

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shape = self.conv1.output_shape(tuple(input_shape))
        return MemoryDeclaration(shape, cached=[shape], workspace=[shape, shape])  # masked gradient; bn1's output, recomputed

    def get_config(self) -> dict[str, Any]:
        return {"in_planes": self.in_planes, "planes": self.planes, "stride": self.stride, "layout": self.layout}

    def __repr__(self) -> str:
        stride = f", stride={self.stride}" if self.stride != 1 else ""
        return f"BasicBlock({self.in_planes}→{self.planes}{stride})"


class ResNet(Sequential):
    """A ResNet of BasicBlocks: stem, four stages (widths 64·2ᵏ), global average pool, ``fc``.

    A Sequential whose layers carry torchvision's names. Input: (N, C, H, W)
    batches (``input_layout="NHWC"`` for channels-last data); ``conv1`` reads
    that layout and writes NHWC, in which every later layer runs.

    With ``recompute_block_outputs`` (the default) a training step keeps no
    block's output, nor the CIFAR stem's, past the next block's forward:
    backward recomputes each from the maps the BatchNorms keep anyway, in
    one elementwise pass per block, bit for bit (see
    :meth:`BasicBlock.recompute_output`). ResNet-18 at batch 32: an arena
    of 110.4 MiB instead of 137.9, for a step 1.7 % longer (one process,
    steps alternated). The last block's output, read first by its own
    backward, and an ImageNet stem's max-pool output are kept.
    """

    def __init__(self, layers: Sequence[int] = (2, 2, 2, 2), num_classes: int = 10, small_input: bool = True,
                 in_channels: int = 3, input_layout: str = "NCHW", recompute_block_outputs: bool = True,
                 dtype: Any = np.float32) -> None:
        super().__init__()
        self.recompute_block_outputs = bool(recompute_block_outputs)
        self._recomputing = False
        if len(layers) != 4 or any(int(n) <= 0 for n in layers):
            raise ValueError(f"ResNet: layers must be four positive block counts; got {list(layers)}")
        self.block_counts, self.num_classes = [int(n) for n in layers], int(num_classes)
        self.small_input, self.in_channels = bool(small_input), int(in_channels)
        self.input_layout = check_layout(input_layout, "ResNet")
        kernel, stride, padding = (3, 1, 1) if self.small_input else (7, 2, 3)
        self.conv1 = Conv2d(in_channels, 64, kernel, stride, padding, bias=False, layout=self.input_layout,
                            max_workspace_bytes=RESNET_MAX_WORKSPACE_BYTES,
                            output_layout="NHWC", dtype=dtype)
        self.bn1 = BatchNorm2d(64, activation="relu", layout="NHWC", dtype=dtype)
        stages: list[Operator] = [self.conv1, self.bn1]
        if not self.small_input:
            self.maxpool = MaxPool2d(3, 2, 1, layout="NHWC")
            stages.append(self.maxpool)
        planes_in = 64
        for index, (count, planes) in enumerate(zip(self.block_counts, (64, 128, 256, 512))):
            stride = 1 if index == 0 else 2
            blocks = [BasicBlock(planes_in, planes, stride, dtype=dtype)]
            blocks += [BasicBlock(planes, planes, 1, dtype=dtype) for _ in range(count - 1)]
            stage = Sequential(*blocks)
            setattr(self, f"layer{index + 1}", stage)
            stages.append(stage)
            planes_in = planes
        self.avgpool = GlobalAvgPool2d(layout="NHWC")
        self.fc = Linear(512, num_classes, dtype=dtype)
        self.layers = stages + [self.avgpool, self.fc]

    def _chain(self) -> list[Operator]:
        """The layers as they run, stages opened into their blocks."""
        return [block for layer in self.layers for block in (layer.layers if isinstance(layer, Sequential) else [layer])]

    def forward(self, x: Any) -> Any:
        self._recomputing = self.recompute_block_outputs and self.training and not debug.enabled()
        if not self._recomputing:
            return super().forward(x)
        pool = self._pool
        tracing = pool is not None and pool.tracing
        chain = self._chain()
        for index, layer in enumerate(chain):
            y = layer.forward(x)
            producer = chain[index - 1] if index else None
            if tracing and producer is not None:
                if _recomputable(producer, layer):  # dies now: backward recomputes it
                    pool.drop(x, y)
                else:
                    report_forward_read(pool, producer, layer, x, y)
            x = y
        return x

    def backward(self, grad_out: Any) -> Any:
        """Backward; each block's input, when its producer's forward output was not kept, is recomputed first."""
        if not self._recomputing:
            return super().backward(grad_out)
        pool = self._pool
        tracing = pool is not None and pool.tracing
        chain = self._chain()
        recomputed: dict[int, Any] = {}  # by chain index; plain locals, no closures: nothing outlives the call
        g = grad_out
        for index in reversed(range(len(chain))):
            layer = chain[index]
            if isinstance(layer, BasicBlock):
                if _recomputable(chain[index - 1], layer):
                    layer.read_input_from(self._input_of(chain, index, recomputed))
                # nothing here reads a gradient after the layer it was handed to: a block may overwrite it
                produced = layer.backward(g, overwrite_grad_out=True)
            else:
                produced = layer.backward(g)
            if tracing:
                pool.handoff(g, produced, layer)
            g = produced
            if g is None:  # the first layer skipped its input gradient
                break
        return g

    def _output_of(self, chain: list[Operator], index: int, recomputed: dict[int, Any]) -> Any:
        """The output of ``chain[index]`` (a block, or the stem's BatchNorm), recomputed once per backward."""
        if index not in recomputed:
            producer = chain[index]
            if isinstance(producer, BasicBlock):
                x = None if producer.has_downsample else self._input_of(chain, index, recomputed)
                recomputed[index] = producer.recompute_output(x)
            else:
                bn = cast(BatchNorm2d, producer)
                kept = bn.saved_input
                recomputed[index] = bn.recompute(bn.buffer("recomputed.y", kept.shape, kept.dtype))
        return recomputed[index]

    def _input_of(self, chain: list[Operator], index: int, recomputed: dict[int, Any]) -> Any:
        """The input of the block ``chain[index]``: recomputed, or kept (an ImageNet stem's max-pool output)."""
        block = cast(BasicBlock, chain[index])
        if _recomputable(chain[index - 1], block):
            return self._output_of(chain, index - 1, recomputed)
        return block.conv1.saved_input

    def get_config(self) -> dict[str, Any]:
        return {"layers": self.block_counts, "num_classes": self.num_classes, "small_input": self.small_input,
                "in_channels": self.in_channels, "input_layout": self.input_layout,
                "recompute_block_outputs": self.recompute_block_outputs}

    def __repr__(self) -> str:
        names = {id(child): name for name, child in self.named_children()}
        inner = "".join(f"\n  ({names[id(layer)]}): " + repr(layer).replace("\n", "\n  ") for layer in self.layers)
        return f"ResNet({inner}\n)"


def _recomputable(producer: Operator, consumer: Operator) -> bool:
    """Whether ``producer``'s output, a block's input, is recomputed in backward instead of kept: a block's or a
    BatchNorm's (the stem's), which recompute it from the maps their own backward keeps."""
    return isinstance(consumer, BasicBlock) and isinstance(producer, (BasicBlock, BatchNorm2d))


def resnet18(num_classes: int = 10, small_input: bool = True, in_channels: int = 3,
             input_layout: str = "NCHW", recompute_block_outputs: bool = True, dtype: Any = np.float32) -> ResNet:
    """ResNet-18: torchvision's architecture and parameter names; ``small_input`` selects the CIFAR stem.

    Example::

        model = resnet18(num_classes=10)          # 11,173,962 parameters
        logits = model.forward(x)                 # x: (N, 3, 32, 32) -> (N, 10)
    """
    return ResNet((2, 2, 2, 2), num_classes, small_input, in_channels, input_layout, recompute_block_outputs, dtype)
