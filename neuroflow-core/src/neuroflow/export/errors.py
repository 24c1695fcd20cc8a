"""ExportError: a model that cannot be exported as asked."""

from __future__ import annotations

from neuroflow.errors import NeuroFlowError


class ExportError(NeuroFlowError, ValueError):
    """An op has no converter, an option is out of range, or the ``onnx`` package is missing.

    The message names the op (by its path in the model, ``model.3.block``)
    and what is supported or what to install.
    """
