"""Memory runtime: tracing, planning, buffer pools, flat parameters, the memory profile."""

from neuroflow.memory.buffers import BufferPool
from neuroflow.memory.flat import FlatParameters
from neuroflow.memory.planner import Plan, place
from neuroflow.memory.profile import MemoryReport, profile
from neuroflow.memory.stats import MemoryStats
from neuroflow.memory.trace import TracingPool

__all__ = ["BufferPool", "FlatParameters", "MemoryReport", "MemoryStats", "Plan", "TracingPool", "place", "profile"]
