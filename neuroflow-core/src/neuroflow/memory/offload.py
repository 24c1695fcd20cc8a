"""Async unload: cold tensors move to host memory when the device pool runs low and come back before use.

A tensor is cold when a training step reads it rarely or only at the step's
edges: BatchNorm running statistics (a few elements, touched once per
forward), frozen layers' state. The backend does the moving
(``Backend.unload`` starts a device→host copy on a copy stream or queue and
frees the device memory when it completes; ``Backend.reload`` brings it back
and waits only for that copy). On the cpu backend host and device are the
same memory, so nothing moves.
"""

from __future__ import annotations

from typing import Any

from neuroflow.tensor import Tensor


class OffloadManager:
    """Unloads ``tensors`` after a step when the backend's free pool memory falls below ``low_water_bytes``."""

    def __init__(self, backend: Any, tensors: list[Tensor], low_water_bytes: int) -> None:
        self.backend = backend
        self.tensors = tensors
        self.low_water_bytes = int(low_water_bytes)
        self._handles: list[tuple[Tensor, Any]] = []
        self.unloads = 0

    @property
    def unloaded(self) -> bool:
        return bool(self._handles)

    def after_step(self) -> None:
        """Start unloading cold tensors if the pool is low (asynchronous: compute may go on)."""
        if self._handles or not self.tensors:
            return
        free = self.backend.free_bytes()
        if free is None or free >= self.low_water_bytes:
            return
        self._handles = [(t, self.backend.unload(t.data)) for t in self.tensors]
        for tensor, handle in self._handles:
            tensor.data = handle
        self.unloads += 1

    def ensure_loaded(self) -> None:
        """Bring every unloaded tensor back; called before anything reads them (the next step, eval, save)."""
        if not self._handles:
            return
        for tensor, handle in self._handles:
            tensor.data = self.backend.reload(handle)
        self._handles = []
