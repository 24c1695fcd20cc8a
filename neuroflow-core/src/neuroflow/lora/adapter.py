"""LoRA adapters: a frozen layer plus a trainable low-rank update, ``y = base(x) + (alpha/rank)·B(A(dropout(x)))``.

``A`` (rank, in, …) is a copy of the wrapped layer with ``rank`` outputs and no
bias, so one adapter serves every layer type whose weight is
``(out, in/groups, kh, kw)``-shaped: for a Linear it is ``x Aᵀ``, for a
Conv2d a convolution with the base's kernel, stride and padding. ``B``
(out, rank) mixes the ``rank`` channels back to ``out`` (PEFT's ``lora_B`` of
a Conv2d is the same matrix as a 1×1 kernel, ``(out, rank, 1, 1)``). ``A``
starts Kaiming-uniform and ``B`` at zero, so an adapted model starts out
computing exactly what the base did.

The base's weight and bias are frozen (``requires_grad=False``): the Trainer
packs no gradient or optimizer state for them, the memory planner counts none,
and their backward computes only the input gradient, never the weight GEMM.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from neuroflow import random
from neuroflow.backends import blas_threads
from neuroflow.checkpoint.topology import register_children
from neuroflow.errors import NeuroFlowError
from neuroflow.operator import MemoryDeclaration, Operator
from neuroflow.ops.dropout import Dropout
from neuroflow.ops.linear import Linear
from neuroflow.tensor import Tensor


class LoRAError(NeuroFlowError, ValueError):
    """LoRA cannot be applied, fused or unfused as asked (wrong targets, quantized weights, no adapters)."""


#: The owner of a hand-off whose only purpose is to end a buffer's planned lifetime (see ``_last_use``).
_NOBODY = object()


def _last_use(pool: Any, array: Any) -> None:
    """Tell a tracing pool that ``array`` (an op's output) is read for the last time now.

    A traced buffer otherwise lives until its owner's backward has run; the
    low-rank update is dead once added to the base output, and an
    activation-sized buffer held for the whole step would cost as much as
    the layer's output itself.
    """
    if pool is not None and pool.tracing:
        pool.handoff(None, array, _NOBODY)
        pool.release(array)


def _weight_of(op: Operator) -> Tensor:
    """``op``'s own parameter ``weight`` (:meth:`LoRAAdapter.refuses` checks that it has one)."""
    return dict(op.named_parameters())["weight"]


class UpProjection(Operator):
    """The adapter's ``B``: maps ``rank`` channels to ``out`` along ``axis`` (1 for NCHW maps, else the last)."""

    def __init__(self, rank: int, out: int, axis: int, dtype: Any) -> None:
        super().__init__()
        self.rank, self.out, self.axis = int(rank), int(out), int(axis)
        self.weight = Tensor(np.zeros((out, rank), dtype=dtype), requires_grad=True)
        self._z: Any = None

    def forward(self, z: Any) -> Any:
        xp, w = self.xp, self.weight.data
        self._z = z
        if self.axis == 1:
            n = z.shape[0]
            y = self.buffer("y", (n, self.out, math.prod(z.shape[2:])), z.dtype)
            blas_threads.matmul(xp, w, z.reshape(n, self.rank, -1), out=y)
            return y.reshape(n, self.out, *z.shape[2:])
        z2 = z.reshape(-1, self.rank)
        y = self.buffer("y", (z2.shape[0], self.out), z.dtype)
        blas_threads.matmul(xp, z2, w.T, out=y)
        return y.reshape(*z.shape[:-1], self.out)

    def backward(self, grad_out: Any) -> Any:
        z = self._z
        if z is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        xp, w = self.xp, self.weight.data
        gw = self.buffer("gw", w.shape, z.dtype)
        if self.axis == 1:
            n = z.shape[0]
            z3, g3 = z.reshape(n, self.rank, -1), grad_out.reshape(n, self.out, -1)
            per_sample = self.buffer("gw_per_sample", (n, self.out, self.rank), z.dtype)
            blas_threads.matmul(xp, g3, z3.transpose(0, 2, 1), out=per_sample)
            xp.sum(per_sample, axis=0, out=gw)
            gz = self.buffer("gx", z3.shape, z.dtype)
            blas_threads.matmul(xp, w.T, g3, out=gz)
        else:
            z2, g2 = z.reshape(-1, self.rank), grad_out.reshape(-1, self.out)
            blas_threads.matmul(xp, g2.T, z2, out=gw)
            gz = self.buffer("gx", z2.shape, z.dtype)
            blas_threads.matmul(xp, g2, w, out=gz)
        self.accumulate_grad(self.weight, gw)
        return gz.reshape(z.shape)

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        shape = list(input_shape)
        shape[self.axis] = self.out
        return MemoryDeclaration(tuple(shape), cached=[tuple(input_shape)], workspace=[self.weight.shape])

    def get_config(self) -> dict[str, Any]:
        return {"rank": self.rank, "out": self.out, "axis": self.axis}

    def __repr__(self) -> str:
        return f"UpProjection({self.rank}→{self.out})"


class LoRAAdapter(Operator):
    """A frozen ``base`` layer plus a trainable low-rank update; subclasses say which layers they wrap.

    Parameter names: the base's keep the names they had (``0.weight``,
    ``0.bias``, not ``0.base.weight``), and the adapter adds ``lora_A``
    (rank, in, …) and ``lora_B`` (out, rank). So the adapted model's
    state_dict is the original's plus the adapters, base weights load into it
    by their original names, and a fused model's state_dict is exactly the
    original's (PyTorch, PEFT's ``merge_and_unload``).
    """

    #: The constructor argument of the base's class that gives its number of outputs.
    out_key = ""

    def __init__(self, base: Operator, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0,
                 seed: int | None = None) -> None:
        super().__init__()
        reason = self.refuses(base)
        if reason is not None:
            raise LoRAError(f"{type(self).__name__} cannot wrap {base!r}: {reason}")
        if isinstance(rank, bool) or not isinstance(rank, int | np.integer) or rank < 1:
            raise LoRAError(f"LoRA rank must be a positive integer; got {rank!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha > 0:
            raise LoRAError(f"LoRA alpha must be a positive number; got {alpha!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0.0 <= dropout < 1.0:
            raise LoRAError(f"LoRA dropout must be in [0, 1); got {dropout!r}")
        self.rank, self.alpha, self.dropout = int(rank), float(alpha), float(dropout)
        self.scaling = self.alpha / self.rank
        weight = _weight_of(base).data
        # What release_base() gives back when the adapter is fused.
        self.base_requires_grad = {name: p.requires_grad for name, p in base.named_parameters()}
        self.base_kept_columns = bool(getattr(base, "keep_columns", False))
        self.base = base
        self.freeze_base()
        if self.dropout > 0.0:
            self.lora_dropout = Dropout(self.dropout, seed=seed)
        down = type(base)(**{**base.get_config(), self.out_key: self.rank, "bias": False})
        fan_in = math.prod(weight.shape[1:])
        bound = 1.0 / math.sqrt(fan_in)  # Kaiming-uniform with a=√5, as PEFT initialises lora_A
        host = random.generator().uniform(-bound, bound, (self.rank, *weight.shape[1:]))
        _weight_of(down).data = host.astype(weight.dtype)
        self.lora_down = down
        self.lora_up = UpProjection(self.rank, weight.shape[0], self.channel_axis(base), weight.dtype)
        self._z: Any = None
        self.follow_base()

    def freeze_base(self) -> None:
        """Make the base read-only: no gradient buffers, and no work kept for a weight gradient."""
        for p in self.base.parameters():
            p.requires_grad = False
            p.grad = None
        # A convolution keeps its im2col columns from forward only for the weight gradient, which a frozen
        # base never computes (on ResNet-18 at batch 8, a quarter of the planned peak).
        if self.base_kept_columns:
            self.base.keep_columns = False

    def release_base(self) -> None:
        """Give the base back as it was before the adapter: its parameters trainable or not as they were."""
        for name, p in self.base.named_parameters():
            p.requires_grad = self.base_requires_grad.get(name, True)
        if self.base_kept_columns:
            self.base.keep_columns = True
        self.base.needs_input_grad = self.needs_input_grad
        self._z = None

    def follow_base(self) -> None:
        """Put the adapter's own parts on the base's backend and in its training mode."""
        base, backend = self.base, self.base.placed_on
        if backend is not self._backend and backend is not None:
            for child in self.children():
                if child is not base:
                    child.to(backend)
            object.__setattr__(self, "_backend", backend)
        self.train(base.training)

    # ------------------------------------------------------------------ what can be wrapped
    @classmethod
    def refuses(cls, base: Operator) -> str | None:
        """Why ``base`` cannot be wrapped by this adapter class, or None when it can."""
        weight = getattr(base, "weight", None)
        if not isinstance(weight, Tensor):
            return "it has no weight parameter"
        if weight.data.dtype.kind != "f":
            return f"its weight is {weight.data.dtype}, not floating point"
        if cls.out_key not in base.get_config():
            return f"its get_config() has no {cls.out_key!r} to build the rank-r copy from"
        return None

    @staticmethod
    def channel_axis(base: Operator) -> int:
        return -1

    def __getattr__(self, name: str) -> Any:
        # Called only for names the adapter lacks: it reads like the layer it wraps (in_features, weight,
        # kernel_size, …), so composites that inspect their children keep working once one is adapted.
        if name.startswith("_") or name == "base" or "base" not in self._children:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(self._children["base"], name)

    # ------------------------------------------------------------------ parameters
    @property
    def lora_A(self) -> Tensor:
        """(rank, in/groups, …): the weight of ``lora_down``, the base's rank-r copy."""
        return _weight_of(self.lora_down)

    @property
    def lora_B(self) -> Tensor:
        """(out, rank): the weight of ``lora_up``; starts at zero."""
        return self.lora_up.weight

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        yield from self.base.named_parameters(prefix)
        yield prefix + "lora_A", self.lora_A
        yield prefix + "lora_B", self.lora_B

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, Tensor]]:
        yield from self.base.named_buffers(prefix)

    @property
    def base_weight(self) -> Tensor:
        """The wrapped layer's weight, (out, in/groups, …)."""
        return _weight_of(self.base)

    def delta_weight(self) -> Any:
        """``(alpha/rank)·B·A`` in the base weight's shape, computed in float32 (float64 for a float64 base)."""
        w = self.base_weight.data
        dtype = np.promote_types(w.dtype, np.float32)
        a = self.lora_A.data.reshape(self.rank, -1).astype(dtype, copy=False)
        b = self.lora_B.data.astype(dtype, copy=False)
        return (blas_threads.matmul(self.xp, b, a) * dtype.type(self.scaling)).reshape(w.shape)

    # ------------------------------------------------------------------ computation
    def forward(self, x: Any) -> Any:
        y = self.base.forward(x)
        h = self.lora_dropout.forward(x) if self.dropout > 0.0 else x
        z = self.lora_down.forward(h)
        z *= self.scaling  # A's output is not read by A's backward; B's backward then sees the scaled input
        delta = self.lora_up.forward(z)
        y += delta  # the wrapped layers' backward reads their input, never their output
        _last_use(self._pool, delta)
        self._z = z
        return y

    def backward(self, grad_out: Any) -> Any:
        if self._z is None:
            raise RuntimeError(f"{self!r}.backward called before forward")
        pool = self._pool
        tracing = pool is not None and pool.tracing
        want_input = self.needs_input_grad
        gz = self.lora_up.backward(grad_out)
        if tracing:
            pool.handoff(None, gz, self.lora_up)
        gz *= self.scaling
        self.lora_down.needs_input_grad = want_input
        gh = self.lora_down.backward(gz)
        if tracing:
            pool.handoff(gz, gh, self.lora_down)
        if gh is not None and self.dropout > 0.0:
            g = self.lora_dropout.backward(gh)
            if tracing:
                pool.handoff(gh, g, self.lora_dropout)
            gh = g
        base = self.base
        base.needs_input_grad = want_input
        gx = None
        if want_input or any(p.requires_grad for p in base.parameters()):
            gx = base.backward(grad_out)
            if tracing:
                pool.handoff(None, gx, base)
        if gx is None:
            return None
        gx += gh  # the base's gradient buffer is ours to add into: the base does not read it again
        if tracing:
            pool.release(gh)
        return gx

    def memory_declaration(self, input_shape: tuple[int, ...]) -> MemoryDeclaration:
        out = self.base.output_shape(tuple(input_shape))
        return MemoryDeclaration(out, cached=[self.lora_down.output_shape(tuple(input_shape))], workspace=[out])

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"rank": self.rank, "alpha": self.alpha, "dropout": self.dropout}
        if self.dropout > 0.0:
            config["seed"] = self.lora_dropout.seed
        return config

    def __repr__(self) -> str:
        extra = f", dropout={self.dropout:g}" if self.dropout > 0.0 else ""
        return f"{type(self).__name__}({self.base!r}, rank={self.rank}, alpha={self.alpha:g}{extra})"


