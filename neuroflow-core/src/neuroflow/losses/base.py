"""The Loss interface: a scalar from predictions and targets, and its gradient."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuroflow.buffers.pool import BufferPool
from neuroflow.buffers.trace import TracingPool

if TYPE_CHECKING:
    from neuroflow.losses.evaluation import Evaluator


class Loss:
    """``forward(pred, target) -> float`` (mean over the batch); ``backward(scale) -> dL/dpred``.

    ``scale`` multiplies the gradient: gradient accumulation passes each
    micro-batch's share of the large batch so the sum equals the large
    batch's mean gradient.
    """

    _pool: BufferPool | TracingPool | None = None
    xp: Any = None
    backend: Any = None  # where :meth:`to` placed it; its fused kernels replace the generic code where it has them

    def to(self, backend: Any) -> Loss:
        """Compute on ``backend``: its fused kernels (softmax-cross-entropy) replace the generic code."""
        self.backend = backend
        return self

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

    @property
    def buffer_pool(self) -> BufferPool | TracingPool | None:
        """The buffer pool :meth:`attach_pool` gave this loss, or None."""
        return self._pool

    def attach_pool(self, pool: BufferPool | TracingPool | None) -> None:
        self._pool = pool

    def predictions(self, output: Any) -> Any:
        """What ``Trainer.predict`` returns for a model output (the output itself by default)."""
        return output

    def evaluator(self) -> Evaluator | None:
        """A new :class:`~neuroflow.losses.evaluation.Evaluator` whose metrics ``Trainer.evaluate`` adds to the
        mean loss (a detector's mAP@0.5), or None (the default: the loss, and accuracy for classification)."""
        return None

    def example_target(self, output: Any, xp: Any) -> Any:
        """A target this loss accepts for ``output``, on ``xp``: what ``nf.memory.profile`` traces a step with (the
        batch's buffers must not depend on the values). Zeros of the output's shape by default."""
        return xp.zeros(output.shape, dtype=output.dtype)

    def get_config(self) -> dict[str, Any]:
        return {}
