"""INT8 weight quantization for model files: symmetric, per output channel, float16 scales.

A weight ``W`` (first axis = output channels: Linear (out, in), Conv2d
(out, in/groups, kh, kw)) is stored as ``q = round(W / s)`` in [-127, 127]
with ``s[c]`` the float16 at or just above ``max|W[c]| / 127`` (float32 when
a step falls outside float16's normal range). Rounding the step up keeps every
``|q|`` within 127 and costs at most 2^-10 of a step. The other float tensors
(biases, normalisation parameters, running statistics) are stored as float16
when their values fit its range: relative error at most 2^-11, against INT8's
up to 1/254 of a channel's largest weight. Saving checks the round trip of
every tensor it changes, INT8 weights within half a step (``s[c] / 2``),
float16 within float16 rounding, and the report gives the error per tensor.

Where the bytes of an INT8 file go, NeuroFlow-CNN (61,042 parameters; the float32 file is 254.7 kB):
59.8 kB of INT8 weights, 2.1 kB of float16 scales, 4.2 kB of float16 for the
2,098 other values, 8.8 kB of header (tensor table, topology, checksums). With
float32 scales and float32 for the rest, the file was 81.2 kB (0.32 of float32);
it is 74.9 kB (0.29) now.

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
    """``(q, scale)``: int8 values of ``weight``'s shape and one scale per output channel (axis 0).

    The scales are float16 rounded up from ``max|W[c]| / 127`` when every one is a normal float16,
    float32 otherwise; ``q`` is rounded against the scales as stored.
    """
    rows = weight.reshape(weight.shape[0], -1)
    amax = np.max(np.abs(rows), axis=1).astype(np.float32)
    scale = amax / np.float32(QMAX)
    scale[scale == 0] = 1.0  # an all-zero channel: any scale gives zeros back
    half = scale.astype(np.float16)
    low = half.astype(np.float32) < scale
    half[low] = np.nextafter(half[low], np.float16(np.inf))
    if np.isfinite(half).all() and (half >= np.finfo(np.float16).smallest_normal).all():
        scale = half  # normal float16: a step at most 2^-10 above the ideal one, half the bytes
    q = np.rint(rows / scale[:, None].astype(rows.dtype))
    np.clip(q, -QMAX, QMAX, out=q)
    return q.astype(np.int8).reshape(weight.shape), scale


def dequantize_int8(q: np.ndarray, scale: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Write ``q · scale`` (per output channel) into the float array ``out`` of ``q``'s shape; returns ``out``.

    The product is computed in ``out``'s dtype (float16 scales times int8 in float16 would round it).
    """
    rows = q.shape[0]
    np.multiply(q.reshape(rows, -1), scale.reshape(rows, 1), out=out.reshape(rows, -1), dtype=out.dtype)
    return out


def to_float16(array: np.ndarray) -> np.ndarray | None:
    """``array`` as float16 when it is a wider float whose values all fit float16's range, else None."""
    if array.dtype.kind != "f" or array.dtype.itemsize <= 2 or array.size == 0:
        return None
    if not np.isfinite(array).all() or np.abs(array).max() > np.finfo(np.float16).max:
        return None
    return array.astype(np.float16)


@dataclass(frozen=True)
class TensorQuantization:
    """The round-trip error of one tensor stored with less precision."""

    name: str
    shape: tuple[int, ...]
    max_abs_error: float
    max_abs_value: float
    relative_error: float  # ‖W − Ŵ‖₂ / ‖W‖₂


