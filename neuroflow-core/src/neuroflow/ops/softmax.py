"""Softmax over one axis (for probabilities; training uses the fused CrossEntropy loss instead)."""

from __future__ import annotations

from typing import Any

from neuroflow.operator import MemoryDeclaration, Operator


class Softmax(Operator):
    """exp(x) / Σ exp(x) along ``axis``, shifted by the maximum for stability; caches its output."""

    def __init__(self, axis: int = -1) -> None:
        super().__init__()
        self.axis = int(axis)
        self._y: Any = None

    def forward(self, x: Any) -> Any:
        self.check_input(x)
        xp = self.xp
        y = self.buffer("y", x.shape, x.dtype)
        xp.subtract(x, x.max(axis=self.axis, keepdims=True), out=y)
        xp.exp(y, out=y)
        y /= y.sum(axis=self.axis, keepdims=True)
        self._y = y
        return y

    def backward(self, grad_out: Any) -> Any:
        y = self._y
        if y is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        gx = self.buffer("gx", y.shape, y.dtype)
        self.xp.multiply(grad_out, y, out=gx)
        dot = gx.sum(axis=self.axis, keepdims=True)
        self.xp.subtract(grad_out, dot, out=gx)
        gx *= y
        return gx

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        return MemoryDeclaration(input_shape, cached=[input_shape])

    def get_config(self) -> dict[str, Any]:
        return {"axis": self.axis}

    def __repr__(self) -> str:
        return f"Softmax(axis={self.axis})"
