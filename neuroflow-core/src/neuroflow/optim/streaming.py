"""Updates applied inside backward: the pool hands each whole gradient here the moment an op has produced it."""

from __future__ import annotations

from typing import Any

from neuroflow.buffers.flat import FlatParameters
from neuroflow.optim.base import Optimizer


class StreamedUpdates:
    """The pool's gradient sink while updates stream: one step of ``optimizer`` per gradient, as it arrives.

    ``streamed`` maps a parameter's id to its slice of the flat buffer, for
    the parameters whose ops write their gradient whole (a convolution's or
    linear layer's weight); those keep no gradient buffer. :meth:`begin`
    counts the step once its loss is known to be finite, :meth:`__call__` is
    what the pool calls, and :meth:`update_kept` applies the step to every
    other parameter once backward is over. The values are those of
    ``optimizer.step``.
    """

    def __init__(self, optimizer: Optimizer, flat: FlatParameters, streamed: dict[int, slice]) -> None:
        self.optimizer = optimizer
        self.flat = flat
        self.streamed = streamed
        self.lr = 0.0

    def begin(self, lr: float | None) -> None:
        """Count this step (a scheduler's ``lr``, or the optimizer's own) before backward starts."""
        self.lr = self.optimizer.begin_step(lr)

    def __call__(self, param: Any, gradient: Any) -> bool:
        """Apply this step's update to a streamed parameter; False for the others (their gradient is kept)."""
        view = self.streamed.get(id(param))
        if view is None:
            return False
        self.optimizer.update_slice(view, gradient, self.lr)
        return True

    def update_kept(self) -> None:
        """After backward: the update of every parameter whose gradient was kept (BatchNorm's, biases added into)."""
        for p, view in zip(self.flat.params, self.flat.slices):
            if id(p) not in self.streamed and p.grad is not None:
                self.optimizer.update_slice(view, p.grad, self.lr)
