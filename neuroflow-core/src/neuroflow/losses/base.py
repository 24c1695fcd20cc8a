"""The Loss interface: a scalar from predictions and targets, and its gradient."""

from __future__ import annotations

from typing import Any

from neuroflow.buffers.pool import BufferPool


class Loss:
    """``forward(pred, target) -> float`` (mean over the batch); ``backward(scale) -> dL/dpred``.

    ``scale`` multiplies the gradient: gradient accumulation passes each
    micro-batch's share of the large batch so the sum equals the large
    batch's mean gradient.
    """

    _pool: BufferPool | None = None
    xp: Any = None
    backend: Any = None  # set by the Trainer; its fused kernels replace the generic code where it has them

    def fused(self, name: str, like: Any) -> Any:
        """The backend's fused kernel ``name`` for arrays like ``like`` (``Backend.fused``), or None."""
        return None if self.backend is None else self.backend.fused(name, like)

    def forward(self, pred: Any, target: Any) -> float:
        raise NotImplementedError

    def backward(self, scale: float = 1.0) -> Any:
        raise NotImplementedError

    def __call__(self, pred: Any, target: Any) -> float:
        return self.forward(pred, target)

    def buffer(self, key: str, shape: tuple[int, ...], dtype: Any, xp: Any) -> Any:
        if self._pool is None:
            return xp.empty(shape, dtype)
        return self._pool.get(self, key, shape, dtype)

    def attach_pool(self, pool: BufferPool | None) -> None:
        self._pool = pool

    def predictions(self, output: Any) -> Any:
        """What ``Trainer.predict`` returns for a model output (the output itself by default)."""
        return output

    def get_config(self) -> dict[str, Any]:
        return {}
