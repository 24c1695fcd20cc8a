"""What training steps allocate, measured with tracemalloc: the peak a plan predicts, and what steady steps grow."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import neuroflow as nf

NUMPY_DATA = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)


@dataclass(frozen=True)
class StepMemory:
    """``first_peak``: the first (traced, planning) step's peak; ``peak``: the peak over the ``steps`` steady steps
    after it; both above what was traced before the trainer was built. ``grown``: the source lines holding more
    numpy blocks after the steady steps than before them (over 256 bytes)."""

    first_peak: int
    peak: int
    grown: list[tracemalloc.StatisticDiff]


def measure_steps(make_trainer: Callable[[], nf.Trainer], x: np.ndarray, y: object, steps: int = 2) -> StepMemory:
    """Build a trainer with ``make_trainer`` under tracemalloc and measure its first step and ``steps`` more on
    ``x``, ``y``. A first trainer runs one step beforehand, untraced: what a process loads once (plugin metadata,
    backends) is not the training step."""
    make_trainer().train_step(x, y)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        trainer = make_trainer()
        trainer.train_step(x, y)
        first_peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.reset_peak()
        before = tracemalloc.take_snapshot().filter_traces([NUMPY_DATA])
        for _ in range(steps):
            trainer.train_step(x, y)
        peak = tracemalloc.get_traced_memory()[1] - base
        after = tracemalloc.take_snapshot().filter_traces([NUMPY_DATA])
    finally:
        tracemalloc.stop()
    grown = [d for d in after.compare_to(before, "lineno") if d.count_diff > 0 and d.size_diff > 256]
    return StepMemory(first_peak, peak, grown)
