"""Transient workspaces (im2col columns, padded maps, per-tap products) of one forward or backward call.

An op opens ``with Workspace(self, "forward") as ws:`` and takes arrays with
``ws(role, shape, dtype)``; they are valid until the ``with`` block ends.
Under a Trainer the arrays come from the op's buffer pool: the memory tracer
sees each one live from its first request to the end of the block, so the
planner places workspaces in the arena beside activations and gradients
(and the peak it predicts includes them). A pool without a plan shares one
array per role between all ops, as does an op used on its own (held per
thread and array namespace); either way, after the first call nothing is
allocated. ``max_workspace_bytes`` on an op bounds its workspaces by
processing the batch in chunks.
"""

from __future__ import annotations

import math
import threading
from types import TracebackType
from typing import Any

import numpy as np

_local = threading.local()


def _store() -> dict[tuple[int, str, str], Any]:
    store = getattr(_local, "arrays", None)
    if store is None:
        store = _local.arrays = {}
    return store


def scratch(xp: Any, role: str, shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised array of ``shape`` for ``role``, valid until the next request for the same role."""
    size = math.prod(shape)
    slot = (id(xp), role, np.dtype(dtype).str)
    store = _store()
    held = store.get(slot)
    if held is None or held.size < size:
        held = xp.empty(max(size, 1), dtype=dtype)
        store[slot] = held
    return held[:size].reshape(shape)


def held_bytes() -> int:
    """Bytes this thread's shared workspaces hold now (those of ops without a buffer pool)."""
    return sum(int(a.nbytes) for a in _store().values())


def release() -> None:
    """Drop this thread's shared workspaces (they are allocated again on the next request)."""
    _store().clear()


class Workspace:
    """The transient arrays of one call (``phase``: "forward" or "backward") of the operator ``op``.

    Asking again for a role returns the same memory, reshaped (a smaller
    request is a leading part of it): a loop over chunks reuses one buffer.
    """

    def __init__(self, op: Any, phase: str) -> None:
        self.op, self.xp, self.phase = op, op.xp, phase
        pool = op.buffer_pool
        self._pool = pool if pool is not None and hasattr(pool, "workspace") else None
        self._held: dict[tuple[str, str], Any] = {}

    def __call__(self, role: str, shape: tuple[int, ...], dtype: Any) -> Any:
        size = math.prod(shape)
        if self._pool is None:
            return scratch(self.xp, role, shape, dtype)
        key = (role, np.dtype(dtype).str)
        held = self._held.get(key)
        if held is None or held.shape[0] < size:
            suffix = "" if held is None else f"+{size}"  # a larger request later in the call: one more buffer
            held = self._pool.workspace(self.op, f"{self.phase}.{role}{suffix}", (max(size, 1),), dtype)
            self._held[key] = held
        return held[:size].reshape(shape)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self.retire()

    def retire(self) -> None:
        """End the arrays taken so far (their memory may serve later requests); the ``with`` block's end does."""
        if self._pool is not None:
            for array in self._held.values():
                self._pool.retire(array)
        self._held.clear()
