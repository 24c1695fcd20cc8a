"""Memory counters every backend reports through ``Backend.memory_stats()``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class MemoryStats:
    """Bytes in use and at peak, the reserved pool, and how many allocations were made."""

    in_use_bytes: int = 0
    peak_bytes: int = 0
    pool_bytes: int = 0
    allocations: int = 0
