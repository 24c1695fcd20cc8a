"""Elementwise activations: ReLU, LeakyReLU, Sigmoid, Tanh, GELU.

Each writes its output and its input gradient into op-owned buffers, so a
steady-state step allocates nothing, and caches one array for backward.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from neuroflow.backends import cpu_parallel, kernels
from neuroflow.errors import ShapeError
from neuroflow.layout_pass import ELEMENTWISE, LayoutOptions
from neuroflow.operator import MemoryDeclaration, Operator


class _Elementwise(Operator):
    """Shared plumbing: shape-preserving op that caches one array of the input's shape."""

    #: The name a backend's fused ``kernels.ACTIVATION_BACKWARD`` knows this activation by (None: no fused path).
    fused_name: str | None = None
    fused_slope = 0.0

    def __init__(self) -> None:
        super().__init__()
        self._cache: Any = None

    def forward(self, x: Any) -> Any:
        self.check_input(x)
        y = self.buffer("y", x.shape, x.dtype)
        object.__setattr__(self, "_cache", self._forward(x, y))  # forward state: no parameter bookkeeping
        return y

    #: Whether backward may write the input gradient over the cached array: true where the cache is the op's own
    #: output, which only its backward reads by then (every consumer's backward ran first).
    gradient_over_cache = False

    def backward(self, grad_out: Any) -> Any:
        if self._cache is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        if grad_out.shape != self._cache.shape:
            raise ShapeError(f"{self!r}.backward got gradient of shape {grad_out.shape}; expected {self._cache.shape}")
        # Under a pool (the Trainer, which reads the model's output before backward), the cached output is
        # dead after this call: the gradient takes its memory instead of a buffer of its own.
        if self.gradient_over_cache and self._pool is not None:
            gx = self._cache
        else:
            gx = self.buffer("gx", grad_out.shape, grad_out.dtype)
        fused = self.fused(kernels.ACTIVATION_BACKWARD.name, grad_out) if self.fused_name else None
        if fused is not None:
            fused(self._cache, grad_out, gx, self.fused_name, self.fused_slope)
        else:
            self._backward(grad_out, gx)
        return gx

    #: Whether :meth:`_forward` and :meth:`_backward` work on the arrays they are given and the cache alone (no
    #: buffer asked for per call), so that a replayed step may call them again (see :mod:`neuroflow.replay`).
    replays_as_written = False

    def replay_forward(self, x: Any, y: Any) -> list[Any] | None:
        if not self.replays_as_written or self.xp is not np:
            return None
        return [functools.partial(self._forward_again, x, y)]

    def _forward_again(self, x: Any, y: Any) -> None:
        """What forward computes and keeps, on arrays it was given before (a replayed step's)."""
        object.__setattr__(self, "_cache", self._forward(x, y))

    def replay_backward(self, grad_out: Any, grad_in: Any) -> list[Any] | None:
        fused = self.fused(kernels.ACTIVATION_BACKWARD.name, grad_out) if self.fused_name else None
        if not self.replays_as_written or self.xp is not np or fused is not None:
            return None
        return [functools.partial(self._backward, grad_out, grad_in)]  # the cache the replayed forward kept

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        return MemoryDeclaration(input_shape, cached=[input_shape])

    def layout_options(self) -> LayoutOptions:
        return ELEMENTWISE  # any layout in, the same out (see neuroflow.layout_pass)

    def _forward(self, x: Any, y: Any) -> Any:
        """Write the activation of ``x`` into ``y``; return what backward needs."""
        raise NotImplementedError

    def _backward(self, g: Any, gx: Any) -> None:
        """Write the input gradient for ``g`` into ``gx``."""
        raise NotImplementedError


class ReLU(_Elementwise):
    """max(x, 0); caches its output (positive where the input was)."""

    fused_name = "relu"
    backward_reads_input = False
    gradient_over_cache = True

    def _forward(self, x: Any, y: Any) -> Any:
        if self.xp is np and y.ndim:  # large maps: split between the cores (neuroflow.backends.cpu_parallel)
            cpu_parallel.ufunc(np.maximum, x, 0, out=y)
        else:
            self.xp.maximum(x, 0, out=y)
        return y

    def _backward(self, g: Any, gx: Any) -> None:
        # (y > 0) written as 1.0/0.0 into gx (over the cache, element by element) is a float mask without a
        # bool buffer, and the multiply needs no casting (which made numpy allocate temporaries). numpy's
        # comparison is vectorised; its sign is a branch per element, which ReLU's zeros make unpredictable:
        # 30 µs instead of 4 on a (64, 128) batch inside a training step
        xp, y = self.xp, self._cache

        def run(lo: int, hi: int) -> None:
            xp.greater(y[lo:hi], 0, out=gx[lo:hi])
            gx[lo:hi] *= g[lo:hi]

        if xp is np and gx.ndim:
            cpu_parallel.for_chunks(gx.shape[0], run, 3 * gx.size)
        else:
            xp.greater(y, 0, out=gx)
            gx *= g

    def replay_forward(self, x: Any, y: Any) -> list[Any] | None:
        if self.xp is not np or not y.ndim:
            return None
        if 2 * y.size < cpu_parallel.MIN_PARALLEL:  # what cpu_parallel.ufunc would call
            return [functools.partial(np.maximum, x, 0, out=y)]
        return [functools.partial(cpu_parallel.ufunc, np.maximum, x, 0, out=y)]

    def replay_backward(self, grad_out: Any, grad_in: Any) -> list[Any] | None:
        y = self._cache
        if self.xp is not np or not grad_in.ndim or self.fused(kernels.ACTIVATION_BACKWARD.name, grad_out) is not None:
            return None

        if 3 * grad_in.size < cpu_parallel.MIN_PARALLEL:  # what for_chunks would run, in one piece
            return [functools.partial(np.greater, y, 0, out=grad_in),
                    functools.partial(np.multiply, grad_in, grad_out, out=grad_in)]

        def run(lo: int, hi: int) -> None:  # backward's, on the arrays of the step recorded
            np.greater(y[lo:hi], 0, out=grad_in[lo:hi])
            grad_in[lo:hi] *= grad_out[lo:hi]

        return [functools.partial(cpu_parallel.for_chunks, grad_in.shape[0], run, 3 * grad_in.size)]


