"""The Trainer's memory runtime: budgets, the planned arena, and what to do when it does not fit.

Split from ``trainer.py`` so each file holds one concern; the Trainer
inherits these methods and owns the state they use (model, loss, optimizer,
backend, batch size, accumulation, the flat parameters and the pools).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np

from neuroflow.allocators.arena import ArenaAllocator
from neuroflow.buffers.planner import place
from neuroflow.buffers.pool import BufferPool
from neuroflow.buffers.trace import TracingPool
from neuroflow.errors import OutOfMemoryError


class MemoryRuntime:
    """Mixin of the Trainer: fits batch × accumulation to a budget and turns the traced first step into a plan."""

    model: Any
    loss: Any
    optimizer: Any
    backend: Any
    batch_size: int
    gradient_accumulation_steps: int
    progress: bool
    memory_budget_mb: float | None
    memory_pool_size_mb: float | None
    memory_report: Any
    _flat: Any
    _plan: Any
    _planned_batch: int
    _budget_checked: bool
    _reserve_per_sample: int
    _allocator_class: Any
    compressor: Any

    def _ensure_ready(self) -> None:
        raise NotImplementedError

    def _attach(self, pool: Any) -> None:
        raise NotImplementedError

    def _static_bytes(self) -> int:
        flat = self._flat
        if flat is None:
            return 0
        itemsize = flat.data.dtype.itemsize
        params = sum(p.nbytes for p in self.model.parameters() if not p.requires_grad)
        # the compressor's residual, like optimizer state, lives as long as training does
        residual = flat.size * itemsize if self.compressor is not None else 0
        gradients = int(flat.grad.size) * itemsize  # smaller once updates run inside backward
        return flat.size * itemsize + gradients + params + self.optimizer.state_nbytes(flat.size, itemsize) + residual

    def fit_to_budget(self, sample_shape: tuple[int, ...]) -> Any:
        """Choose batch × accumulation so a step fits ``memory_budget_mb``; says what it chose.

        The effective batch ``batch_size × gradient_accumulation_steps`` is
        kept; the micro-batch shrinks and accumulation grows until the
        predicted peak is under the budget.
        """
        from neuroflow.memory.profile import profile

        self._ensure_ready()
        self._reserve_per_sample = self.input_bytes_per_sample(sample_shape)
        report = profile(self.model, (self.batch_size, *sample_shape), self.loss, self.optimizer,
                         budget_mb=self.memory_budget_mb,
                         gradient_accumulation_steps=self.gradient_accumulation_steps,
                         reserve_per_sample=self._reserve_per_sample, gradient_compression=self._compression_mode)
        self.memory_report = report
        self._budget_checked = True
        if report.fits(self._reserve_per_sample * self.batch_size):
            if self.progress:
                print(f"memory budget {self.memory_budget_mb} MiB: batch {self.batch_size} × accumulation "
                      f"{self.gradient_accumulation_steps} fits (predicted peak "
                      f"{report.predicted_peak_bytes / 2**20:.2f} MiB)", flush=True)
            return report
        if report.suggestion is None:
            if report.largest_batch:
                raise OutOfMemoryError(
                    f"memory budget of {self.memory_budget_mb} MiB: no batch × accumulation keeps the effective batch "
                    f"{report.effective_batch} (accumulating needs a workspace per weight gradient); "
                    f"batch_size={report.largest_batch} without accumulation fits, or raise the budget"
                )
            raise OutOfMemoryError(
                f"memory budget of {self.memory_budget_mb} MiB is too small even for batch 1: parameters, gradients "
                f"and optimizer state take {report.static_bytes / 2**20:.2f} MiB"
            )
        batch, steps = report.suggestion
        if self.progress:
            print(f"memory budget {self.memory_budget_mb} MiB: batch {self.batch_size} × accumulation "
                  f"{self.gradient_accumulation_steps} needs {report.predicted_peak_bytes / 2**20:.2f} MiB; "
                  f"using batch {batch} × accumulation {steps}", flush=True)
        self.batch_size, self.gradient_accumulation_steps = batch, steps
        self.memory_report = profile(self.model, (batch, *sample_shape), self.loss, self.optimizer,
                                     budget_mb=self.memory_budget_mb, gradient_accumulation_steps=steps,
                                     reserve_per_sample=self._reserve_per_sample,
                                     gradient_compression=self._compression_mode)
        return self.memory_report

    @property
    def _compression_mode(self) -> str | None:
        return self.compressor.mode if self.compressor is not None else None

    def input_bytes_per_sample(self, sample_shape: tuple[int, ...]) -> int:
        """Host memory the input pipeline holds per sample: the DataLoader's prefetched batches,
        the one being gathered and the one in use, inputs and integer labels."""
        from neuroflow.data import DataLoader

        batches = int(inspect.signature(DataLoader).parameters["prefetch"].default) + 2
        itemsize = self._flat.data.dtype.itemsize if self._flat is not None else 4
        return batches * (math.prod(sample_shape) * itemsize + 8)

    def _arena_capacity(self, planned: int) -> int | None:
        if self.memory_pool_size_mb is not None:
            return int(self.memory_pool_size_mb * 2**20)
        if self.memory_budget_mb is not None:
            reserve = self._reserve_per_sample * self.batch_size
            return max(int(self.memory_budget_mb * 2**20) - self._static_bytes() - reserve, planned)
        return None

    def _finish_trace(self, tracer: TracingPool, batch: int) -> None:
        """Turn the traced first step into a plan, reserve the arena and attach the planned pool."""
        slots = tracer.finish()
        tracer.forget([*self.model.modules(), self.loss])
        allocator = self._allocator_class(self.backend.xp)
        if tracer.reused_key is not None or not isinstance(allocator, ArenaAllocator):
            self._plan = None
            pool = BufferPool(allocator)
        else:
            plan = place(slots)
            capacity = self._arena_capacity(plan.arena_bytes)
            if capacity is not None and plan.arena_bytes > capacity:
                raise OutOfMemoryError(
                    f"a training step at batch {batch} needs an arena of {plan.arena_bytes} bytes; "
                    f"the pool holds {capacity} bytes. {self._advice(capacity)}"
                )
            allocator.reserve(capacity if capacity is not None else plan.arena_bytes, plan.arena_bytes)
            self._plan = plan
            pool = BufferPool(allocator, plan, strict=capacity is not None)
        pool.grads_zeroed = tracer.grads_zeroed and tracer.reused_key is None
        if pool.grads_zeroed:
            pool.whole_gradients = set(tracer.whole_gradients)
        self.backend.use_allocator(allocator)
        self._planned_batch = batch
        self._attach(pool)

    def _grads_zeroed(self) -> bool:
        """Whether each backward starts from zero gradients: one micro-batch per step, no layer used twice."""
        modules = list(self.model.modules())
        return self.gradient_accumulation_steps == 1 and len(modules) == len({id(m) for m in modules})

    def _advice(self, capacity: int) -> str:
        from neuroflow.memory.profile import BatchModel, fit_batch, largest_batch

        sample = getattr(self, "_sample_shape", None)
        if sample is None:
            return "Lower batch_size or raise memory_pool_size_mb."
        dtype = self._flat.data.dtype if self._flat else np.float32
        single = BatchModel(self.model, self.loss, sample, dtype, 1)
        accumulating = BatchModel(self.model, self.loss, sample, dtype, 2)
        suggestion = fit_batch(single, accumulating, capacity, self.batch_size * self.gradient_accumulation_steps)
        if suggestion is None:
            alone = largest_batch(single, capacity)
            if alone:  # accumulating needs a workspace per weight gradient, which may be what does not fit
                return (f"No batch × accumulation keeps the effective batch {self.batch_size * self.gradient_accumulation_steps}; "
                        f"batch_size={alone} without accumulation fits, or raise memory_pool_size_mb.")
            return "Not even batch 1 fits: raise memory_pool_size_mb."
        b, k = suggestion
        return f"batch_size={b} with gradient_accumulation_steps={k} would fit."

    def memory_stats(self) -> Any:
        """The backend allocator's counters (arena size, bytes in use and at peak, allocations)."""
        return self.backend.memory_stats()
