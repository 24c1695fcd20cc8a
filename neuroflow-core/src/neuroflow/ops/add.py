"""Add: the elementwise sum of two inputs of one shape (residual connections)."""

from __future__ import annotations

from typing import Any

from neuroflow.errors import ShapeError
from neuroflow.operator import MemoryDeclaration, Operator


class Add(Operator):
    """``forward(a, b) = a + b``; ``backward(g) = (g, g)``. Caches nothing."""

    def forward(self, a: Any, b: Any = None) -> Any:  # type: ignore[override]
        if b is None:
            raise TypeError("Add.forward takes two arrays: forward(a, b)")
        if a.shape != b.shape:
            raise ShapeError(f"{self!r} got inputs of shapes {a.shape} and {b.shape}; expected equal shapes")
        y = self.buffer("y", a.shape, a.dtype)
        self.xp.add(a, b, out=y)
        return y

    def __call__(self, a: Any, b: Any = None) -> Any:  # type: ignore[override]
        return self.forward(a, b)

    def backward(self, grad_out: Any) -> tuple[Any, Any]:
        return grad_out, grad_out

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        return MemoryDeclaration(input_shape)
