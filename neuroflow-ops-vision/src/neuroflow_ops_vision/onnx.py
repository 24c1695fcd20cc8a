"""ONNX converters of this distribution's ops and blocks, found by class name through the ``neuroflow_onnx``
entry points of its ``pyproject.toml`` (ChannelConcat and ResNet use the core's converters of Concat and
Sequential, which convert their children in turn).

ONNX's convolutions, pools and normalisations read NCHW. An op given NHWC
maps (``layout="NHWC"``) reads them through a permuted value rather than a
Transpose of its own (see :mod:`neuroflow.export.onnx_graph`), and
ConvertLayout only relabels the layout, so a model that converts once at its
input exports without Transposes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow.export import ExportError, GraphBuilder, Value
from neuroflow.export.onnx_graph import identity
from neuroflow.export.onnx_ops import add, apply_relu, children_by_identity, host

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)


def _permuted_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape[a] for a in axes)


def _window(op: Any) -> dict[str, Any]:
    ph, pw = op.padding
    return {"kernel_shape": list(op.kernel_size), "strides": list(op.stride), "pads": [ph, pw, ph, pw]}


def conv2d(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    """Conv with the op's stride, padding, dilation and groups (depthwise convolutions included)."""
    inputs = [graph.nchw(x, op.layout, where), graph.weight(host(op, op.weight.data), f"{where}.weight")]
    if op.has_bias:
        inputs.append(graph.weight(host(op, op.bias.data), f"{where}.bias"))
    name = graph.node("Conv", inputs, where, dilations=list(op.dilation), group=op.groups, **_window(op))
    return graph.from_nchw(name, op.output_shape(x.shape), op.output_layout)


def separable_conv2d(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    """The depthwise and pointwise children, which run in NHWC (a relabelling, not a Transpose)."""
    nchw = op.layout == "NCHW"
    h = graph.transposed(x, TO_NHWC, _permuted_shape(x.shape, TO_NHWC)) if nchw else x
    h = graph.convert(op.pointwise, graph.convert(op.depthwise, h, f"{where}.depthwise"), f"{where}.pointwise")
    return graph.transposed(h, TO_NCHW, _permuted_shape(h.shape, TO_NCHW)) if nchw else h


def convert_layout(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    if op.source == op.target:
        return x
    axes = TO_NHWC if op.target == "NHWC" else TO_NCHW
    return graph.transposed(x, axes, _permuted_shape(x.shape, axes))


def batch_norm2d(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    """BatchNormalization with the running statistics (what eval mode uses), then Relu when fused."""
    if not op.track_running_stats:
        raise ExportError(f"{where} ({op!r}) normalises with batch statistics even in eval mode "
                          "(track_running_stats=False); only BatchNorm2d with running statistics exports")
    channels = np.ones(op.num_features, np.float32)
    scale = host(op, op.weight.data) if op.affine else channels
    shift = host(op, op.bias.data) if op.affine else np.zeros_like(channels)
    inputs = [graph.nchw(x, op.layout, where), graph.weight(scale, f"{where}.weight"),
              graph.weight(shift, f"{where}.bias"), graph.weight(host(op, op.running_mean.data), f"{where}.running_mean"),
              graph.weight(host(op, op.running_var.data), f"{where}.running_var")]
    y = graph.from_nchw(graph.node("BatchNormalization", inputs, where, epsilon=float(op.eps)), x.shape, op.layout)
    return apply_relu(graph, y, where) if op.activation == "relu" else y


def max_pool2d(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    name = graph.node("MaxPool", [graph.nchw(x, op.layout, where)], where, dilations=list(op.dilation),
                      ceil_mode=int(op.ceil_mode), **_window(op))
    y = graph.from_nchw(name, op.output_shape(x.shape), op.layout)
    return apply_relu(graph, y, where) if op.activation == "relu" else y


def avg_pool2d(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    name = graph.node("AveragePool", [graph.nchw(x, op.layout, where)], where, ceil_mode=int(op.ceil_mode),
                      count_include_pad=int(op.count_include_pad), **_window(op))
    return graph.from_nchw(name, op.output_shape(x.shape), op.layout)


def global_avg_pool2d(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    pooled = graph.node("GlobalAveragePool", [graph.nchw(x, op.layout, where)], where)  # (N, C, 1, 1)
    shape = op.output_shape(x.shape)
    if op.keepdims:
        return graph.from_nchw(pooled, shape, op.layout)
    return Value(graph.node("Flatten", [pooled], where, axis=1), shape, identity(2))


def squeeze_excite(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    """GlobalAveragePool → 1×1 Conv → Relu → 1×1 Conv → Sigmoid → Mul, all on the NCHW map."""
    xin = graph.nchw(x, op.layout, where)
    h = graph.node("GlobalAveragePool", [xin], where)
    for fc, after in ((op.fc1, "Relu"), (op.fc2, "Sigmoid")):
        path = f"{where}.{'fc1' if fc is op.fc1 else 'fc2'}"
        weights = [graph.weight(host(fc, fc.weight.data), f"{path}.weight"), graph.weight(host(fc, fc.bias.data), f"{path}.bias")]
        h = graph.node(after, [graph.node("Conv", [h, *weights], path, kernel_shape=[1, 1])], path)
    return graph.from_nchw(graph.node("Mul", [xin, h], where), x.shape, op.layout)


def upsample(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    """Resize with the coordinate rule of NeuroFlow's (and PyTorch's) upsampling.

    nearest: ``asymmetric`` coordinates rounded down; bilinear: ``half_pixel``
    (source coordinates clamped at 0, as ORT's linear mode does) or
    ``align_corners``. A scale factor maps coordinates by 1/scale, a size by
    in/out, in ONNX as here.
    """
    xin = graph.nchw(x, op.layout, where)
    shape = op.output_shape(x.shape)
    if op.scale_factor is not None:
        scales = graph.weight(np.array([1.0, 1.0, *op.scale_factor], np.float32), f"{where}.scales")
        inputs = [xin, "", scales]
    else:  # the batch and channels of the input, then the requested size
        leading = graph.node("Slice", [graph.node("Shape", [xin], where), graph.ints([0], f"{where}.start"),
                                       graph.ints([2], f"{where}.stop")], where)
        sizes = graph.node("Concat", [leading, graph.ints(list(op.size), f"{where}.size")], where, axis=0)
        inputs = [xin, "", "", sizes]
    attributes: dict[str, Any]
    if op.mode == "nearest":
        attributes = {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
    else:
        attributes = {"mode": "linear",
                      "coordinate_transformation_mode": "align_corners" if op.align_corners else "half_pixel"}
    return graph.from_nchw(graph.node("Resize", inputs, where, **attributes), shape, op.layout)


def basic_block(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    """relu(bn2(conv2(bn1(conv1(x)))) + shortcut(x)), the shortcut being ``downsample`` or the identity."""
    names = children_by_identity(op)
    h = x
    for layer in (op.conv1, op.bn1, op.conv2, op.bn2):
        h = graph.convert(layer, h, f"{where}.{names[id(layer)]}")
    shortcut = graph.convert(op.downsample, x, f"{where}.downsample") if op.has_downsample else x
    return apply_relu(graph, add(graph, h, shortcut, where), where)
