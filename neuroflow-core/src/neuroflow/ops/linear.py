"""Linear: y = x Wᵀ + b over the last dimension."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from neuroflow import random
from neuroflow.backends import blas_threads, kernels
from neuroflow.backends.reductions import sum_rows, sum_rows_call
from neuroflow.errors import ShapeError
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow.tensor import Tensor


class Linear(Operator):
    """Fully connected layer: ``weight`` (out, in), ``bias`` (out), as in PyTorch.

    Example::

        layer = Linear(784, 128)
        y = layer.forward(x)        # x: (batch, 784) -> y: (batch, 128)
        gx = layer.backward(gy)     # fills layer.weight.grad and layer.bias.grad
    """

    backward_reads_output = False

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype: Any = np.float32) -> None:
        super().__init__()
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"Linear needs positive sizes; got in={in_features}, out={out_features}")
        self.in_features, self.out_features, self.has_bias = int(in_features), int(out_features), bool(bias)
        bound = 1.0 / math.sqrt(in_features)
        rng = random.generator()
        self.weight = Tensor(rng.uniform(-bound, bound, (out_features, in_features)).astype(dtype), requires_grad=True)
        if bias:
            self.bias = Tensor(rng.uniform(-bound, bound, out_features).astype(dtype), requires_grad=True)
        self._x: Any = None

    def forward(self, x: Any) -> Any:
        self.check_input(x, (self.in_features,))
        flat = x.ndim == 2  # the common (batch, features) input needs no reshaping, in or out
        x2 = x if flat else x.reshape(-1, self.in_features)
        y = self.buffer("y", (x2.shape[0], self.out_features), x.dtype)
        fused = self.fused(kernels.LINEAR.name, x2) if self.has_bias else None
        if fused is not None:
            fused(x2, self.weight.data, self.bias.data, y)
        else:
            blas_threads.matmul(self.xp, x2, self.weight.data.T, out=y)
            if self.has_bias:
                y += self.bias.data
        object.__setattr__(self, "_x", x2)  # forward state, not a parameter or child: no bookkeeping
        return y if flat else y.reshape(*x.shape[:-1], self.out_features)

    def backward(self, grad_out: Any) -> Any:
        x2 = self._x
        if x2 is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        xp = self.xp
        g2 = grad_out if grad_out.ndim == 2 else grad_out.reshape(-1, self.out_features)
        if g2.shape != (x2.shape[0], self.out_features):
            raise ShapeError(f"{self!r}.backward got gradient of shape {grad_out.shape}; forward batch was {x2.shape[0]}")
        gx = None
        if self.needs_input_grad:  # before the weight gradient: a Trainer may apply the update as it arrives
            gx = self.buffer("gx", x2.shape, x2.dtype)
            blas_threads.matmul(xp, g2, self.weight.data, out=gx)
        both = self.weight.requires_grad and self.has_bias and self.bias.requires_grad
        fused = self.fused(kernels.LINEAR_WEIGHT_GRAD.name, g2) if both else None
        if fused is not None:
            (gw, add_w), (gb, add_b) = self.grad_target(self.weight, "gw"), self.grad_target(self.bias, "gb")
            fused(g2, x2, gw, gb)
            if add_w:
                self.accumulate_grad(self.weight, gw)
            if add_b:
                self.accumulate_grad(self.bias, gb)
        else:
            self._weight_and_bias_grads(xp, g2, x2)
        if gx is None or grad_out.ndim == 2:
            return gx
        return gx.reshape(*grad_out.shape[:-1], self.in_features)

    def _weight_and_bias_grads(self, xp: Any, g2: Any, x2: Any) -> None:
        if self.weight.requires_grad:
            gw, add = self.grad_target(self.weight, "gw")
            blas_threads.matmul(xp, g2.T, x2, out=gw)
            if add:
                self.accumulate_grad(self.weight, gw)
        if self.has_bias and self.bias.requires_grad:
            gb, add = self.grad_target(self.bias, "gb")
            sum_rows(xp, g2, out=gb)  # blocked: a batch of many rows keeps float32's digits
            if add:
                self.accumulate_grad(self.bias, gb)

    def replay_forward(self, x: Any, y: Any) -> list[Any] | None:
        if self.xp is not np or x.ndim != 2 or (self.has_bias and self.fused(kernels.LINEAR.name, x) is not None):
            return None
        calls = [blas_threads.matmul_call(x, self.weight.data.T, y)]
        if self.has_bias:
            calls.append(functools.partial(np.add, y, self.bias.data, out=y))
        return calls

    def replay_backward(self, grad_out: Any, grad_in: Any) -> list[Any] | None:
        x2, params = self._x, [self.weight] + ([self.bias] if self.has_bias else [])
        if self.xp is not np or grad_out.ndim != 2 or x2 is None or x2.ndim != 2:
            return None
        if len(params) == 2 and self.fused(kernels.LINEAR_WEIGHT_GRAD.name, grad_out) is not None:
            return None
        # gradients written whole into param.grad, as backward wrote them (none added into a kept sum)
        if not all(p.requires_grad and p.grad is not None and self.writes_whole_gradient(p) for p in params):
            return None
        calls: list[Any] = []
        if grad_in is not None:
            calls.append(blas_threads.matmul_call(grad_out, self.weight.data, grad_in))
        calls.append(blas_threads.matmul_call(grad_out.T, x2, self.weight.grad))
        if self.has_bias:
            calls.append(sum_rows_call(np, grad_out, out=self.bias.grad))
        return calls

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        if tuple(input_shape[-1:]) != (self.in_features,):
            raise ShapeError(f"{self!r} got input of shape {tuple(input_shape)}; expected (*, {self.in_features})")
        out = (*input_shape[:-1], self.out_features)
        return MemoryDeclaration(out, cached=[input_shape], workspace=[self.weight.shape])

    def get_config(self) -> dict[str, Any]:
        return {"in_features": self.in_features, "out_features": self.out_features, "bias": self.has_bias}

    def __repr__(self) -> str:
        return f"Linear({self.in_features}→{self.out_features})"
