"""Memory as users see it: the profile of a model before training (peak, per-layer rows, advice), gradient
compression and offloading; the planned buffers underneath live in :mod:`neuroflow.buffers`."""

from neuroflow.allocators.stats import MemoryStats
from neuroflow.buffers import BufferPool, FlatParameters, Plan, TracingPool, place
from neuroflow.memory.profile import MemoryReport, profile

__all__ = ["BufferPool", "FlatParameters", "MemoryReport", "MemoryStats", "Plan", "TracingPool", "place", "profile"]
