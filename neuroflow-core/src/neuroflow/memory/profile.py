"""memory.profile: a model's training-step memory, per layer and at peak, before any training.

The profile runs one forward/backward on zeros under a TracingPool (model
state, RNGs and gradients are restored afterwards), places the traced
buffers with the planner and adds the flat parameter, gradient and
optimizer-state buffers. Traces at two small batch sizes give each buffer's
size as a function of the batch, so the largest batch under a budget is found
without running the model at that size.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from neuroflow.allocators.base import ALIGNMENT
from neuroflow.buffers.planner import place
from neuroflow.buffers.trace import Slot, TracingPool
from neuroflow.composites import input_layer
from neuroflow.errors import ConfigError
from neuroflow.fusion import fuse
from neuroflow.layout_pass import plan_layouts
from neuroflow.losses.cross_entropy import CrossEntropy
from neuroflow.memory.compression import MODES, compression_nbytes
from neuroflow.memory.report import KINDS, LayerRow, MemoryReport, MiB
from neuroflow.operator import Operator

__all__ = ["KINDS", "BatchModel", "LayerRow", "MemoryReport", "MiB", "fit_batch", "largest_batch", "named_leaves",
           "profile", "trace_step"]


def named_leaves(model: Operator, prefix: str = "") -> Iterator[tuple[str, Operator]]:
    """Leaf operators (no children) under dotted names; a model that is a leaf yields itself."""
    children = list(model.named_children())
    if not children:
        yield prefix.rstrip(".") or type(model).__name__, model
    for name, child in children:
        yield from named_leaves(child, f"{prefix}{name}.")


def trace_step(
    model: Operator, loss: Any, input_shape: tuple[int, ...], dtype: Any = np.float32, accumulation: int = 1
) -> list[Slot]:
    """Run forward, loss and backward once on zeros under a TracingPool; restore all state after.

    ``accumulation`` matters because without it ops write weight gradients
    straight into the gradient buffers and need no workspace for them.
    """
    xp = model.xp
    saved_pool = model.buffer_pool
    saved_loss_pool = loss.buffer_pool
    snapshot = _snapshot(model)
    for module, _ in snapshot["states"]:
        module.reset_state()  # type: ignore[attr-defined]
    fuse(model)  # as the Trainer runs it
    plan_layouts(model)
    tracer = TracingPool(xp)
    tracer.grads_zeroed = accumulation == 1
    for param in model.trainable_parameters():
        if param.grad is None:
            param.grad = xp.zeros_like(param.data)
        else:
            param.grad[...] = 0
    model.attach_pool(tracer)
    loss.attach_pool(tracer)
    first = input_layer(model)
    first_needs = first.needs_input_grad if first is not None else True
    if first is not None:
        first.needs_input_grad = False  # as the Trainer runs it: the input needs no gradient
    try:
        x = xp.zeros(input_shape, dtype=dtype)
        out = model.forward(x)
        target = _zero_target(loss, out, xp)
        loss.forward(out, target)
        tracer.phase = "backward"
        g = loss.backward()
        gx = model.backward(g)
        tracer.handoff(g, gx, model)
        tracer.release(gx)
        tracer.done(loss)
        slots = tracer.finish()
        tracer.forget([*model.modules(), loss])
        return slots
    finally:
        if first is not None:
            first.needs_input_grad = first_needs
        model.attach_pool(saved_pool)
        loss.attach_pool(saved_loss_pool)
        _restore(model, snapshot)


def _zero_target(loss: Any, out: Any, xp: Any) -> Any:
    if isinstance(loss, CrossEntropy):
        return xp.zeros(out.shape[0], dtype=np.int64)
    return loss.example_target(out, xp)


def _snapshot(model: Operator) -> dict[str, Any]:
    return {
        "buffers": [(t, t.data.copy()) for _, t in model.named_buffers()],
        "grads": [(p, None if p.grad is None else p.grad.copy()) for p in model.parameters()],
        "rngs": [(m, copy.deepcopy(m.rng.bit_generator.state)) for m in model.modules()  # type: ignore[attr-defined]
                 if isinstance(getattr(m, "rng", None), np.random.Generator)],
        "training": model.training,
        # recurrent ops carry a hidden state across calls: trace from zeros, put theirs back after
        "states": [(m, _copy_state(m.state)) for m in model.modules() if callable(getattr(m, "reset_state", None))],  # type: ignore[attr-defined]
    }


def _restore(model: Operator, snapshot: dict[str, Any]) -> None:
    for tensor, data in snapshot["buffers"]:
        tensor.data[...] = data
    for param, grad in snapshot["grads"]:
        if grad is None:
            param.grad = None
        else:
            param.grad[...] = grad
    for module, state in snapshot["rngs"]:
        module.rng.bit_generator.state = state  # type: ignore[attr-defined]
    model.train(snapshot["training"])
    for module, state in snapshot["states"]:
        module.state = state  # type: ignore[attr-defined]


def _copy_state(state: Any) -> Any:
    if state is None:
        return None
    if isinstance(state, (tuple, list)):
        return tuple(s.copy() for s in state)
    return state.copy()


class BatchModel:
    """Each traced buffer's size as an affine function of the batch, from traces at batches 1 and 2."""

    def __init__(
        self, model: Operator, loss: Any, sample_shape: tuple[int, ...], dtype: Any, accumulation: int = 1,
        reserve_per_sample: int = 0,
    ) -> None:
        self.model, self.loss, self.sample_shape, self.dtype = model, loss, sample_shape, dtype
        self.accumulation = accumulation
        self.reserve_per_sample = reserve_per_sample
        #: bytes kept whatever the micro-batch: the input of a whole step of a fixed effective batch
        self.reserve_bytes = 0
        #: the share of the arena kept besides it for what the plan does not hold (host temporaries, say)
        self.headroom = 0.0
        one = trace_step(model, loss, (1, *sample_shape), dtype, accumulation)
        two = trace_step(model, loss, (2, *sample_shape), dtype, accumulation)
        self.affine = len(one) == len(two) and all(
            (a.key, id(a.owner)) == (b.key, id(b.owner)) for a, b in zip(one, two)
        )
        self.base = one
        self.slopes = [b.nbytes - a.nbytes for a, b in zip(one, two)] if self.affine else []

    def slots(self, batch: int) -> list[Slot]:
        if not self.affine:
            return trace_step(self.model, self.loss, (batch, *self.sample_shape), self.dtype, self.accumulation)
        return [copy.copy(s) for s in self.base] if batch == 1 else [
            _resized(s, s.nbytes + slope * (batch - 1)) for s, slope in zip(self.base, self.slopes)
        ]

    def arena_bytes(self, batch: int) -> int:
        """The arena at ``batch``, plus what the input pipeline holds for that batch."""
        arena = place(self.slots(batch)).arena_bytes
        return arena + int(arena * self.headroom) + self.reserve_per_sample * batch + self.reserve_bytes

    def reserving(self, per_sample: int, fixed: int = 0, headroom: float = 0.0) -> BatchModel:
        """The same sizes (no new trace) with ``per_sample`` bytes of input per sample of the micro-batch,
        ``fixed`` bytes whatever the micro-batch and ``headroom`` × the arena besides it."""
        clone = copy.copy(self)
        clone.reserve_per_sample, clone.reserve_bytes = per_sample, fixed
        clone.headroom = headroom
        return clone


