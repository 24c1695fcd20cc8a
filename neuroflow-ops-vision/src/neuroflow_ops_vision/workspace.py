"""Transient workspaces (im2col columns, padded maps, per-tap products) shared by this distribution's ops.

A workspace lives only inside one ``forward`` or ``backward`` call, so every
op can borrow the same memory: the arrays are held per thread, per array
namespace and per role, and grow to the largest request. After the first
training step no call allocates, and the transient memory is the largest
single request of each role rather than the sum over layers. Ops declare
these shapes as ``workspace`` in ``memory_declaration``; ``max_workspace_bytes``
on an op bounds them by processing the batch in chunks.
"""

from __future__ import annotations

import math
import threading
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
    """Bytes this thread's workspaces hold now."""
    return sum(int(a.nbytes) for a in _store().values())


def release() -> None:
    """Drop this thread's workspaces (they are allocated again on the next request)."""
    _store().clear()