class LoRALinear(LoRAAdapter):
    """LoRA adapter around a Linear: ``y = x Wᵀ + b + (alpha/rank)·dropout(x) Aᵀ Bᵀ``, W and b frozen.

    Example::

        layer = LoRALinear(ops.Linear(784, 128), rank=8, alpha=16)
        y = layer.forward(x)          # equals the Linear's output until B is trained
        gx = layer.backward(gy)       # fills lora_A.grad and lora_B.grad only
    """

    out_key = "out_features"

    @classmethod
    def gradcheck_example(cls) -> tuple[Operator, list[Any], dict[str, Any]]:
        """For ``neuroflow gradcheck``: dropout on, B non-zero (at B = 0 the gradient of A is zero)."""
        rng = np.random.default_rng(0)
        op = cls(Linear(5, 3), rank=2, alpha=4.0, dropout=0.25, seed=0)
        op.lora_B.data[...] = rng.standard_normal(op.lora_B.shape)
        dropout = op.lora_dropout

        def reseed() -> None:  # the same mask on every forward, so finite differences see one function
            dropout.rng = np.random.default_rng(dropout.seed)

        return op, [rng.standard_normal((4, 5))], {"prepare": reseed}

    @classmethod
    def refuses(cls, base: Operator) -> str | None:
        if not isinstance(base, Linear):
            return f"it is a {type(base).__name__}, not a Linear"
        return super().refuses(base)


