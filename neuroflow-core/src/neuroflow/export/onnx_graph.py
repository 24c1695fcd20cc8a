"""The ONNX graph under construction: nodes, float32 initializers, and the layout each value is stored in.

Converters (see :mod:`neuroflow.export.onnx_ops`) add nodes through
:class:`GraphBuilder` and pass :class:`Value` objects along. A value has the
shape NeuroFlow's array would have (its *logical* shape) and may be stored
*permuted*: ONNX convolutions, pools and normalisations read NCHW, so an NHWC
feature map is kept in NCHW (``perm`` (0, 3, 1, 2)) from the op that made it to
the next op that does. Elementwise ops pass the permutation through, layout
conversions only change it, and a Transpose is emitted only where an op needs
the logical layout (Flatten, Linear, the graph output). A model that runs in
NHWC after its first convolution, as the vision builders make them, thus
exports without a single Transpose.

Nothing here imports ``onnx``: the graph is plain Python until
:meth:`GraphBuilder.to_proto` assembles it, so converters can be registered
where the package is not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from neuroflow.export.errors import ExportError
from neuroflow.registry import Registry

if TYPE_CHECKING:
    from neuroflow.operator import Operator

#: Physical NCHW of a logical NHWC map, and the reverse.
NHWC_AS_NCHW = (0, 3, 1, 2)
NCHW_AS_NHWC = (0, 2, 3, 1)
#: The ONNX name of a value's first (batch) dimension, left free so the model takes any batch size.
BATCH = "batch"

#: ``converter(graph, op, x, where) -> Value``: adds the nodes computing ``op.forward(x)`` in eval mode.
Converter = Callable[["GraphBuilder", "Operator", "Value", str], "Value"]


def identity(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


def inverse(perm: Sequence[int]) -> tuple[int, ...]:
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return tuple(out)


@dataclass(frozen=True)
class Value:
    """A tensor of the graph: its ONNX name, NeuroFlow's shape for it, and how it is stored.

    The stored tensor is ``logical.transpose(perm)``; ``perm`` is the identity
    when it is stored as NeuroFlow holds it.
    """

    name: str
    shape: tuple[int, ...]
    perm: tuple[int, ...]

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def permuted(self) -> bool:
        return self.perm != identity(self.rank)

    def stored_axis(self, axis: int) -> int:
        """The axis of the stored tensor that holds logical ``axis``."""
        return self.perm.index(axis % self.rank)


@dataclass
class _Node:
    op_type: str
    inputs: list[str]
    output: str
    name: str
    attributes: dict[str, Any]


@dataclass
class GraphBuilder:
    """Collects the nodes and initializers of one exported model; ``opset`` is the default domain's version.

    ``converters`` finds an op's converter by its class name (``neuroflow.registry.onnx_converters``).
    """

    opset: int
    converters: Registry
    nodes: list[_Node] = field(default_factory=list)
    initializers: dict[str, np.ndarray] = field(default_factory=dict)
    _names: set[str] = field(default_factory=set)
    _logical: dict[str, str] = field(default_factory=dict)

    # ------------------------------------------------------------------ names, nodes, weights
    def fresh(self, hint: str) -> str:
        """A tensor or node name not used yet, derived from ``hint``."""
        base = hint.replace(" ", "_") or "t"
        name, n = base, 1
        while name in self._names:
            n += 1
            name = f"{base}_{n}"
        self._names.add(name)
        return name

    def node(self, op_type: str, inputs: Sequence[str], where: str, **attributes: Any) -> str:
        """Add an ``op_type`` node (its attributes as keywords) and return the name of its output."""
        output = self.fresh(f"{where}/{op_type}")
        self.nodes.append(_Node(op_type, list(inputs), output, self.fresh(f"{where}/{op_type}#node"), attributes))
        return output

    def weight(self, array: Any, where: str) -> str:
        """Add ``array`` (host array, any float dtype) as a float32 initializer and return its name."""
        name = self.fresh(where)
        self.initializers[name] = np.ascontiguousarray(np.asarray(array, dtype=np.float32))
        return name

    def ints(self, values: Sequence[int], where: str) -> str:
        """Add an int64 initializer (shapes, axes) and return its name."""
        name = self.fresh(where)
        self.initializers[name] = np.asarray(list(values), dtype=np.int64)
        return name

    def scalar(self, value: float, where: str) -> str:
        """A float32 scalar initializer (broadcasts against any float32 tensor)."""
        return self.weight(np.float32(value), where)

    # ------------------------------------------------------------------ layouts
    def logical(self, x: Value, where: str) -> str:
        """The name of ``x`` stored as NeuroFlow holds it, adding one Transpose if it is permuted (once per value)."""
        if not x.permuted:
            return x.name
        if x.name not in self._logical:
            self._logical[x.name] = self.node("Transpose", [x.name], where, perm=list(inverse(x.perm)))
        return self._logical[x.name]

    def nchw(self, x: Value, layout: str, where: str) -> str:
        """The name of feature map ``x`` (logical ``layout``, "NCHW" or "NHWC") stored as NCHW."""
        if x.rank != 4:
            raise ExportError(f"{where}: expected a 4-d feature map; got a value of shape {x.shape}")
        wanted = identity(4) if layout == "NCHW" else NHWC_AS_NCHW
        if x.perm == wanted:
            return x.name
        back = inverse(x.perm)  # stored → logical, then logical → wanted, as one Transpose
        return self.node("Transpose", [x.name], where, perm=[back[w] for w in wanted])

    def from_nchw(self, name: str, shape: tuple[int, ...], layout: str) -> Value:
        """A value stored as NCHW whose logical layout is ``layout``, with logical ``shape``."""
        return Value(name, shape, identity(4) if layout == "NCHW" else NHWC_AS_NCHW)

    @staticmethod
    def transposed(x: Value, axes: Sequence[int], shape: tuple[int, ...]) -> Value:
        """``x.transpose(axes)`` in NeuroFlow's terms, free: only the stored permutation changes."""
        back = inverse(axes)
        return Value(x.name, shape, tuple(back[p] for p in x.perm))

    # ------------------------------------------------------------------ ops
    def convert(self, op: Operator, x: Value, where: str) -> Value:
        """Add the nodes of ``op`` (its converter is looked up by class name) applied to ``x``."""
        kind = type(op).__name__
        if kind not in self.converters:
            raise ExportError(
                f"{where} is a {kind}, which has no ONNX converter; supported ops: {', '.join(self.converters.names())}. "
                "A plugin adds one through the neuroflow_onnx entry points or neuroflow.export.register_converter"
                + (" (LoRA adapters: fuse them first, neuroflow.lora.fuse)" if kind.startswith("LoRA") else "")
            )
        converter: Converter = self.converters.get(kind)  # a plugin's that fails to import raises PluginLoadError
        expected = op.output_shape(x.shape)  # raises ShapeError, naming the op, for an input it does not take
        y = converter(self, op, x, where)
        if tuple(y.shape) != tuple(expected):
            raise ExportError(f"{where}: the {kind} converter made a value of shape {y.shape}; "
                              f"{kind}.output_shape{x.shape} is {tuple(expected)}")
        return y

    # ------------------------------------------------------------------ assembly
    def to_proto(self, x: Value, y: Value, graph_name: str, output_name: str = "output") -> Any:
        """The ``onnx.ModelProto`` whose input is ``x`` and output ``y`` (both with a free batch dimension)."""
        from onnx import TensorProto, helper, numpy_helper

        y_name = self.logical(y, "output")
        if y_name == x.name:  # an identity model still needs a node between its input and output
            y_name = self.node("Identity", [y_name], "output")
        rename = {y_name: output_name}
        nodes = [helper.make_node(n.op_type, [rename.get(i, i) for i in n.inputs], [rename.get(n.output, n.output)],
                                  name=n.name, **n.attributes) for n in self.nodes]
        graph = helper.make_graph(
            nodes, graph_name,
            [helper.make_tensor_value_info(x.name, TensorProto.FLOAT, [BATCH, *x.shape[1:]])],
            [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, [BATCH, *y.shape[1:]])],
            [numpy_helper.from_array(array, name) for name, array in self.initializers.items()],
        )
        opsets = [helper.make_opsetid("", self.opset)]
        return helper.make_model(graph, opset_imports=opsets, producer_name="neuroflow",
                                 ir_version=helper.find_min_ir_version_for(opsets))
