"""The fused kernels an op may ask its backend for, each declared once: its name, its parameters, what it returns.

An op, loss or optimizer asks with ``self.fused(kernels.LINEAR.name, like)``
and runs its generic code on ``xp`` when the backend has no implementation.
A backend that speeds a kernel up registers its implementation against the
same declaration (:func:`implementations`), which refuses a kernel that is
not declared here and one whose parameters are not the declared ones. An
implementation writes into the caller's buffers (a steady-state step
allocates nothing) and agrees with the caller's generic code to float
rounding; arrays are the backend's, of the caller's dtype.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FusedKernel:
    """One fused kernel: the name callers ask for, its parameters in order, what it returns and computes.

    ``parameters`` lists the positional parameters, then ``"*"``, then the
    keyword-only ones (as a Python signature writes them).
    """

    name: str
    parameters: tuple[str, ...]
    returns: str
    computes: str

    def __str__(self) -> str:
        return f"{self.name}({', '.join(self.parameters)}) -> {self.returns}"


ADAM_UPDATE = FusedKernel(
    "adam_update",
    ("data", "grad", "m", "v", "*", "lr", "beta1", "beta2", "eps", "weight_decay", "decoupled", "step"), "None",
    "one Adam (AdamW when ``decoupled``) step number ``step`` (1-based) over the flat buffers, in place, "
    "as neuroflow.optim.Adam computes it",
)
SGD_UPDATE = FusedKernel(
    "sgd_update",
    ("data", "grad", "buf", "*", "lr", "momentum", "dampening", "nesterov", "weight_decay", "first"), "None",
    "one SGD step over the flat buffers, in place; ``buf`` is the momentum buffer (None without momentum), "
    "which the ``first`` step sets to the gradient (PyTorch's semantics)",
)
SOFTMAX_CROSS_ENTROPY = FusedKernel(
    "softmax_cross_entropy", ("logits", "labels", "probs", "row_loss", "smoothing"), "float",
    "the mean cross-entropy of ``logits`` (n, c) against integer ``labels`` (n,) with label smoothing; "
    "``probs`` receives the softmax, ``row_loss`` (n,) is a workspace; an out-of-range label reads no memory "
    "and makes the loss NaN",
)
SOFTMAX_CROSS_ENTROPY_BACKWARD = FusedKernel(
    "softmax_cross_entropy_backward", ("probs", "labels", "scale", "smoothing"), "probs",
    "the logits' gradient written over ``probs`` (the forward's softmax): (probs - target) · scale / n",
)
ACTIVATION_BACKWARD = FusedKernel(
    "activation_backward", ("cached", "g", "gx", "activation", "slope"), "gx",
    "``gx = g · act'`` for ``activation`` relu, sigmoid and tanh (``cached`` is the op's output) and "
    "leaky_relu (``cached`` is its input; ``slope`` its negative slope)",
)
LINEAR = FusedKernel(
    "linear", ("x", "weight", "bias", "out"), "out",
    "``out = x @ weight.T + bias`` for ``x`` (n, in), ``weight`` (out, in), ``bias`` (out,) and ``out`` (n, out)",
)
LINEAR_WEIGHT_GRAD = FusedKernel(
    "linear_weight_grad", ("g", "x", "gw", "gb"), "None",
    "``gw = g.T @ x`` and ``gb = g.sum(axis=0)`` for ``g`` (n, out) and ``x`` (n, in), into ``gw`` (out, in) "
    "and ``gb`` (out,)",
)

#: Every declared kernel by name.
DECLARED: dict[str, FusedKernel] = {kernel.name: kernel for kernel in (
    ADAM_UPDATE, SGD_UPDATE, SOFTMAX_CROSS_ENTROPY, SOFTMAX_CROSS_ENTROPY_BACKWARD, ACTIVATION_BACKWARD, LINEAR,
    LINEAR_WEIGHT_GRAD,
)}


def _parameters(function: Callable[..., Any]) -> tuple[str, ...]:
    """``function``'s parameters in :attr:`FusedKernel.parameters` form (a bound first argument already gone)."""
    names: list[str] = []
    for parameter in inspect.signature(function).parameters.values():
        if parameter.kind is parameter.KEYWORD_ONLY and "*" not in names:
            names.append("*")
        names.append(parameter.name)
    return tuple(names)


def implementations(backend: str, table: Mapping[FusedKernel, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """A backend's fused kernels by name, each checked against its declaration first.

    ``table`` maps declarations (``kernels.LINEAR``) to callables taking the
    declared parameters (with the backend's own first argument, such as its
    device, already bound). Raises ValueError, naming ``backend``, for a kernel
    not declared in this module or an implementation whose parameters differ.
    """
    found: dict[str, Callable[..., Any]] = {}
    for kernel, function in table.items():
        if DECLARED.get(kernel.name) != kernel:
            raise ValueError(f"backend {backend!r} registers fused kernel {kernel.name!r}, which is not declared in "
                             f"neuroflow.backends.kernels; declared: {', '.join(DECLARED)}")
        given = _parameters(function)
        if given != kernel.parameters:
            raise ValueError(f"backend {backend!r}: its {kernel.name} takes ({', '.join(given)}); the declaration "
                             f"is {kernel}")
        found[kernel.name] = function
    return found
