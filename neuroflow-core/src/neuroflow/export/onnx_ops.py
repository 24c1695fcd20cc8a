"""ONNX converters of the core's ops and composites, and how a plugin adds its own.

A converter is ``converter(graph, op, x, where) -> Value``: it adds to
``graph`` (a :class:`~neuroflow.export.onnx_graph.GraphBuilder`) the nodes that
compute what ``op.forward`` computes in eval mode on the value ``x``, and
returns the result; ``where`` is the op's path in the model (``model.3``),
for node names and errors. A composite converts its children with
``graph.convert``. Converters read an op's parameters and attributes, never
run it, and do not depend on its training mode.

Converters are found by the op's class name in the ``neuroflow_onnx`` entry
points: the core's are declared in neuroflow-core's ``pyproject.toml``, and
a plugin declares those of its ops in its own::

    [project.entry-points.neuroflow_onnx]
    Swish = "my_plugin.onnx:swish"

    # my_plugin/onnx.py
    from neuroflow.export import Value

    def swish(graph, op, x, where):
        gate = graph.node("Sigmoid", [x.name], where)
        return Value(graph.node("Mul", [x.name, gate], where), x.shape, x.perm)

At run time (a notebook, a test) ``register_converter("Swish", swish)`` does the same.
"""

from __future__ import annotations

import math
from typing import Any

from neuroflow import registry
from neuroflow.export.onnx_graph import Converter, GraphBuilder, Value, identity
from neuroflow.operator import Operator


def register_converter(op_type: str, converter: Converter) -> None:
    """Make ops whose class is named ``op_type`` exportable with ``converter`` (replacing any earlier one).

    Lookup is by the exact class name: a subclass that computes something
    else is never exported as its parent; register it under its own name.
    """
    registry.onnx_converters.register(op_type, converter)


def supported_ops() -> list[str]:
    """The op class names that have a converter."""
    return registry.onnx_converters.names()


def host(op: Operator, array: Any) -> Any:
    """``array`` (a parameter or buffer of ``op``) as a host numpy array."""
    return op.backend.to_host(array)


# --------------------------------------------------------------------------- shared by several converters
def add(graph: GraphBuilder, a: Value, b: Value, where: str) -> Value:
    """``a + b`` of two values of one logical shape, in their stored layout when they share it."""
    if a.perm == b.perm:
        return Value(graph.node("Add", [a.name, b.name], where), a.shape, a.perm)
    return Value(graph.node("Add", [graph.logical(a, where), graph.logical(b, where)], where), a.shape,
                 identity(a.rank))


def apply_relu(graph: GraphBuilder, x: Value, where: str) -> Value:
    """``max(x, 0)``, in the input's stored layout: a ReLU another op fuses, or one that ends a block."""
    return Value(graph.node("Relu", [x.name], where), x.shape, x.perm)


def concat(graph: GraphBuilder, parts: list[Value], axis: int, where: str) -> Value:
    """``parts`` joined along logical ``axis``, in their stored layout when they all share it."""
    rank = parts[0].rank
    axis %= rank
    shape = list(parts[0].shape)
    shape[axis] = sum(p.shape[axis] for p in parts)
    if all(p.perm == parts[0].perm for p in parts):
        name = graph.node("Concat", [p.name for p in parts], where, axis=parts[0].stored_axis(axis))
        return Value(name, tuple(shape), parts[0].perm)
    name = graph.node("Concat", [graph.logical(p, where) for p in parts], where, axis=axis)
    return Value(name, tuple(shape), identity(rank))


def children_by_identity(op: Operator) -> dict[int, str]:
    """Child op id → its attribute name, for readable paths (``model.layer1.0``)."""
    return {id(child): name for name, child in op.named_children()}


