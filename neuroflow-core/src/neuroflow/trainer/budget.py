"""Fitting a training step to a memory budget: batch × accumulation, the arena's capacity, and advice when it fails.

Each function reads a :class:`~neuroflow.trainer.session.MemorySession`'s
public state; :func:`fit_to_budget` alone changes it (the batch and the
accumulation it chose, and the report it based that on).
"""

from __future__ import annotations

import inspect
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from neuroflow.data import DataLoader
from neuroflow.errors import OutOfMemoryError
from neuroflow.memory.profile import BatchModel, fit_batch, largest_batch, profile

if TYPE_CHECKING:
    from neuroflow.trainer.session import MemorySession


def static_bytes(session: MemorySession) -> int:
    """What lives as long as training does: parameters, gradients, optimizer state, the compressor's residual."""
    flat = session.flat
    if flat is None:
        return 0
    itemsize = flat.data.dtype.itemsize
    frozen = sum(p.nbytes for p in session.model.parameters() if not p.requires_grad)
    residual = flat.size * itemsize if session.compressor is not None else 0
    gradients = int(flat.grad.size) * itemsize  # smaller once updates run inside backward
    state = session.optimizer.state_nbytes(flat.size, itemsize)
    return flat.size * itemsize + gradients + frozen + state + residual


def input_bytes_per_sample(session: MemorySession, sample_shape: tuple[int, ...]) -> int:
    """Host memory the input pipeline holds per sample: the DataLoader's prefetched batches,
    the one being gathered and the one in use, inputs and integer labels."""
    batches = int(inspect.signature(DataLoader).parameters["prefetch"].default) + 2
    itemsize = session.flat.data.dtype.itemsize if session.flat is not None else 4
    return batches * (math.prod(sample_shape) * itemsize + 8)


def arena_capacity(session: MemorySession, planned: int) -> int | None:
    """The arena's size in bytes: the pool size asked for, or what the budget leaves; None for no limit."""
    options = session.options
    if options.memory_pool_size_mb is not None:
        return int(options.memory_pool_size_mb * 2**20)
    if options.memory_budget_mb is not None:
        reserve = session.reserve_per_sample * session.batch_size
        return max(int(options.memory_budget_mb * 2**20) - static_bytes(session) - reserve, planned)
    return None


def _profile(session: MemorySession, batch: int, sample_shape: tuple[int, ...], accumulation: int) -> Any:
    compressor = session.compressor
    return profile(session.model, (batch, *sample_shape), session.loss, session.optimizer,
                   budget_mb=session.options.memory_budget_mb, gradient_accumulation_steps=accumulation,
                   reserve_per_sample=session.reserve_per_sample,
                   gradient_compression=compressor.mode if compressor is not None else None)


def fit_to_budget(session: MemorySession, sample_shape: tuple[int, ...]) -> Any:
    """Choose batch × accumulation so a step fits ``memory_budget_mb``; says what it chose.

    The effective batch ``batch_size × gradient_accumulation_steps`` is
    kept; the micro-batch shrinks and accumulation grows until the
    predicted peak is under the budget.
    """
    session.ready()
    session.reserve_per_sample = input_bytes_per_sample(session, sample_shape)
    report = _profile(session, session.batch_size, sample_shape, session.accumulation)
    session.memory_report = report
    session.budget_checked = True
    budget_mb, verbose = session.options.memory_budget_mb, session.options.progress
    if report.fits(session.reserve_per_sample * session.batch_size):
        if verbose:
            print(f"memory budget {budget_mb} MiB: batch {session.batch_size} × accumulation "
                  f"{session.accumulation} fits (predicted peak "
                  f"{report.predicted_peak_bytes / 2**20:.2f} MiB)", flush=True)
        return report
    if report.suggestion is None:
        raise OutOfMemoryError(f"memory_budget_mb={budget_mb}: {report.why_nothing_fits()}")
    batch, steps = report.suggestion
    if verbose:
        print(f"memory budget {budget_mb} MiB: batch {session.batch_size} × accumulation "
              f"{session.accumulation} needs {report.predicted_peak_bytes / 2**20:.2f} MiB; "
              f"using batch {batch} × accumulation {steps}", flush=True)
    session.batch_size, session.accumulation = batch, steps
    session.memory_report = _profile(session, batch, sample_shape, steps)
    return session.memory_report


def advice(session: MemorySession, capacity: int) -> str:
    """What would fit an arena of ``capacity`` bytes, for the error that says this step does not."""
    sample = session.sample_shape
    if sample is None:
        return "Lower batch_size or raise memory_pool_size_mb."
    dtype = session.flat.data.dtype if session.flat else np.float32
    single = BatchModel(session.model, session.loss, sample, dtype, 1)
    accumulating = BatchModel(session.model, session.loss, sample, dtype, 2)
    effective = session.batch_size * session.accumulation
    suggestion = fit_batch(single, accumulating, capacity, effective)
    if suggestion is None:
        alone = largest_batch(single, capacity)
        if alone:  # accumulating needs a workspace per weight gradient, which may be what does not fit
            return (f"No batch × accumulation keeps the effective batch {effective}; "
                    f"batch_size={alone} without accumulation fits, or raise memory_pool_size_mb.")
        return (f"Not even batch 1 fits: it needs an arena of {single.arena_bytes(1)} bytes; "
                "raise memory_pool_size_mb.")
    b, k = suggestion
    return f"batch_size={b} with gradient_accumulation_steps={k} would fit."
