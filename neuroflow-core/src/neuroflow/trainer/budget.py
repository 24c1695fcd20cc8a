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

from neuroflow.allocators.base import ALIGNMENT
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


#: Under a budget the batch search keeps this share of the arena free for host memory the plan does not hold (the
#: loss's temporaries, the loader's epoch order), and the arena holds the plan and at most this share of it more
#: (as far as the budget leaves room besides that) for requests the plan did not foresee (an evaluation's buffers,
#: say); a request beyond it raises OutOfMemoryError.
UNPLANNED_SHARE = 1 / 8
#: The share of the budget no plan is made for: host temporaries of a step that no plan holds (the loss's and the
#: accuracy count's, the loader's epoch order) took up to 2.2 % of it for an MLP fitted to 3.4 and 4 MiB budgets.
HOST_MARGIN = 0.03


def planned_budget_bytes(session: MemorySession) -> int | None:
    """The part of ``memory_budget_mb`` the step is planned to fit (all but :data:`HOST_MARGIN`), or None."""
    budget_mb = session.options.memory_budget_mb
    return None if budget_mb is None else int(budget_mb * 2**20 * (1 - HOST_MARGIN))


def input_batches_ahead() -> int:
    """Micro-batches held besides the step's own: the DataLoader's prefetched ones and the one it is gathering,
    and the previous step's last one, which the model's first layer keeps (for its backward) until the next
    forward replaces it."""
    return int(inspect.signature(DataLoader).parameters["prefetch"].default) + 2


def sample_input_bytes(session: MemorySession, sample_shape: tuple[int, ...]) -> int:
    """Host bytes one sample of an input batch takes: its inputs and its integer label."""
    itemsize = session.flat.data.dtype.itemsize if session.flat is not None else 4
    return math.prod(sample_shape) * itemsize + 8


def input_bytes(session: MemorySession, batch: int, accumulation: int) -> int:
    """What the epoch loop's input holds at batch × accumulation: the step's k micro-batches and those of
    :func:`input_batches_ahead`."""
    sample = session.sample_shape  # the samples the step was traced on
    if sample is None:
        return 0
    return (accumulation + input_batches_ahead()) * batch * sample_input_bytes(session, sample)


def arena_room(session: MemorySession) -> int | None:
    """What the arena may take: the pool size asked for, or what the budget leaves once the static part, the input
    the loop holds and the arena's alignment are counted (0 or less: nothing); None for no limit."""
    options = session.options
    if options.memory_pool_size_mb is not None:
        return int(options.memory_pool_size_mb * 2**20)
    if options.memory_budget_mb is not None:
        reserve = input_bytes(session, session.batch_size, session.accumulation)
        return int(planned_budget_bytes(session) or 0) - static_bytes(session) - reserve - ALIGNMENT
    return None


def arena_capacity(session: MemorySession, planned: int) -> int | None:
    """The arena's size in bytes: the pool size asked for; under a budget the ``planned`` bytes and up to
    :data:`UNPLANNED_SHARE` of them more, as far as the budget leaves room; None for no limit."""
    room = arena_room(session)
    if room is None or session.options.memory_pool_size_mb is not None:
        return room
    share = int(planned * UNPLANNED_SHARE)
    allowance = min(max(room - planned - share, 0), share)
    return planned + allowance // ALIGNMENT * ALIGNMENT


def profile_step(session: MemorySession, batch: int, sample_shape: tuple[int, ...], accumulation: int,
                 budget_mb: float | None) -> Any:
    """The memory report of a step of ``batch`` × ``accumulation`` under ``budget_mb`` as the Trainer plans it: the
    input the loop holds, the arena's headroom and the host margin counted (``neuroflow mem-profile`` prints it)."""
    compressor, sample_bytes = session.compressor, sample_input_bytes(session, sample_shape)
    return profile(session.model, (batch, *sample_shape), session.loss, session.optimizer, budget_mb=budget_mb,
                   gradient_accumulation_steps=accumulation, reserve_per_sample=input_batches_ahead() * sample_bytes,
                   reserve_per_step_sample=sample_bytes, headroom=UNPLANNED_SHARE, host_margin=HOST_MARGIN,
                   gradient_compression=compressor.mode if compressor is not None else None)


def _profile(session: MemorySession, batch: int, sample_shape: tuple[int, ...], accumulation: int) -> Any:
    return profile_step(session, batch, sample_shape, accumulation, session.options.memory_budget_mb)


def fit_to_budget(session: MemorySession, sample_shape: tuple[int, ...]) -> Any:
    """Choose batch × accumulation so a step fits ``memory_budget_mb``; says what it chose.

    The effective batch ``batch_size × gradient_accumulation_steps`` is
    kept; the micro-batch shrinks and accumulation grows until the
    predicted peak is under the budget.
    """
    session.ready()
    report = _profile(session, session.batch_size, sample_shape, session.accumulation)
    session.memory_report = report
    session.budget_checked = True
    budget_mb, verbose = session.options.memory_budget_mb, session.options.progress
    if report.fits():
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
