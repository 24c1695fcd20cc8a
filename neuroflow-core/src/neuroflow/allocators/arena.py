"""The arena allocator: one block per device; planned buffers are views at fixed offsets of it."""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow.allocators.base import ALIGNMENT, Allocator
from neuroflow.errors import OutOfMemoryError


class ArenaAllocator(Allocator):
    """Reserves ``capacity`` bytes once; the planner's region comes first, later requests fit in the rest.

    Requests the plan did not foresee (a larger batch, an eval-only buffer)
    are placed first-fit in the free space after the planned region. When
    nothing fits, OutOfMemoryError says how much was needed and free.
    """

    name = "arena"

    def __init__(self, xp: Any, capacity: int | None = None, planned_bytes: int = 0) -> None:
        super().__init__(xp)
        self.capacity = 0
        self.block: Any = None
        self._free: list[tuple[int, int]] = []
        self._owners: dict[int, tuple[int, int]] = {}
        if capacity is not None:
            self.reserve(capacity, planned_bytes)

    def reserve(self, capacity: int, planned_bytes: int = 0) -> None:
        """Allocate the arena: ``capacity`` bytes, of which the first ``planned_bytes`` belong to the plan."""
        capacity = max(int(capacity), int(planned_bytes), ALIGNMENT)
        if planned_bytes > capacity:
            raise OutOfMemoryError(f"the plan needs {planned_bytes} bytes; the arena holds {capacity}")
        # numpy aligns to 16 bytes; over-allocate so the planner's 64-byte offsets are cache-line aligned
        raw = self.xp.empty(capacity + ALIGNMENT, dtype=np.uint8)
        shift = -_data_address(raw) % ALIGNMENT
        self.block = raw[shift:shift + capacity]
        self.capacity = capacity
        start = _align(planned_bytes)
        self._free = [(start, capacity)] if start < capacity else []
        s = self._stats
        s.pool_bytes = capacity + ALIGNMENT
        s.allocations += 1
        s.in_use_bytes = planned_bytes
        s.peak_bytes = max(s.peak_bytes, planned_bytes)

    def view(self, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
        """The array of ``shape``/``dtype`` at byte ``offset`` of the arena (no allocation)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if self.block is None or offset + nbytes > self.capacity:
            raise OutOfMemoryError(f"arena view [{offset}, {offset + nbytes}) lies outside the {self.capacity}-byte arena")
        return self.block[offset:offset + nbytes].view(dtype).reshape(shape)

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> Any:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if self.block is None:
            self.reserve(nbytes)
            self._stats.in_use_bytes = 0
        size = _align(max(nbytes, 1))
        for i, (lo, hi) in enumerate(self._free):
            if hi - lo >= size:
                self._free[i] = (lo + size, hi)
                if lo + size == hi:
                    del self._free[i]
                array = self.view(lo, shape, dtype)
                self._owners[id(array)] = (lo, size)
                self._stats.in_use_bytes += size
                self._stats.peak_bytes = max(self._stats.peak_bytes, self._stats.in_use_bytes)
                return array
        free = sum(hi - lo for lo, hi in self._free)
        largest = max((hi - lo for lo, hi in self._free), default=0)
        raise OutOfMemoryError(
            f"arena out of memory: needed {nbytes} bytes for a {tuple(shape)} {np.dtype(dtype)} buffer; "
            f"{free} bytes free (largest free block {largest}) of {self.capacity}"
        )

    def free(self, array: Any) -> None:
        span = self._owners.pop(id(array), None)
        if span is None:
            return
        lo, size = span
        self._stats.in_use_bytes -= size
        self._free.append((lo, lo + size))
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for a, b in self._free:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        self._free = merged

    @property
    def free_bytes(self) -> int:
        return sum(hi - lo for lo, hi in self._free)


def _data_address(array: Any) -> int:
    interface = getattr(array, "__array_interface__", None)
    if interface is not None:
        return int(interface["data"][0])
    return int(getattr(getattr(array, "data", None), "ptr", 0))


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