# --------------------------------------------------------------------------- layers
def linear(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    """Gemm for a batch of vectors; MatMul + Add when the input has more dimensions."""
    weight = host(op, op.weight.data)
    bias = [graph.weight(host(op, op.bias.data), f"{where}.bias")] if op.has_bias else []
    shape = (*x.shape[:-1], op.out_features)
    if x.rank == 2:
        name = graph.node("Gemm", [graph.logical(x, where), graph.weight(weight, f"{where}.weight"), *bias], where,
                          transB=1)
    else:
        name = graph.node("MatMul", [graph.logical(x, where), graph.weight(weight.T, f"{where}.weight")], where)
        if bias:
            name = graph.node("Add", [name, *bias], where)
    return Value(name, shape, identity(len(shape)))


def _elementwise(op_type: str) -> Converter:
    def convert(graph: GraphBuilder, op: Operator, x: Value, where: str) -> Value:
        return Value(graph.node(op_type, [x.name], where), x.shape, x.perm)

    convert.__doc__ = f"{op_type}, in the input's stored layout."
    return convert


relu = _elementwise("Relu")
sigmoid = _elementwise("Sigmoid")
tanh = _elementwise("Tanh")


def leaky_relu(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    return Value(graph.node("LeakyRelu", [x.name], where, alpha=float(op.negative_slope)), x.shape, x.perm)


def gelu(graph: GraphBuilder, op: Operator, x: Value, where: str) -> Value:
    """The tanh approximation: ``Gelu(approximate="tanh")`` from opset 20, composed of primitives before."""
    if graph.opset >= 20:
        return Value(graph.node("Gelu", [x.name], where, approximate="tanh"), x.shape, x.perm)
    # ½x(1 + tanh(√(2/π)(x + 0.044715x³)))
    square = graph.node("Mul", [x.name, x.name], where)
    cube = graph.node("Mul", [square, x.name], where)
    inner = graph.node("Add", [x.name, graph.node("Mul", [cube, graph.scalar(0.044715, f"{where}.c")], where)], where)
    t = graph.node("Tanh", [graph.node("Mul", [inner, graph.scalar(math.sqrt(2 / math.pi), f"{where}.k")], where)],
                   where)
    half_x = graph.node("Mul", [x.name, graph.scalar(0.5, f"{where}.half")], where)
    y = graph.node("Mul", [half_x, graph.node("Add", [t, graph.scalar(1.0, f"{where}.one")], where)], where)
    return Value(y, x.shape, x.perm)


def softmax(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    return Value(graph.node("Softmax", [x.name], where, axis=x.stored_axis(op.axis)), x.shape, x.perm)


def dropout(graph: GraphBuilder, op: Operator, x: Value, where: str) -> Value:
    """The identity: dropout does nothing in eval mode, so it adds no node."""
    return x


def flatten(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    shape = op.output_shape(x.shape)
    target = graph.ints([0] * op.start_dim + [-1], f"{where}.shape")  # 0 keeps a dimension, the batch included
    return Value(graph.node("Reshape", [graph.logical(x, where), target], where), shape, identity(len(shape)))


def reshape(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    shape = op.output_shape(x.shape)
    target = graph.ints([0, *op.shape], f"{where}.shape")
    return Value(graph.node("Reshape", [graph.logical(x, where), target], where), shape, identity(len(shape)))


# --------------------------------------------------------------------------- composites
def sequential(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    names = children_by_identity(op)
    for i, layer in enumerate(op.layers):
        x = graph.convert(layer, x, f"{where}.{names.get(id(layer), i)}")
    return x


def residual(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    block = graph.convert(op.block, x, f"{where}.block")
    shortcut = graph.convert(op.shortcut, x, f"{where}.shortcut") if op.has_shortcut else x
    return add(graph, block, shortcut, where)


def concat_branches(graph: GraphBuilder, op: Any, x: Value, where: str) -> Value:
    parts = [graph.convert(branch, x, f"{where}.{i}") for i, branch in enumerate(op.branches)]
    return concat(graph, parts, op.axis, where)
