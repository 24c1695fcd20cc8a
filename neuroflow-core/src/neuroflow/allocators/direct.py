"""The direct allocator: a fresh array per request, the reference the others are measured against."""

from __future__ import annotations

from typing import Any

from neuroflow.allocators.base import Allocator


class DirectAllocator(Allocator):
    """Allocates every request with the backend's ``empty``; buffers live as long as their holders."""

    name = "direct"

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> Any:
        array = self.xp.empty(shape, dtype=dtype)
        self.count_allocation(int(array.nbytes))
        return array
