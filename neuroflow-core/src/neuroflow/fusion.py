"""Activation fusion: a Sequential runs a ReLU inside the op next to it when that op applies it as it writes.

Some ops take ``activation="relu"`` and apply max(·, 0) to their output in the
same pass (vision's BatchNorm2d and MaxPool2d). A model written the PyTorch way
(Conv2d → BatchNorm2d → ReLU, or Conv2d → ReLU → MaxPool2d) would spend a
separate ReLU's passes and buffers on it; :func:`fuse` lets each Sequential run
such a pair as one op instead, with the same values and gradients:

* an op that lists ``"relu"`` in ``absorbs_activation_after`` applies the ReLU
  that follows it (BatchNorm2d → ReLU, MaxPool2d → ReLU);
* an op that lists it in ``absorbs_activation_before`` commutes with it and
  applies the ReLU that precedes it to its own output: relu∘max = max∘relu,
  and the gradient reaches the same input (ReLU → MaxPool2d).

The model itself is not changed: its layers, configuration and saved files stay
what the user wrote, and the op is given the activation only for the duration
of each call. Measured on the small CNN of ``benchmarks/cnn.py`` (conv, ReLU,
max-pool twice): the planned arena shrinks by a ReLU output and a ReLU gradient
per pair.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from neuroflow.composites import Sequential
from neuroflow.operator import Operator
from neuroflow.ops.activations import ReLU


class ActivationFused(Operator):
    """``op`` run with ``activation`` applied to its output, in place of ``op`` and an activation layer."""

    def __init__(self, op: Operator, activation: str, absorbed: Operator) -> None:
        super().__init__()
        self.op = op
        self.activation = activation
        object.__setattr__(self, "absorbed", absorbed)  # not a child: the model runs it no more, but still owns it
        object.__setattr__(self, "_pool", op.buffer_pool)  # where the op runs, without moving its parameters again
        object.__setattr__(self, "_backend", op.placed_on)

    @property
    def backward_reads_input(self) -> bool:  # type: ignore[override]
        return self.op.backward_reads_input

    backward_reads_output = True  # the activation's mask is the output

    @property
    def needs_input_grad(self) -> bool:  # type: ignore[override]
        return self.op.needs_input_grad

    @contextmanager
    def _activated(self) -> Iterator[None]:
        saved = self.op.__dict__.get("activation")
        object.__setattr__(self.op, "activation", self.activation)
        try:
            yield
        finally:
            object.__setattr__(self.op, "activation", saved)

    def forward(self, x: Any) -> Any:
        with self._activated():
            return self.op.forward(x)

    def backward(self, grad_out: Any) -> Any:
        with self._activated():
            return self.op.backward(grad_out)

    def writes_output_again(self) -> bool:
        return self.op.writes_output_again()

    def write_output_again(self) -> Any:
        with self._activated():
            return self.op.write_output_again()

    def input_keeper(self) -> Operator | None:
        return self.op.input_keeper()

    def memory_declaration(self, input_shape: tuple[int, ...]) -> Any:
        with self._activated():
            return self.op.memory_declaration(input_shape)

    @property
    def affine_in_eval(self) -> bool:
        return bool(getattr(self.op, "affine_in_eval", False))

    def inference_affine(self, dtype: Any) -> Any:
        """The op's affine map, with the activation it is run with (see :mod:`neuroflow.folding`)."""
        with self._activated():
            return self.op.inference_affine(dtype)  # type: ignore[attr-defined]

    def layout_options(self) -> Any:
        """The op's (see :mod:`neuroflow.layout_pass`): the activation runs in whatever layout the op writes."""
        ask = getattr(self.op, "layout_options", None)
        return ask() if callable(ask) else None

    def with_layout(self, input_layout: str | None, output_layout: str | None) -> Any:
        return self.op.with_layout(input_layout, output_layout)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"ActivationFused({self.op!r}, {self.activation!r})"


def activation_of(layer: Operator) -> str | None:
    """The name ops know ``layer`` by when it is a plain activation they can absorb ("relu"), else None."""
    return "relu" if type(layer) is ReLU else None


def _absorbs(op: Operator, activation: str, side: str) -> bool:
    return activation in getattr(op, side) and getattr(op, "activation", "unset") is None


def fused_layers(layers: Sequence[Operator]) -> list[Operator]:
    """``layers`` with every activation an adjacent op can absorb run inside that op.

    The first layer is never absorbed into the next: it is the one the runtime
    tells that its input needs no gradient.
    """
    run: list[Operator] = []
    for i, layer in enumerate(layers):
        previous = run[-1] if run else None
        activation = activation_of(layer)
        if activation and previous is not None and _absorbs(previous, activation, "absorbs_activation_after"):
            run[-1] = ActivationFused(previous, activation, layer)
            continue
        before = activation_of(previous) if previous is not None else None
        if before and i >= 2 and _absorbs(layer, before, "absorbs_activation_before"):
            run[-1] = ActivationFused(layer, before, previous)  # type: ignore[arg-type]
            continue
        run.append(layer)
    return run


def fuse(model: Operator) -> int:
    """Let every Sequential in ``model`` run absorbable activations inside their neighbours; returns how many.

    Idempotent; a Sequential whose layers change afterwards runs its layers as they are.
    """
    fused = 0
    for module in model.modules():
        if isinstance(module, Sequential):
            run = fused_layers(module.layers)
            module.run_as(run)
            fused += len(module.layers) - len(run)
    return fused
