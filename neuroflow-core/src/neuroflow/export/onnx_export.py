"""``to_onnx``: a model as an ONNX file that onnxruntime runs, with float32 weights as initializers."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from neuroflow import registry
from neuroflow.checkpoint.atomic import write_atomically
from neuroflow.export.errors import ExportError
from neuroflow.export.onnx_graph import GraphBuilder, Value, identity
from neuroflow.operator import Operator

DEFAULT_OPSET = 17
#: Softmax over one axis and Resize with optional inputs need opset 13.
MIN_OPSET = 13
INSTALL_HINT = "pip install 'neuroflow-core[onnx]'"


@dataclass(frozen=True)
class ExportReport:
    """What ``to_onnx`` wrote: the file, its opset, the input and output shapes (batch free), its size."""

    path: Path
    opset: int
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    nodes: int
    file_bytes: int

    def __str__(self) -> str:
        return (f"exported {self.path} (ONNX opset {self.opset}, {self.nodes} nodes, {self.file_bytes:,} bytes): "
                f"input {_batch_free(self.input_shape)} → output {_batch_free(self.output_shape)}")


def _batch_free(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(["batch", *map(str, shape[1:])]) + ")"


def onnx_module() -> Any:
    """The ``onnx`` package, or an ExportError saying how to install it."""
    try:
        import onnx
    except ImportError:
        raise ExportError(f"exporting to ONNX needs the onnx package: {INSTALL_HINT}") from None
    return onnx


def to_onnx(
    model: Operator, path: str | os.PathLike[str], input_shape: Sequence[int], opset: int = DEFAULT_OPSET
) -> ExportReport:
    """Write ``model`` as an ONNX file computing what ``model.eval().forward(x)`` computes for ``x`` of ``input_shape``.

    ``input_shape`` includes the batch dimension, which the file leaves free
    (any batch size runs). Weights become float32 initializers; a model loaded
    from an INT8 file exports its dequantized weights. Dropout is the identity
    and BatchNorm uses its running statistics, as in eval mode; the model
    itself is not changed. The graph is checked with ``onnx.checker`` and
    written atomically. Raises ExportError for an op without a converter (the
    message lists those that have one) and for an opset outside
    ``13..onnx.defs.onnx_opset_version()``.

    >>> nf.export.to_onnx(model, "mnist.onnx", input_shape=(1, 1, 28, 28))
    """
    onnx = onnx_module()
    if not isinstance(model, Operator):
        raise TypeError(f"to_onnx needs an Operator; got {type(model).__name__}")
    newest = onnx.defs.onnx_opset_version()
    if not isinstance(opset, int) or not MIN_OPSET <= opset <= newest:
        raise ExportError(f"opset must be an integer from {MIN_OPSET} to {newest} (this onnx package's newest); "
                          f"got {opset!r}")
    shape = tuple(input_shape)
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise ExportError(f"input_shape must be positive integers, batch first, like (1, 784); got {input_shape!r}")
    graph = GraphBuilder(opset, registry.onnx_converters)
    x = Value(graph.fresh("input"), shape, identity(len(shape)))
    y = graph.convert(model, x, "model")
    proto = graph.to_proto(x, y, type(model).__name__)
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as exc:  # a converter's bug, not the user's: say whose
        raise ExportError(f"the exported graph fails onnx.checker ({exc}); please report this with the model's "
                          "repr") from None
    target = write_atomically(path, lambda temp: onnx.save(proto, temp))
    return ExportReport(target, opset, shape, y.shape, len(proto.graph.node), target.stat().st_size)
