"""The Tensor: data, its gradient, and whether a gradient is wanted. Nothing else."""

from __future__ import annotations

from typing import Any


class Tensor:
    """A buffer of data with an optional gradient buffer of the same shape.

    A Tensor records no history: gradients are pulled through operators'
    explicit ``backward`` methods. Parameters are Tensors with
    ``requires_grad=True``; their ``grad`` buffers are owned by the runtime
    (the Trainer rebinds them to views of one flat buffer).
    """

    __slots__ = ("data", "grad", "requires_grad")

    def __init__(self, data: Any, grad: Any = None, requires_grad: bool = False) -> None:
        self.data = data
        self.grad = grad
        self.requires_grad = requires_grad

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> Any:
        return self.data.dtype

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def zero_grad(self) -> None:
        """Set the gradient to zero in place (allocating it on first use)."""
        if self.grad is None:
            self.grad = self.data * 0
        else:
            self.grad[...] = 0

    def __repr__(self) -> str:
        flag = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor(shape={self.shape}, dtype={self.dtype}{flag})"
