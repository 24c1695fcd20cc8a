"""Dropout: zeroes each element with probability p in training, scaling the rest by 1/(1-p)."""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow import random
from neuroflow.operator import MemoryDeclaration, Operator


class Dropout(Operator):
    """Inverted dropout with its own seeded generator; the identity in eval mode.

    ``seed=None`` draws a seed from the process generator (``nf.manual_seed``),
    so a seeded program gets the same masks on every run.
    """

    def __init__(self, p: float = 0.5, seed: int | None = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"Dropout probability must be in [0, 1); got {p}")
        self.p = float(p)
        self.seed = random.child_seed() if seed is None else int(seed)
        self.rng = np.random.default_rng(self.seed)
        self._mask: Any = None

    def forward(self, x: Any) -> Any:
        self.check_input(x)
        if not self.training or self.p == 0.0:
            self._mask = None
            return x
        xp = self.xp
        # The draw comes from the host generator on every backend, so a seed gives the same masks everywhere.
        if xp is np:
            draw = self.buffer("draw", x.shape, np.float32)
            self.rng.random(x.shape, dtype=np.float32, out=draw)
        else:
            draw = xp.asarray(self.rng.random(x.shape, dtype=np.float32))
        mask = self.buffer("mask", x.shape, x.dtype)
        xp.greater_equal(draw, self.p, out=mask)
        mask *= 1.0 / (1.0 - self.p)
        self._mask = mask
        y = self.buffer("y", x.shape, x.dtype)
        xp.multiply(x, mask, out=y)
        return y

    def backward(self, grad_out: Any) -> Any:
        if self._mask is None:
            return grad_out
        gx = self.buffer("gx", grad_out.shape, grad_out.dtype)
        self.xp.multiply(grad_out, self._mask, out=gx)
        return gx

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        return MemoryDeclaration(input_shape, cached=[input_shape], workspace=[input_shape])

    def get_config(self) -> dict[str, Any]:
        return {"p": self.p, "seed": self.seed}

    def __repr__(self) -> str:
        return f"Dropout(p={self.p})"