class LoRAConv2d(LoRAAdapter):
    """LoRA adapter around a dense 2-d convolution (weight (out, in, kh, kw), groups=1).

    ``A`` is a convolution with the base's geometry and ``rank`` output
    channels, ``B`` a 1×1 channel mix; works with any op that has that weight
    and an ``out_channels`` constructor argument, so the core needs no import
    of neuroflow-ops-vision.
    """

    out_key = "out_channels"

    @classmethod
    def refuses(cls, base: Operator) -> str | None:
        weight = getattr(base, "weight", None)
        if isinstance(weight, Tensor) and weight.data.ndim != 4:
            return f"its weight has shape {weight.shape}; expected (out, in, kh, kw)"
        groups = base.get_config().get("groups", 1)
        if groups != 1:
            return (f"it is a grouped convolution (groups={groups}), whose weights are too small for a low-rank "
                    "update to pay; leave it out of the targets")
        return super().refuses(base)

    @staticmethod
    def channel_axis(base: Operator) -> int:
        return 1 if getattr(base, "output_layout", "NCHW") == "NCHW" else -1


#: Adapter classes apply_lora chooses from, in order.
ADAPTERS: tuple[type[LoRAAdapter], ...] = (LoRALinear, LoRAConv2d)

# A model file saves the wrapped layer as the adapter's child and rebuilds it with cls(base, **config).
register_children(LoRAAdapter, lambda op: [op.base])  # type: ignore[attr-defined]
