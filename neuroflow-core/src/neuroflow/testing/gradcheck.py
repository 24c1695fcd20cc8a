"""Finite-difference gradient checks in float64 for any operator, inputs and parameters."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from neuroflow.operator import Operator


class GradcheckError(AssertionError):
    """An operator's backward disagrees with central finite differences."""


def as_tuple(value: Any) -> tuple[Any, ...]:
    """An op's outputs (or gradients) as a tuple: a single array becomes a 1-tuple."""
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def _run(op: Operator, inputs: Sequence[np.ndarray], prepare: Callable[[], None] | None) -> tuple[np.ndarray, ...]:
    if prepare is not None:
        prepare()
    return tuple(np.array(o, dtype=np.float64, copy=True) for o in as_tuple(op.forward(*inputs)))


def gradcheck(
    op: Operator,
    inputs: Sequence[np.ndarray] | np.ndarray,
    *,
    eps: float = 1e-6,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    max_checks: int = 64,
    seed: int = 0,
    prepare: Callable[[], None] | None = None,
    check_inputs: Sequence[bool] | None = None,
) -> None:
    """Check ``op.backward`` against central differences of ``op.forward``, in float64.

    The op and inputs are converted to float64. The scalar checked is
    Σ output·r for a fixed random ``r``. Up to ``max_checks`` elements of
    each input and each trainable parameter are perturbed. ``prepare`` runs
    before every forward (reseed a stochastic op there). Raises
    GradcheckError naming the tensor and element that disagree.
    """
    rng = np.random.default_rng(seed)
    op.astype(np.float64)
    xs = [np.array(x, dtype=np.float64, copy=True) for x in as_tuple(inputs)]
    if check_inputs is None:
        check_inputs = [True] * len(xs)
    params = [(name, p) for name, p in op.named_parameters() if p.requires_grad]
    for _, p in params:
        p.grad = None

    outputs = _run(op, xs, prepare)
    weights = [rng.standard_normal(o.shape) for o in outputs]
    grads = as_tuple(op.backward(*weights) if len(weights) > 1 else op.backward(weights[0]))
    if len(grads) != len(xs):
        raise GradcheckError(f"{op!r}.backward returned {len(grads)} gradients for {len(xs)} inputs")
    analytic_inputs = [np.array(g, dtype=np.float64, copy=True) for g in grads]
    analytic_params = {name: (np.zeros(p.shape) if p.grad is None else np.array(p.grad, dtype=np.float64)) for name, p in params}

    def objective() -> float:
        return float(sum(np.sum(o * w) for o, w in zip(_run(op, xs, prepare), weights)))

    def compare(label: str, array: np.ndarray, analytic: np.ndarray) -> None:
        if analytic.shape != array.shape:
            raise GradcheckError(f"{op!r}: gradient of {label} has shape {analytic.shape}; expected {array.shape}")
        flat = array.reshape(-1)
        count = flat.size
        picks = np.arange(count) if count <= max_checks else rng.choice(count, max_checks, replace=False)
        for i in picks:
            original = flat[i]
            flat[i] = original + eps
            plus = objective()
            flat[i] = original - eps
            minus = objective()
            flat[i] = original
            numeric = (plus - minus) / (2 * eps)
            got = analytic.reshape(-1)[i]
            if not abs(got - numeric) <= atol + rtol * abs(numeric):
                index = np.unravel_index(i, array.shape)
                raise GradcheckError(
                    f"{op!r}: gradient of {label} at {tuple(int(k) for k in index)} is {got:.8g}; "
                    f"finite differences give {numeric:.8g}"
                )

    for k, (x, g) in enumerate(zip(xs, analytic_inputs)):
        if check_inputs[k]:
            compare(f"input {k}", x, g)
    for name, p in params:
        compare(f"parameter {name!r}", p.data, analytic_params[name])