def _resized(slot: Slot, nbytes: int) -> Slot:
    clone = copy.copy(slot)
    clone.nbytes = int(nbytes)
    return clone


def profile(
    model: Operator,
    input_shape: tuple[int, ...],
    loss: Any = None,
    optimizer: Any = None,
    *,
    budget_mb: float | None = None,
    gradient_accumulation_steps: int = 1,
    dtype: Any = None,
    reserve_per_sample: int = 0,
    gradient_compression: str | None = None,
    reserve_per_step_sample: int = 0,
    headroom: float = 0.0,
    host_margin: float = 0.0,
) -> MemoryReport:
    """Predict the memory of one training step of ``model`` on batches of ``input_shape``.

    ``input_shape`` includes the batch: ``(64, 784)``. With ``budget_mb``
    the report also gives the largest batch that fits and a
    batch × accumulation pair keeping the effective batch
    ``input_shape[0] × gradient_accumulation_steps``;
    ``reserve_per_sample`` bytes per sample of the micro-batch are kept free
    of the budget for the input pipeline (batches being loaded and
    prefetched), and ``reserve_per_step_sample`` bytes per sample of the
    whole step (the k micro-batches a training loop holds until the step
    runs): a step of batch × k keeps ``(reserve_per_sample +
    k × reserve_per_step_sample) × batch`` bytes for its input, and
    ``headroom`` × its arena for what the plan does not hold; ``host_margin``
    × the budget is kept for host temporaries of a step that no plan holds. With
    ``gradient_compression`` the static memory includes the compressor's
    error-feedback residual.
    """
    if not input_shape or int(input_shape[0]) < 1:
        raise ConfigError(f"input_shape must start with a positive batch size; got {tuple(input_shape)}")
    number = isinstance(budget_mb, int | float | np.integer | np.floating) and not isinstance(budget_mb, bool)
    if budget_mb is not None and not (number and budget_mb > 0 and math.isfinite(budget_mb)):
        raise ConfigError(f"budget_mb must be a positive finite number of MiB; got {budget_mb!r}")
    loss = loss if loss is not None else CrossEntropy()
    params = model.parameters()
    if dtype is None:
        dtype = params[0].data.dtype if params else np.float32
    batch = int(input_shape[0])
    sample = tuple(int(s) for s in input_shape[1:])
    trainable = [p for p in params if p.requires_grad]
    parameter_bytes = sum(p.nbytes for p in params) + sum(t.nbytes for _, t in model.named_buffers())
    gradient_bytes = sum(p.nbytes for p in trainable)
    itemsize = np.dtype(dtype).itemsize
    trainable_size = sum(int(p.data.size) for p in trainable)
    optimizer_bytes = optimizer.state_nbytes(trainable_size, itemsize) if optimizer is not None else 0

    slots = trace_step(model, loss, (batch, *sample), dtype, gradient_accumulation_steps)
    plan = place(slots)
    rows = _rows(model, slots, optimizer_bytes, gradient_bytes)
    report = MemoryReport(batch, rows, parameter_bytes, gradient_bytes, optimizer_bytes, plan)
    if gradient_compression is not None:
        if gradient_compression not in MODES:
            raise ConfigError(f"unknown gradient_compression {gradient_compression!r}; choose one of "
                              f"{', '.join(map(repr, MODES))} or None")
        report.compression_bytes = compression_nbytes([int(p.data.size) for p in trainable], itemsize)
    if budget_mb is not None:
        report.budget_bytes = int(budget_mb * MiB)
        # kept free: host temporaries no plan holds (a share of the budget) and requests the plan did not foresee
        # (a share of the arena), as the search below keeps them
        host = int(report.budget_bytes * host_margin)
        report.margin_bytes, report.host_margin = host + int(report.arena_bytes * headroom), host_margin
        steps = gradient_accumulation_steps
        report.input_reserve_bytes = (reserve_per_sample + steps * reserve_per_step_sample) * batch
        traced = BatchModel(model, loss, sample, dtype, steps)
        # what the arena may take, as fits() counts (each batch's own headroom: BatchModel.arena_bytes)
        room = report.budget_bytes - host - report.static_bytes - ALIGNMENT
        per_sample = reserve_per_sample + steps * reserve_per_step_sample
        report.largest_batch = largest_batch(traced.reserving(per_sample, 0, headroom), room)
        effective = batch * steps
        report.effective_batch = effective
        single = traced if steps == 1 else BatchModel(model, loss, sample, dtype, 1)
        accumulating = traced if steps > 1 else BatchModel(model, loss, sample, dtype, 2)
        # every split of the effective batch holds all of it in the loop: a fixed part, whatever the micro-batch
        whole = reserve_per_step_sample * effective
        report.suggestion = fit_batch(single.reserving(reserve_per_sample, whole, headroom),
                                      accumulating.reserving(reserve_per_sample, whole, headroom), room, effective)
        single = single.reserving(reserve_per_sample + reserve_per_step_sample, 0, headroom)
        report.largest_single_batch = largest_batch(single, room)
        report.batch1_peak_bytes = report.static_bytes + ALIGNMENT + single.arena_bytes(1)
        accumulating = accumulating.reserving(reserve_per_sample, whole, headroom)
        report.batch1_accumulating_peak_bytes = report.static_bytes + ALIGNMENT + accumulating.arena_bytes(1)
    return report