@dataclass(frozen=True)
class QuantizationReport:
    """What quantizing a model did to its tensors, measured at save time.

    ``tensors`` are the weights stored as INT8, ``float16`` the other float
    tensors stored as float16, ``kept_float`` those stored exactly as they
    were. ``max_abs_error`` is the largest |W − Ŵ| and ``max_relative_error``
    the largest per-tensor ‖W − Ŵ‖₂ / ‖W‖₂, over both INT8 and float16 tensors.
    """

    scheme: str
    tensors: tuple[TensorQuantization, ...]
    kept_float: tuple[str, ...]
    float16: tuple[TensorQuantization, ...] = ()

    @property
    def max_abs_error(self) -> float:
        return max((t.max_abs_error for t in self.tensors + self.float16), default=0.0)

    @property
    def max_relative_error(self) -> float:
        return max((t.relative_error for t in self.tensors + self.float16), default=0.0)

    def __str__(self) -> str:
        lines = [f"{self.scheme} quantization: {len(self.tensors)} weights as INT8, {len(self.float16)} tensors "
                 f"as float16, {len(self.kept_float)} kept as they were",
                 f"{'tensor':<32} {'stored':<7} {'shape':<18} {'max |err|':>10} {'max |w|':>10} {'rel. L2':>9}"]
        for stored, rows in (("int8", self.tensors), ("float16", self.float16)):
            for t in rows:
                lines.append(f"{t.name:<32} {stored:<7} {str(t.shape):<18} {t.max_abs_error:>10.3g} "
                             f"{t.max_abs_value:>10.3g} {t.relative_error:>9.2%}")
        lines.append(f"worst: max |err| {self.max_abs_error:.3g}, relative L2 {self.max_relative_error:.2%}")
        return "\n".join(lines)


def quantize_weights(
    state: dict[str, np.ndarray], parameters: set[str]
) -> tuple[dict[str, np.ndarray], dict[str, str], QuantizationReport]:
    """Quantize the quantizable ``parameters`` of ``state`` to INT8 and the other float tensors to float16.

    Returns the tensors to store (INT8 weights, their ``name::scale``, the
    float16 tensors and the untouched rest), the map weight name → scale name,
    and the report. Refuses non-finite weights and checks every value came
    back within half a step (INT8) or float16 rounding.
    """
    stored: dict[str, np.ndarray] = {}
    scales: dict[str, str] = {}
    rows: list[TensorQuantization] = []
    halves: list[TensorQuantization] = []
    kept: list[str] = []
    for name, array in state.items():
        if name in parameters and quantizable(array):
            q, scale, back = _quantized(name, array)
            rows.append(_error_row(name, array, back))
            stored[name], stored[scale_name(name)], scales[name] = q, scale, scale_name(name)
        elif (half := to_float16(array)) is not None:
            back = half.astype(array.dtype)
            # IEEE rounding to nearest: within 2^-11 of each value, 2^-25 for float16's subnormals.
            if (np.abs(back - array) > np.abs(array) * 2.0**-11 + 2.0**-25).any():
                raise CheckpointError(f"float16 round trip of {name!r} is off by more than its rounding; not saving it")
            halves.append(_error_row(name, array, back))
            stored[name] = half
        else:
            stored[name] = array
            kept.append(name)
    return stored, scales, QuantizationReport(SCHEME, tuple(rows), tuple(kept), tuple(halves))


def _quantized(name: str, array: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """INT8 values, scales and values read back of one weight, its round trip checked to half a step per channel."""
    if not np.isfinite(array).all():
        raise CheckpointError(f"cannot quantize {name!r}: it holds NaN or infinite values")
    q, scale = quantize_int8(array)
    back = dequantize_int8(q, scale, np.empty(array.shape, array.dtype))
    error = np.abs(back - array)
    worst = error.reshape(len(scale), -1).max(axis=1)
    # Half a step, plus the float32 rounding of w / s and q · s (a few ulps, far below 1e-4 of a step);
    # more would be a quantizer bug.
    if (worst > scale.astype(np.float64) * (0.5 + 1e-4)).any():
        raise CheckpointError(f"INT8 round trip of {name!r} is off by more than half a step; not saving it")
    return q, scale, back


def _error_row(name: str, array: np.ndarray, back: np.ndarray) -> TensorQuantization:
    error = (back.astype(np.float64) - array).reshape(-1)
    norm = float(np.linalg.norm(array.reshape(-1)))
    return TensorQuantization(name, tuple(array.shape), float(np.abs(error).max()), float(np.abs(array).max()),
                              float(np.linalg.norm(error)) / norm if norm else 0.0)


def scale_name(name: str) -> str:
    """The stored name of a quantized weight's scales (``::`` never occurs in a parameter path)."""
    return f"{name}::scale"
