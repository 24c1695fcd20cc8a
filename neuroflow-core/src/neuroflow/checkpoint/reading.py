"""Reading a model file's tensors into the model rebuilt from it: one pass in file order, checked as it goes.

A stored tensor whose dtype is the parameter's own is read straight into the
parameter (which the rebuild left as untouched zeroed memory, see
:mod:`neuroflow.checkpoint.allocation_guard`): no intermediate copy. The others
(INT8 weights and their scales, another float width, bfloat16) are read into
arrays of their stored dtype and converted once every checksum has passed.
Each tensor's checksum is computed on the bytes just read into it. Large
files are read by several threads (reads and ``zlib.crc32`` release the GIL):
CRC-32 costs about as much as the read itself (45 MB of ResNet-18: 8 ms to
read, 11 to 18 ms to checksum on the 2-core machine of
``benchmarks/checkpoint.py``; 26 ms with one thread, 21 ms with two when the
second core was free, no gain when it was busy).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from neuroflow.checkpoint import container
from neuroflow.checkpoint.checksums import TensorVerifier
from neuroflow.checkpoint.container import TensorEntry
from neuroflow.checkpoint.quantize import dequantize_int8
from neuroflow.operator import Operator

if TYPE_CHECKING:
    from neuroflow.checkpoint.model_file import ModelFile

#: Bytes of tensors per reading thread: below it a thread costs more to start than it saves.
BYTES_PER_THREAD = 4 << 20
MAX_THREADS = 8


def reading_threads(size: int) -> int:
    """How many threads read ``size`` bytes of tensors: one per :data:`BYTES_PER_THREAD`, at most the usable cores and 8."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(size // BYTES_PER_THREAD, cores, MAX_THREADS))


def read_weights(model: Operator, opened: ModelFile) -> None:
    """Fill the model's parameters and buffers (host arrays) from the file; raise CheckpointError if a checksum fails."""
    stored = opened.header.tensors
    own = dict(model.named_parameters())
    own.update(model.named_buffers())
    plan: list[tuple[TensorEntry, np.ndarray]] = []
    conversions: list[Callable[[], None]] = []
    for name, tensor in own.items():
        entry, target = stored[name], tensor.data
        direct = isinstance(target, np.ndarray) and target.flags.c_contiguous and target.dtype == entry.dtype
        if name in opened.scales:
            q = np.empty(entry.shape, entry.dtype)
            scale_entry = stored[opened.scales[name]]
            scale = np.empty(scale_entry.shape, scale_entry.dtype)
            plan += [(entry, q), (scale_entry, scale)]
            conversions.append(_dequantizer(q, scale, target))
        elif direct:
            plan.append((entry, target))
        else:
            raw = np.empty(entry.shape, entry.dtype)
            plan.append((entry, raw))
            conversions.append(_converter(entry, raw, target))
    size = sum(entry.stop - entry.start for entry, _ in plan)
    verifier = TensorVerifier(opened.checksums, opened.source)
    with open(opened.header.path, "rb", buffering=0) as handle:
        container.read_tensors(handle, plan, verifier.check, workers=reading_threads(size))
    verifier.finish()
    for convert in conversions:
        convert()


def _dequantizer(q: np.ndarray, scale: np.ndarray, target: np.ndarray) -> Callable[[], None]:
    def convert() -> None:
        if isinstance(target, np.ndarray) and target.flags.c_contiguous:
            dequantize_int8(q, scale, target)
        else:
            target[...] = dequantize_int8(q, scale, np.empty(q.shape, target.dtype))

    return convert


def _converter(entry: TensorEntry, raw: np.ndarray, target: np.ndarray) -> Callable[[], None]:
    def convert() -> None:
        value = container.widen_bfloat16(raw) if entry.code == "BF16" else raw
        target[...] = value.astype(target.dtype, copy=False)

    return convert
