"""MSE: mean squared error over every element."""

from __future__ import annotations

from typing import Any

from neuroflow.backends.namespaces import array_namespace
from neuroflow.errors import ShapeError
from neuroflow.losses.base import Loss


class MSE(Loss):
    """mean((pred − target)²); the gradient is 2(pred − target)/numel."""

    def __init__(self) -> None:
        self._diff: Any = None

    def forward(self, pred: Any, target: Any) -> float:
        if tuple(pred.shape) != tuple(target.shape):
            raise ShapeError(f"MSE got predictions of shape {tuple(pred.shape)} and targets of shape {tuple(target.shape)}; expected equal shapes")
        xp = array_namespace(pred)
        diff = self.buffer("diff", pred.shape, pred.dtype, xp)
        xp.subtract(pred, target, out=diff)
        self._diff = diff
        return float((diff * diff).mean()) if diff.size else 0.0

    def backward(self, scale: float = 1.0) -> Any:
        if self._diff is None:
            raise RuntimeError("MSE.backward called before forward")
        diff = self._diff
        xp = array_namespace(diff)
        g = self.buffer("g", diff.shape, diff.dtype, xp)
        xp.multiply(diff, 2.0 * scale / max(diff.size, 1), out=g)
        return g
