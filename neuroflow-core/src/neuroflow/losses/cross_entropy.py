"""CrossEntropy: log-softmax and negative log-likelihood fused, for integer class labels."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from neuroflow.backends import kernels
from neuroflow.backends.namespaces import array_namespace
from neuroflow.errors import ShapeError
from neuroflow.losses.base import Loss

_UNSIGNED = {size: np.dtype(f"u{size}") for size in (1, 2, 4, 8)}


def _mean(xp: Any, a: Any) -> float:
    """``float(a.mean())`` for a 1-D array; on numpy the same arithmetic without ``mean``'s Python layer: the
    pairwise float sum, then divided by the count as numpy's mean divides (in double, rounded to the dtype)."""
    if xp is not np:
        return float(a.mean())
    total = np.add.reduce(a)
    return float(total.dtype.type(total / np.intp(a.shape[0])))


def _softmax_nll(xp: Any, pred: Any, target: Any, z: Any, rows: Any, row: Any) -> float:
    """Mean −log softmax(pred)[target] over n > 0 rows; the softmax left in ``z`` (``row``: an (n, 1) scratch)."""
    (np.maximum.reduce if xp is np else xp.max)(pred, axis=1, keepdims=True, out=row)  # numpy: no Python layer
    xp.subtract(pred, row, out=z)
    shifted_label = z[rows, target]
    xp.exp(z, out=z)
    sums = (np.add.reduce if xp is np else xp.sum)(z, axis=1, keepdims=True, out=row)  # the maxima are spent
    z /= sums
    log_norm = xp.log(sums[:, 0])
    xp.subtract(log_norm, shifted_label, out=log_norm)
    return _mean(xp, log_norm)


def _checked_softmax_nll(pred: Any, target: Any, z: Any, rows: Any, row: Any) -> float:
    """:func:`_softmax_nll` on numpy after ``CrossEntropy._check_labels``'s test; NaN for a label out of range."""
    if target.dtype.kind not in "iu" or int(np.maximum.reduce(target.view(_UNSIGNED[target.dtype.itemsize]),
                                                              axis=None)) >= z.shape[1]:
        return math.nan
    return _softmax_nll(np, pred, target, z, rows, row)


def _nll_gradient(g: Any, rows: Any, labels: Any, weight: float, factor: float) -> None:
    """The softmax in ``g`` less ``weight`` at each row's label, times ``factor``: the loss's gradient, in place."""
    g[rows, labels] -= weight
    g *= factor


