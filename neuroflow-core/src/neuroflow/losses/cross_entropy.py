"""CrossEntropy: log-softmax and negative log-likelihood fused, for integer class labels."""

from __future__ import annotations

import math
from typing import Any

from neuroflow.backends import kernels
from neuroflow.backends.namespaces import array_namespace
from neuroflow.errors import ShapeError
from neuroflow.losses.base import Loss


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
        xp.subtract(pred, pred.max(axis=1, keepdims=True), out=z)
        rows = xp.arange(n)
        shifted_label = z[rows, target]
        shifted_mean = z.mean(axis=1) if self.label_smoothing else None
        xp.exp(z, out=z)
        sums = z.sum(axis=1, keepdims=True)
        z /= sums
        self._probs, self._labels = z, target
        if not n:
            return 0.0
        log_norm = xp.log(sums[:, 0])
        nll = float((log_norm - shifted_label).mean())
        if self.label_smoothing:
            smooth = float((log_norm - shifted_mean).mean())
            return (1.0 - self.label_smoothing) * nll + self.label_smoothing * smooth
        return nll

    @staticmethod
    def _check_labels(target: Any, c: int) -> None:
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
        g[xp.arange(n), labels] -= 1.0 - eps
        g *= scale / max(n, 1)
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