class LeakyReLU(_Elementwise):
    """x for x > 0, ``negative_slope`` · x otherwise."""

    backward_reads_output = False

    def __init__(self, negative_slope: float = 0.01) -> None:
        super().__init__()
        self.negative_slope = float(negative_slope)
        self.fused_name, self.fused_slope = "leaky_relu", self.negative_slope

    def _forward(self, x: Any, y: Any) -> Any:
        xp = self.xp
        xp.multiply(x, self.negative_slope, out=y)
        xp.maximum(x, y, out=y) if self.negative_slope <= 1 else xp.minimum(x, y, out=y)
        return x

    def _backward(self, g: Any, gx: Any) -> None:
        xp = self.xp
        slope = self.buffer("slope", g.shape, g.dtype)
        xp.greater(self._cache, 0, out=slope)
        slope *= 1.0 - self.negative_slope
        slope += self.negative_slope
        xp.multiply(g, slope, out=gx)

    def get_config(self) -> dict[str, Any]:
        return {"negative_slope": self.negative_slope}

    def __repr__(self) -> str:
        return f"LeakyReLU({self.negative_slope})"


class Sigmoid(_Elementwise):
    """1 / (1 + e⁻ˣ), computed as ½(1 + tanh(x/2)) so it never overflows."""

    fused_name = "sigmoid"
    backward_reads_input = False
    replays_as_written = True

    def _forward(self, x: Any, y: Any) -> Any:
        xp = self.xp
        xp.multiply(x, 0.5, out=y)
        xp.tanh(y, out=y)
        y += 1.0
        y *= 0.5
        return y

    def _backward(self, g: Any, gx: Any) -> None:
        y = self._cache
        self.xp.subtract(1.0, y, out=gx)
        gx *= y
        gx *= g


class Tanh(_Elementwise):
    """Hyperbolic tangent; caches its output."""

    fused_name = "tanh"
    backward_reads_input = False
    replays_as_written = True

    def _forward(self, x: Any, y: Any) -> Any:
        self.xp.tanh(x, out=y)
        return y

    def _backward(self, g: Any, gx: Any) -> None:
        y = self._cache
        self.xp.multiply(y, y, out=gx)
        self.xp.subtract(1.0, gx, out=gx)
        gx *= g


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class GELU(_Elementwise):
    """Gaussian error linear unit, tanh approximation (PyTorch's ``approximate='tanh'``).

    ½x(1 + tanh(√(2/π)(x + 0.044715x³))); caches the input.
    """

    backward_reads_output = False

    def _forward(self, x: Any, y: Any) -> Any:
        xp = self.xp
        t = self.buffer("t", x.shape, x.dtype)
        xp.multiply(x, x, out=t)
        t *= 0.044715
        t += 1.0
        t *= x
        t *= _SQRT_2_OVER_PI
        xp.tanh(t, out=t)
        xp.add(t, 1.0, out=y)
        y *= x
        y *= 0.5
        return x

    def _backward(self, g: Any, gx: Any) -> None:
        xp = self.xp
        x = self._cache
        t = self.buffer("t", x.shape, x.dtype)
        u = self.buffer("u", x.shape, x.dtype)
        # d/dx = ½(1+tanh(k)) + ½x(1-tanh²(k))·√(2/π)(1+3·0.044715x²), k = √(2/π)(x+0.044715x³)
        xp.multiply(x, x, out=u)
        xp.multiply(u, 0.044715, out=t)
        t += 1.0
        t *= x
        t *= _SQRT_2_OVER_PI
        xp.tanh(t, out=t)
        u *= 3 * 0.044715
        u += 1.0
        u *= _SQRT_2_OVER_PI
        u *= x
        xp.multiply(t, t, out=gx)
        xp.subtract(1.0, gx, out=gx)
        gx *= u
        gx += t
        gx += 1.0
        gx *= 0.5
        gx *= g
