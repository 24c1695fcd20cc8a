"""Exporting models to other runtimes: ONNX (``to_onnx``, ``neuroflow export --onnx``), with converters by op name.

Converters come from the ``neuroflow_onnx`` entry points (see :mod:`neuroflow.export.onnx_ops`).
"""

from neuroflow.export.errors import ExportError
from neuroflow.export.onnx_export import DEFAULT_OPSET, ExportReport, to_onnx
from neuroflow.export.onnx_graph import Converter, GraphBuilder, Value
from neuroflow.export.onnx_ops import register_converter, supported_ops

__all__ = [
    "DEFAULT_OPSET", "Converter", "ExportError", "ExportReport", "GraphBuilder", "Value", "register_converter",
    "supported_ops", "to_onnx",
]
