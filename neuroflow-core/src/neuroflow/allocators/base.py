"""The Allocator interface that every allocator plugin implements."""

from __future__ import annotations

from typing import Any

from neuroflow.allocators.stats import MemoryStats

# bytes: every planned offset and every arena start is a multiple of this (a cache line, and AVX-512's width)
ALIGNMENT = 64


class Allocator:
    """Gives out arrays on one backend and counts what it gave.

    ``allocate`` returns an uninitialised array; ``stats`` reports counters.
    Subclasses override ``allocate``; a plain allocator needs nothing else.
    """

    name = "base"

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self._stats = MemoryStats()

    def allocate(self, shape: tuple[int, ...], dtype: Any) -> Any:
        raise NotImplementedError

    def free(self, array: Any) -> None:
        """Give back an array this allocator handed out (a no-op where memory is garbage-collected)."""
        self._stats.in_use_bytes -= int(getattr(array, "nbytes", 0))

    def stats(self) -> MemoryStats:
        return MemoryStats(**vars(self._stats))

    def count_allocation(self, nbytes: int) -> None:
        """Count ``nbytes`` handed out: an allocation of this allocator's own, or one made for it elsewhere (a
        pool's fallback when the arena is full), so ``stats`` sees every byte in use."""
        s = self._stats
        s.allocations += 1
        s.in_use_bytes += nbytes
        s.peak_bytes = max(s.peak_bytes, s.in_use_bytes)
