"""Memory runtime: buffer pools, flat parameter storage, allocators' statistics."""

from neuroflow.memory.buffers import BufferPool
from neuroflow.memory.flat import FlatParameters
from neuroflow.memory.stats import MemoryStats

__all__ = ["BufferPool", "FlatParameters", "MemoryStats"]
