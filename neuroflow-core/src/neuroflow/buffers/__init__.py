"""Planned buffers: the first step is traced (``trace``), its buffers placed in one arena (``planner``), and every
later step takes its arrays from the pool (``pool``); parameters and gradients live in flat buffers (``flat``)."""

from neuroflow.buffers.flat import FlatParameters
from neuroflow.buffers.planner import Plan, place
from neuroflow.buffers.pool import BufferPool
from neuroflow.buffers.trace import Slot, TracingPool

__all__ = ["BufferPool", "FlatParameters", "Plan", "Slot", "TracingPool", "place"]
