"""Swish: ``y = x · sigmoid(beta · x)``, with one trainable ``beta`` (SiLU when beta = 1)."""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow import Operator, Tensor
from neuroflow.operator import MemoryDeclaration


class Swish(Operator):
    """Swish activation with a trainable scalar ``beta`` (Ramachandran et al., 2017).

    Written once against ``self.xp``, so it runs on every backend. Forward caches
    the input and ``sigmoid(beta · x)``, which is all backward needs.

    Example::

        op = Swish(beta=1.0)
        y = op.forward(x)
        gx = op.backward(gy)        # also fills op.beta.grad
    """

    def __init__(self, beta: float = 1.0, dtype: Any = np.float32) -> None:
        super().__init__()
        self.beta = Tensor(np.full((1,), beta, dtype=dtype), requires_grad=True)
        self._x: Any = None
        self._s: Any = None

    def forward(self, x: Any) -> Any:
        self.check_input(x)
        xp = self.xp
        s = self.buffer("s", x.shape, x.dtype)      # sigmoid(beta·x), kept for backward
        xp.multiply(x, self.beta.data, out=s)
        xp.multiply(s, 0.5, out=s)                  # sigmoid(z) = (1 + tanh(z/2)) / 2, never overflows
        xp.tanh(s, out=s)
        s += 1.0
        s *= 0.5
        y = self.buffer("y", x.shape, x.dtype)
        xp.multiply(x, s, out=y)
        self._x, self._s = x, s
        return y

    def backward(self, grad_out: Any) -> Any:
        if self._x is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        xp, x, s = self.xp, self._x, self._s
        # t = x · s · (1 − s) = ∂s/∂beta; dy/dx = s + beta · t, dy/dbeta = x · t
        t = self.buffer("t", x.shape, x.dtype)
        xp.subtract(1.0, s, out=t)
        t *= s
        t *= x
        if self.beta.requires_grad:
            gb = self.buffer("gb", (1,), x.dtype)
            gb[...] = xp.sum(grad_out * x * t).reshape(1)
            self.accumulate_grad(self.beta, gb)
        if not self.needs_input_grad:
            return None
        gx = self.buffer("gx", x.shape, x.dtype)
        xp.multiply(t, self.beta.data, out=gx)
        gx += s
        gx *= grad_out
        return gx

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        # the output and the cached sigmoid; the input is cached by reference (the caller's buffer)
        return MemoryDeclaration(input_shape, cached=[input_shape, input_shape], workspace=[input_shape])

    def get_config(self) -> dict[str, Any]:
        return {"beta": float(np.asarray(self.backend.to_host(self.beta.data))[0])}

    def __repr__(self) -> str:
        return "Swish()"
