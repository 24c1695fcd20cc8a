"""Debug mode: extra checks on every backward (gradient shapes), off by default for speed.

Turned on by ``NEUROFLOW_DEBUG=1`` or ``Trainer(debug=True)``.
"""

from __future__ import annotations

import os

from neuroflow.errors import ShapeError

_enabled = os.environ.get("NEUROFLOW_DEBUG", "") not in ("", "0", "false", "False")


def enabled() -> bool:
    return _enabled


def set_enabled(flag: bool) -> None:
    global _enabled
    _enabled = bool(flag)


def check_gradient_shape(layer: object, input_shape: tuple[int, ...], grad: object) -> None:
    """Raise ShapeError unless ``grad`` has exactly the shape of the layer's forward input."""
    shape = tuple(getattr(grad, "shape", ()))
    if shape != tuple(input_shape):
        raise ShapeError(
            f"{layer!r}.backward returned a gradient of shape {shape}; "
            f"its forward input had shape {tuple(input_shape)}"
        )
