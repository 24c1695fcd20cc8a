"""MSE: mean squared error over every element."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from neuroflow.backends.namespaces import array_namespace
from neuroflow.errors import ShapeError
from neuroflow.losses.base import Loss


def _squared_error(xp: Any, pred: Any, target: Any, diff: Any) -> float:
    """mean((pred − target)²), the difference left in ``diff``."""
    xp.subtract(pred, target, out=diff)
    return float((diff * diff).mean()) if diff.size else 0.0


class MSE(Loss):
    """mean((pred − target)²); the gradient is 2(pred − target)/numel."""

    def __init__(self) -> None:
        self._diff: Any = None

    def forward(self, pred: Any, target: Any) -> float:
        if tuple(pred.shape) != tuple(target.shape):
            raise ShapeError(f"MSE got predictions of shape {tuple(pred.shape)} and targets of shape {tuple(target.shape)}; expected equal shapes")
        xp = array_namespace(pred)
        diff = self.buffer("diff", pred.shape, pred.dtype, xp)
        self._diff = diff
        return _squared_error(xp, pred, target, diff)

    def replay_forward(self, pred: Any, target: Any) -> Any:
        """The loss of the forward just run, on the same arrays (see :mod:`neuroflow.replay`)."""
        if array_namespace(pred) is not np or self._diff is None or not self._diff.size:
            return None
        return functools.partial(_squared_error, np, pred, target, self._diff)

    def replay_backward(self, scale: float, grad: Any) -> list[Any] | None:
        diff = self._diff
        return [functools.partial(np.multiply, diff, 2.0 * scale / max(diff.size, 1), out=grad)]

    def backward(self, scale: float = 1.0) -> Any:
        if self._diff is None:
            raise RuntimeError("MSE.backward called before forward")
        diff = self._diff
        xp = array_namespace(diff)
        g = self.buffer("g", diff.shape, diff.dtype, xp)
        xp.multiply(diff, 2.0 * scale / max(diff.size, 1), out=g)
        return g
