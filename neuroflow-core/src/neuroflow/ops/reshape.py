"""Flatten and Reshape: views that change shape, with the inverse view in backward."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from neuroflow.errors import ShapeError
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow.replay import View


def _reshaped(x: Any, shape: tuple[int, ...]) -> Any:
    return x.reshape(shape)


class Flatten(Operator):
    """Collapses dimensions ``start_dim`` and later into one: (N, C, H, W) → (N, C·H·W)."""

    def __init__(self, start_dim: int = 1) -> None:
        super().__init__()
        self.start_dim = int(start_dim)
        self._shape: tuple[int, ...] | None = None

    def _out(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) <= self.start_dim:
            raise ShapeError(f"{self!r} got input of shape {tuple(shape)}; expected more than {self.start_dim} dimensions")
        return (*shape[: self.start_dim], math.prod(shape[self.start_dim:]))

    def forward(self, x: Any) -> Any:
        out = self._out(x.shape)
        self._shape = x.shape
        return x.reshape(out)

    def backward(self, grad_out: Any) -> Any:
        if self._shape is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        return grad_out.reshape(self._shape)

    def replay_forward(self, x: Any, y: Any) -> View | None:
        if not isinstance(x, np.ndarray) or not np.may_share_memory(x, y):
            return None  # reshaping copied the input (not contiguous): a new array every step
        return View(functools.partial(_reshaped, shape=tuple(y.shape)))  # nothing to compute: a view

    def replay_backward(self, grad_out: Any, grad_in: Any) -> list[Any]:
        return []  # a view of the gradient buffer, the same every step

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        return MemoryDeclaration(self._out(tuple(input_shape)))

    def get_config(self) -> dict[str, Any]:
        return {"start_dim": self.start_dim}

    def __repr__(self) -> str:
        return f"Flatten(start_dim={self.start_dim})"


class Reshape(Operator):
    """Reshapes each sample to ``shape`` (the batch dimension is kept): (N, 784) → (N, 1, 28, 28)."""

    def __init__(self, *dims: int, shape: tuple[int, ...] | list[int] | None = None) -> None:
        super().__init__()
        if shape is not None and dims:
            raise TypeError("Reshape takes the target shape either positionally or as shape=..., not both")
        if shape is None:
            shape = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        elif isinstance(shape, int):
            shape = (shape,)
        if sum(1 for s in shape if s == -1) > 1 or any(s == 0 or s < -1 for s in shape):
            raise ValueError(f"Reshape target {shape} must have positive sizes and at most one -1")
        self.shape = tuple(int(s) for s in shape)
        self._shape: tuple[int, ...] | None = None

    def _out(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        sample = math.prod(shape[1:]) if len(shape) > 1 else 1
        known = math.prod(s for s in self.shape if s != -1)
        if (-1 in self.shape and sample % known) or (-1 not in self.shape and known != sample):
            raise ShapeError(f"{self!r} got input of shape {tuple(shape)}; {sample} values per sample cannot be shaped {self.shape}")
        target = tuple(sample // known if s == -1 else s for s in self.shape)
        return (shape[0], *target)

    def forward(self, x: Any) -> Any:
        out = self._out(x.shape)
        self._shape = x.shape
        return x.reshape(out)

    def backward(self, grad_out: Any) -> Any:
        if self._shape is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        return grad_out.reshape(self._shape)

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        return MemoryDeclaration(self._out(tuple(input_shape)))

    def get_config(self) -> dict[str, Any]:
        return {"shape": list(self.shape)}

    def __repr__(self) -> str:
        return f"Reshape{self.shape}"