def largest_batch(sizes: BatchModel, room: int, limit: int = 1 << 20) -> int:
    """The largest batch (up to ``limit``) whose planned arena fits ``room`` bytes; 0 when not even 1 does."""
    if room <= 0 or sizes.arena_bytes(1) > room:
        return 0
    lo, hi = 1, 2
    while hi <= limit and sizes.arena_bytes(hi) <= room:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if sizes.arena_bytes(mid) <= room else (lo, mid)
    return lo


def fit_batch(single: BatchModel, accumulating: BatchModel, room: int, effective: int) -> tuple[int, int] | None:
    """The fewest accumulation steps k whose micro-batch fits ``room``; exact divisors of the batch first.

    ``single`` sizes a step without accumulation, ``accumulating`` one with it
    (accumulating needs a workspace per weight gradient).
    """
    if largest_batch(single, room, limit=effective) >= effective:
        return effective, 1
    largest = largest_batch(accumulating, room, limit=effective)
    if largest == 0:
        return None
    smallest_k = max(2, math.ceil(effective / largest))
    for k in range(smallest_k, min(effective, 2 * smallest_k) + 1):
        if effective % k == 0:
            return effective // k, k
    return math.ceil(effective / smallest_k), smallest_k


def _rows(model: Operator, slots: list[Slot], optimizer_bytes: int, gradient_bytes: int) -> list[LayerRow]:
    rows: list[LayerRow] = []
    by_owner: dict[int, LayerRow] = {}
    per_grad_byte = optimizer_bytes / gradient_bytes if gradient_bytes else 0.0
    for name, leaf in named_leaves(model):
        row = LayerRow(name, repr(leaf).split("\n")[0])
        own = leaf.parameters()  # a leaf's own: it has no children
        row.bytes["parameters"] = sum(p.nbytes for p in own) + sum(t.nbytes for _, t in leaf.named_buffers())
        grads = sum(p.nbytes for p in own if p.requires_grad)
        row.bytes["gradients"] = grads
        row.bytes["optimizer"] = int(grads * per_grad_byte)
        rows.append(row)
        by_owner[id(leaf)] = row
    other = LayerRow("(composites, loss)", "")
    for slot in slots:
        row = by_owner.get(id(slot.owner), other)
        kind = "activations" if slot.phase == "forward" else ("grads_in_flight" if slot.escaped else "workspace")
        row.bytes[kind] += slot.nbytes
    if any(other.bytes.values()):
        rows.append(other)
    return rows