class CrossEntropy(Loss):
    """Mean cross-entropy of logits (N, C) against integer labels (N,), with optional label smoothing.

    The gradient is ``softmax(logits) - target_distribution`` divided by N:
    the softmax is computed once in forward and reused, never differentiated
    through separately.
    """

    def __init__(self, label_smoothing: float = 0.0) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1); got {label_smoothing}")
        self.label_smoothing = float(label_smoothing)
        self._probs: Any = None
        self._labels: Any = None
        self._per_row: tuple[Any, Any, Any] | None = None

    def forward(self, pred: Any, target: Any) -> float:
        if getattr(pred, "ndim", 0) != 2:
            raise ShapeError(f"CrossEntropy got logits of shape {getattr(pred, 'shape', None)}; expected (batch, classes)")
        n, c = pred.shape
        target_shape = tuple(getattr(target, "shape", ()))
        if target_shape != (n,):
            raise ShapeError(f"CrossEntropy got labels of shape {target_shape}; expected ({n},) integer class indices")
        if target.dtype.kind not in "iu":
            raise ShapeError(f"CrossEntropy got labels of dtype {target.dtype}; expected integers in [0, {c})")
        xp = array_namespace(pred)
        z = self.buffer("z", pred.shape, pred.dtype, xp)
        fused = self.fused(kernels.SOFTMAX_CROSS_ENTROPY.name, pred) if n else None
        if fused is not None:
            # the kernel turns a bad label into a NaN loss, so the labels are read back only then
            row_loss = self.buffer("row_loss", (n,), pred.dtype, xp)
            value = float(fused(pred, target, z, row_loss, self.label_smoothing))
            if math.isnan(value):
                self._check_labels(target, c)
            self._probs, self._labels = z, target
            return value
        if n:
            self._check_labels(target, c)
        rows, row = self._rows(xp, n, pred.dtype)
        self._probs, self._labels = z, target
        if n and not self.label_smoothing:
            return _softmax_nll(xp, pred, target, z, rows, row)
        (np.maximum.reduce if xp is np else xp.max)(pred, axis=1, keepdims=True, out=row)  # numpy: no Python layer
        xp.subtract(pred, row, out=z)
        shifted_label = z[rows, target]
        shifted_mean = z.mean(axis=1) if self.label_smoothing else None
        xp.exp(z, out=z)
        sums = (np.add.reduce if xp is np else xp.sum)(z, axis=1, keepdims=True, out=row)
        z /= sums
        if not n:
            return 0.0
        log_norm = xp.log(sums[:, 0])
        smooth = _mean(xp, log_norm - shifted_mean)
        return (1.0 - self.label_smoothing) * _mean(xp, log_norm - shifted_label) + self.label_smoothing * smooth

    def replay_forward(self, pred: Any, target: Any) -> Any:
        """The loss of the forward just run, on the same arrays (see :mod:`neuroflow.replay`): NaN for a label out
        of range, so that the runtime runs the loss itself to say which; None where forward decides more per call."""
        probs, n = self._probs, len(target)
        if (array_namespace(pred) is not np or self.label_smoothing or not n or probs is None
                or self.fused(kernels.SOFTMAX_CROSS_ENTROPY.name, pred) is not None):
            return None
        rows, row = self._rows(np, n, pred.dtype)
        return functools.partial(_checked_softmax_nll, pred, target, probs, rows, row)

    def replay_backward(self, scale: float, grad: Any) -> list[Any] | None:
        """The calls the backward just run made (``grad`` is the probabilities it overwrote)."""
        if self.label_smoothing or self.fused(kernels.SOFTMAX_CROSS_ENTROPY_BACKWARD.name, grad) is not None:
            return None
        n = grad.shape[0]
        return [functools.partial(_nll_gradient, grad, self._rows(np, n, grad.dtype)[0], self._labels,
                                  1.0 - self.label_smoothing, scale / max(n, 1))]

    def _rows(self, xp: Any, n: int, dtype: Any) -> tuple[Any, Any]:
        """``xp.arange(n)`` (the rows the labels pick from) and an (n, 1) scratch of ``dtype`` for per-row
        values, made once per batch size, dtype and namespace: small, and not planned (as the temporaries
        they replace were not)."""
        held = self._per_row
        if held is None or held[0] is not xp or held[2].shape[0] != n or held[2].dtype != dtype:
            held = self._per_row = (xp, xp.arange(n), xp.empty((n, 1), dtype))
        return held[1], held[2]

    @staticmethod
    def _check_labels(target: Any, c: int) -> None:
        if isinstance(target, np.ndarray):
            # one reduction: read as unsigned, a negative label is larger than any class index
            unsigned = target.view(_UNSIGNED[target.dtype.itemsize])
            if int(np.maximum.reduce(unsigned, axis=None)) < c:
                return
        low, high = int(target.min()), int(target.max())
        if low < 0 or high >= c:
            raise ShapeError(f"CrossEntropy got labels outside [0, {c}): min {low}, max {high}")

    def backward(self, scale: float = 1.0) -> Any:
        probs, labels = self._probs, self._labels
        if probs is None:
            raise RuntimeError("CrossEntropy.backward called before forward (or twice for one forward)")
        n, c = probs.shape
        xp = array_namespace(probs)
        # The gradient overwrites the probabilities in place: nothing reads them after this.
        g, self._probs = probs, None
        fused = self.fused(kernels.SOFTMAX_CROSS_ENTROPY_BACKWARD.name, probs)
        if fused is not None:
            return fused(probs, labels, scale, self.label_smoothing)
        eps = self.label_smoothing
        if eps:
            g -= eps / c
        _nll_gradient(g, self._rows(xp, n, g.dtype)[0], labels, 1.0 - eps, scale / max(n, 1))
        return g

    def predictions(self, output: Any) -> Any:
        """Class probabilities: the softmax of the logits."""
        xp = array_namespace(output)
        z = output - output.max(axis=1, keepdims=True)
        xp.exp(z, out=z)
        z /= z.sum(axis=1, keepdims=True)
        return z

    def get_config(self) -> dict[str, Any]:
        return {"label_smoothing": self.label_smoothing}
