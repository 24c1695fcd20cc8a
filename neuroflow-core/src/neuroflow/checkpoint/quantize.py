"""INT8 weight quantization for model files: symmetric, per output channel, float32 scales.

A weight ``W`` (first axis = output channels: Linear (out, in), Conv2d
(out, in/groups, kh, kw)) is stored as ``q = round(W / s)`` in [-127, 127]
with ``s[c] = max|W[c]| / 127``. Biases, normalisation parameters and buffers
(1-D) stay in their float dtype: they are a small share of the bytes and
sensitive to error. Saving checks the round trip: every value must come back
within half a step (``s[c] / 2``) and the report gives the error per tensor.

Loading dequantizes (``W = q · s``) into ordinary float parameters, rather
than keeping INT8 weights resident and dequantizing each layer's weights into
a shared scratch buffer at every forward. Measured with
``benchmarks/checkpoint.py`` (2-core machine, float32, eval forward):

=================  ==========  ===================  ====================  ==============
model              float MB    INT8 + scratch MB    dequantize all (ms)   forward (ms)
=================  ==========  ===================  ====================  ==============
MLP 784-128-64-10  0.44        0.51                 0.09                  0.21 (batch 64)
NeuroFlow-CNN      0.11        0.07                 0.12                  90 (batch 64)
ResNet-18 (CIFAR)  44.7        20.7                 32                    780 (batch 8)
=================  ==========  ===================  ====================  ==============

For the models NeuroFlow targets, INT8 residency saves nothing (the MLP: the
scratch for its largest layer outweighs the 3 bytes saved per weight) or
0.05 MB (the CNN); only ResNet-size models would gain (24 MB, at about 4 % of
a batch-8 forward). In exchange every op would need an inference-only INT8
path, the model could no longer be trained or fine-tuned, and numpy has no
INT8 matmul to win time back. So the file, the download and the disk are where
INT8 pays; the loaded model is an ordinary float model that trains, runs on
any backend and saves again (as float: it keeps a marker, see
:func:`neuroflow.checkpoint.quantization_of`, and is never quantized twice).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from neuroflow.checkpoint.errors import CheckpointError

SCHEME = "int8"
QMAX = 127


def quantizable(array: Any) -> bool:
    """Whether a parameter is quantized: a floating weight with an output-channel axis and more (ndim >= 2)."""
    return array.dtype.kind == "f" and array.ndim >= 2 and array.size > 0


def quantize_int8(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(q, scale)``: int8 values of ``weight``'s shape and float32 scales, one per output channel (axis 0)."""
    rows = weight.reshape(weight.shape[0], -1)
    amax = np.max(np.abs(rows), axis=1).astype(np.float32)
    scale = amax / np.float32(QMAX)
    scale[scale == 0] = 1.0  # an all-zero channel: any scale gives zeros back
    q = np.rint(rows / scale[:, None].astype(rows.dtype))
    np.clip(q, -QMAX, QMAX, out=q)
    return q.astype(np.int8).reshape(weight.shape), scale


def dequantize_int8(q: np.ndarray, scale: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Write ``q · scale`` (per output channel) into the float array ``out`` of ``q``'s shape; returns ``out``."""
    rows = q.shape[0]
    np.multiply(q.reshape(rows, -1), scale.reshape(rows, 1), out=out.reshape(rows, -1), casting="unsafe")
    return out


@dataclass(frozen=True)
class TensorQuantization:
    """The round-trip error of one quantized tensor."""

    name: str
    shape: tuple[int, ...]
    max_abs_error: float
    max_abs_value: float
    relative_error: float  # ‖W − Ŵ‖₂ / ‖W‖₂


@dataclass(frozen=True)
class QuantizationReport:
    """What quantizing a model did to its weights, measured at save time.

    ``max_abs_error`` is the largest |W − Ŵ| over all quantized weights;
    ``max_relative_error`` the largest per-tensor ‖W − Ŵ‖₂ / ‖W‖₂.
    """

    scheme: str
    tensors: tuple[TensorQuantization, ...]
    kept_float: tuple[str, ...]

    @property
    def max_abs_error(self) -> float:
        return max((t.max_abs_error for t in self.tensors), default=0.0)

    @property
    def max_relative_error(self) -> float:
        return max((t.relative_error for t in self.tensors), default=0.0)

    def __str__(self) -> str:
        lines = [f"{self.scheme} quantization: {len(self.tensors)} weights quantized, "
                 f"{len(self.kept_float)} tensors kept in float",
                 f"{'tensor':<32} {'shape':<18} {'max |err|':>10} {'max |w|':>10} {'rel. L2':>9}"]
        for t in self.tensors:
            lines.append(f"{t.name:<32} {str(t.shape):<18} {t.max_abs_error:>10.3g} "
                         f"{t.max_abs_value:>10.3g} {t.relative_error:>9.2%}")
        lines.append(f"worst: max |err| {self.max_abs_error:.3g}, relative L2 {self.max_relative_error:.2%}")
        return "\n".join(lines)


def quantize_weights(
    state: dict[str, np.ndarray], parameters: set[str]
) -> tuple[dict[str, np.ndarray], dict[str, str], QuantizationReport]:
    """Quantize the quantizable ``parameters`` of ``state``.

    Returns the tensors to store (INT8 weights, their ``name::scale`` and the
    untouched rest), the map weight name → scale name, and the report.
    Refuses non-finite weights and checks every value came back within half a step.
    """
    stored: dict[str, np.ndarray] = {}
    scales: dict[str, str] = {}
    rows: list[TensorQuantization] = []
    kept: list[str] = []
    for name, array in state.items():
        if name not in parameters or not quantizable(array):
            stored[name] = array
            kept.append(name)
            continue
        if not np.isfinite(array).all():
            raise CheckpointError(f"cannot quantize {name!r}: it holds NaN or infinite values")
        q, scale = quantize_int8(array)
        error = dequantize_int8(q, scale, np.empty(array.shape, array.dtype))
        error -= array
        np.abs(error, out=error)
        worst = error.reshape(len(scale), -1).max(axis=1)
        # Half a step, plus the float32 rounding of w / s and q · s (a few ulps, far below 1e-4 of a step);
        # more would be a quantizer bug.
        if (worst > scale * (0.5 + 1e-4)).any():
            raise CheckpointError(f"INT8 round trip of {name!r} is off by more than half a step; not saving it")
        norm = float(np.linalg.norm(array.reshape(-1)))
        rows.append(TensorQuantization(
            name, tuple(array.shape), float(worst.max()), float(np.abs(array).max()),
            float(np.linalg.norm(error.reshape(-1))) / norm if norm else 0.0,
        ))
        stored[name] = q
        stored[scale_name(name)] = scale
        scales[name] = scale_name(name)
    return stored, scales, QuantizationReport(SCHEME, tuple(rows), tuple(kept))


def scale_name(name: str) -> str:
    """The stored name of a quantized weight's scales (``::`` never occurs in a parameter path)."""
    return f"{name}::scale"
