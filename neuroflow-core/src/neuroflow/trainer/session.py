"""MemorySession: the memory a Trainer trains in, from the packed parameters to the planned arena.

The session packs the model's parameters and gradients into one flat buffer
each and binds the optimizer to them; it traces the first step, turns the
trace into a plan and reserves the arena, and lends the planned pool to the
model for the length of one trainer call, one call at a time. The fitting of batch ×
accumulation to a memory budget is in :mod:`neuroflow.trainer.budget`.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from neuroflow.allocators.arena import ArenaAllocator
from neuroflow.backends.base import Backend
from neuroflow.buffers.flat import FlatParameters
from neuroflow.buffers.planner import Plan, place
from neuroflow.buffers.pool import BufferPool
from neuroflow.buffers.trace import TracingPool
from neuroflow.composites import input_layer
from neuroflow.errors import ConfigError, OutOfMemoryError
from neuroflow.fusion import fuse
from neuroflow.layout_pass import plan_layouts
from neuroflow.lora import mark_only_lora_as_trainable
from neuroflow.losses.base import Loss
from neuroflow.memory.compression import GradientCompressor
from neuroflow.memory.offload import OffloadManager
from neuroflow.operator import Operator, attach_pool_each, structure_generation
from neuroflow.optim.base import Optimizer
from neuroflow.optim.streaming import StreamedUpdates
from neuroflow.registry import allocators
from neuroflow.trainer import budget
from neuroflow.trainer.options import TrainerOptions


class MemorySession:
    """Flat parameters, the buffer pool and its plan for one model, loss and optimizer on one backend.

    ``batch_size`` and ``accumulation`` start as the options ask and are
    what a memory budget chose once :func:`budget.fit_to_budget` has run.

    ``lock`` is held by every call that runs the model (:meth:`lend`) or
    packs it anew (:meth:`ready`, :meth:`use_model`): the planned buffers
    and the forward state every op keeps on itself belong to the model, so
    calls from several threads take turns, each waiting for the one running.
    """

    def __init__(self, model: Operator, loss: Loss, optimizer: Optimizer, backend: Backend,
                 options: TrainerOptions, compressor: GradientCompressor | None) -> None:
        self.model, self.loss, self.optimizer, self.backend = model, loss, optimizer, backend
        self.options = options
        self.compressor = compressor
        self.batch_size = options.batch_size
        self.accumulation = options.gradient_accumulation_steps
        self.allocator_class = allocators.get(options.allocator_name)
        self.flat: FlatParameters | None = None
        self.pool: BufferPool | TracingPool | None = None
        self.plan: Plan | None = None
        self.planned_batch = 0
        self.sample_shape: tuple[int, ...] | None = None
        self.budget_checked = options.memory_budget_mb is None
        self.memory_report: Any = None
        self.offload: OffloadManager | None = None
        self.streamed: StreamedUpdates | None = None  # once updates run inside backward
        self.lock = threading.RLock()  # re-entrant: fit evaluates inside a training call, a hook may predict
        # What the last full check in _pack found, kept while nothing changed (see _packed_still): the operator
        # trees' generation, every parameter of the model with its requires_grad, and the modules lend() lends
        # the pool to (None where one overrides attach_pool: lend then calls the model's).
        self._packed_at: tuple[int, Operator, FlatParameters] | None = None
        self._all_params: list[Any] = []
        self._trainable_flags: list[bool] = []
        self._lent_to: list[Operator] | None = None

    # ------------------------------------------------------------------ placing and packing
    def ready(self) -> FlatParameters:
        """Place the model on the backend, pack its parameters and bind the optimizer (once); the flat buffers.

        Each call checks that the packing still holds: at once when no operator changed since the last full
        check (:func:`~neuroflow.operator.structure_generation`), every parameter keeps its ``requires_grad``
        and the packed ones still hold their views; otherwise by walking the model, as the first call does.
        """
        with self.lock:
            flat = self.flat
            if flat is not None and self._packed_still(flat):
                return flat
            flat = self._pack()
            self._remember_packing(flat)
            return flat

    def _packed_still(self, flat: FlatParameters) -> bool:
        packed = self._packed_at
        return (packed is not None and packed[0] == structure_generation() and packed[1] is self.model
                and packed[2] is flat and [p.requires_grad for p in self._all_params] == self._trainable_flags
                and flat.owns(flat.params))

    def _remember_packing(self, flat: FlatParameters) -> None:
        model = self.model
        self._all_params = model.parameters()
        self._trainable_flags = [p.requires_grad for p in self._all_params]
        modules = list(model.modules())
        default = Operator.attach_pool
        self._lent_to = modules if all(type(m).attach_pool is default for m in modules) else None
        self._packed_at = (structure_generation(), model, flat)

    def _pack(self) -> FlatParameters:
        if self.options.lora_fusion and self.flat is None:
            mark_only_lora_as_trainable(self.model)  # base weights read-only: no gradient, no optimizer state
        params = self.model.trainable_parameters()
        if self.flat is not None and self.flat.owns(params):
            return self.flat
        if not self.model.is_on(self.backend):
            self.model.to(self.backend)
            params = self.model.trainable_parameters()
        previous = self.flat
        flat = self.flat = FlatParameters(params, self.backend.xp)
        self.streamed = None  # packed anew, every gradient kept: a first step finds the streamed ones again
        if previous is None:
            self.optimizer.bind(flat, self.backend)
        else:  # the same model packed again (a layer frozen or unfrozen): the others keep their state
            self.optimizer.rebind(flat, self.backend)
        if self.compressor is not None:
            self.compressor.bind(flat, [n for n, p in self.model.named_parameters() if p.requires_grad])
        self.attach(None)
        fuse(self.model)
        plan_layouts(self.model)  # after fusion: the chains of feature-map ops run in their preferred layout
        first = input_layer(self.model)
        if first is not None:
            first.needs_input_grad = False  # the model's input needs no gradient
        if self.options.enable_async_unload:
            cold = [t for _, t in self.model.named_buffers()]
            cold += [p for p in self.model.parameters() if not p.requires_grad]
            capacity = max(budget.arena_room(self) or 0, 0)
            low_water = capacity // 4 if capacity else 64 * 2**20  # a quarter of the pool, or 64 MiB
            self.offload = OffloadManager(self.backend, cold, low_water)
        return flat

    def use_model(self, model: Operator) -> None:
        """Train and infer with ``model`` from now on: packed, planned and placed anew when next used."""
        with self.lock:
            self.attach(None)
            self.model, self.flat, self.plan, self.streamed = model, None, None, None
            self._packed_at, self._lent_to = None, None
            self.attach(None)

    def place_for_inference(self) -> None:
        """Put the model on the backend; nothing is packed or bound (a frozen model is fine)."""
        if not self.model.is_on(self.backend):
            self.model.to(self.backend)
            self.flat = None  # parameters were rebound; pack again before the next training step
        if self.offload is not None:
            self.offload.ensure_loaded()

    # ------------------------------------------------------------------ the pool
    def attach(self, pool: BufferPool | TracingPool | None) -> None:
        """Give the model and the loss ``pool`` (None: trace the next step anew)."""
        self.pool = pool
        if pool is not None:
            pool.gradient_sink = self.streamed
        self.model.attach_pool(pool)
        self.loss.attach_pool(pool)

    def lend(self) -> _Lending:
        """Run the model on the session's buffers for one call, and take them back after it (``with lend():``).

        Between trainer calls the model has no pool, so ``model.forward(x)``
        returns an array of its own, as users expect; inside a call, outputs
        are the planned buffers the next step reuses. A call from another
        thread waits here until the running one has ended (see ``lock``).
        """
        return _Lending(self)

    def lend_pool(self, pool: BufferPool | TracingPool | None) -> None:
        """``model.attach_pool(pool)`` (what :meth:`lend` does at each end), over the modules the last packing listed
        while the model is as it was."""
        packed, modules = self._packed_at, self._lent_to
        if modules is None or packed is None or packed[0] != structure_generation() or packed[1] is not self.model:
            self.model.attach_pool(pool)
            return
        attach_pool_each(modules, pool)

    # ------------------------------------------------------------------ one step's memory
    def prepare_step(self, flat: FlatParameters, sample_shape: tuple[int, ...], largest: int) -> None:
        """Before a step of micro-batches up to ``largest`` samples, once :meth:`ready` gave ``flat``: fitted to
        the budget, planned for them, loaded, and the gradients zeroed."""
        if not self.budget_checked:
            budget.fit_to_budget(self, sample_shape)
        if self.pool is not None and (largest > self.planned_batch or sample_shape != self.sample_shape):
            # a larger batch, or samples of another shape, than planned: trace and plan again; the old pool and its
            # arena go with this detach (finish_trace reserves a new one), so shapes that alternate re-plan at each
            # change and never accumulate buffers for the other shape
            self.attach(None)
        if self.offload is not None:
            self.offload.ensure_loaded()
        pool = self.pool
        whole = pool.whole_gradients if pool is not None and pool.grads_zeroed and self.streamed is None else ()
        flat.zero_grad(whole)

    def start_trace(self, sample_shape: tuple[int, ...]) -> TracingPool | None:
        """A tracing pool for this micro-batch when no plan exists yet (the first step, a larger batch, or samples of
        another shape)."""
        if self.pool is not None:
            return None
        tracer = TracingPool(self.backend.xp)
        tracer.grads_zeroed = self.grads_zeroed()
        self.sample_shape = sample_shape
        self.attach(tracer)
        return tracer

    def finish_trace(self, tracer: TracingPool, batch: int) -> None:
        """Turn the traced first step into a plan, reserve the arena and attach the planned pool."""
        slots = tracer.finish()
        tracer.forget([*self.model.modules(), self.loss])
        allocator = self.allocator_class(self.backend.xp)
        if tracer.reused_key is not None or not isinstance(allocator, ArenaAllocator):
            self.plan = None
            pool = BufferPool(allocator)
        else:
            plan = place(slots)
            capacity = budget.arena_capacity(self, plan.arena_bytes)
            if capacity is not None and plan.arena_bytes > capacity:
                raise OutOfMemoryError(
                    f"a training step at batch {batch} needs an arena of {plan.arena_bytes} bytes; "
                    f"the pool holds {capacity} bytes. {budget.advice(self, capacity)}"
                )
            allocator.reserve(capacity if capacity is not None else plan.arena_bytes, plan.arena_bytes)
            self.plan = plan
            pool = BufferPool(allocator, plan, strict=capacity is not None)
        pool.grads_zeroed = tracer.grads_zeroed and tracer.reused_key is None
        if pool.grads_zeroed:
            pool.whole_gradients = set(tracer.whole_gradients)
        self.backend.use_allocator(allocator)
        self.planned_batch = batch
        self.attach(pool)

    def grads_zeroed(self) -> bool:
        """Whether each backward starts from zero gradients: one micro-batch per step, no layer used twice."""
        modules = list(self.model.modules())
        return self.accumulation == 1 and len(modules) == len({id(m) for m in modules})

    def start_streaming(self) -> None:
        """After the first step: keep no gradient for the parameters whose ops write their gradient whole, apply
        their updates as backward produces those gradients, and trace the next step again, so that the plan holds
        each of them for the moment it lives."""
        pool, flat = self.pool, self.flat
        if pool is None or flat is None or not pool.grads_zeroed:
            raise ConfigError("update_in_backward needs each gradient written once per step: one micro-batch, "
                              "and no layer used twice in the model")
        streamed = {id(p): view for p, view in zip(flat.params, flat.slices) if id(p) in pool.whole_gradients}
        flat.drop_gradients(streamed)
        self.streamed = StreamedUpdates(self.optimizer, flat, streamed)
        self.attach(None)

    def check_streaming(self, clip_grad_norm: float | None) -> None:
        """Refuse ``update_in_backward`` with what needs every gradient of a step at once, or off the cpu."""
        options = self.options
        conflicts = [name for name, on in (
            ("clip_grad_norm", clip_grad_norm is not None),
            ("gradient_compression", self.compressor is not None),
            ("gradient_accumulation_steps > 1", options.gradient_accumulation_steps > 1),
            ("enable_async_unload", options.enable_async_unload),
        ) if on]
        if conflicts:
            raise ConfigError(f"update_in_backward applies each update before the step's other gradients exist; "
                              f"it cannot be combined with {', '.join(conflicts)}")
        if self.backend.xp is not np:
            raise ConfigError(f"update_in_backward runs on the cpu backend only; this trainer is on {self.backend.name!r}")


class _Lending:
    """The context :meth:`MemorySession.lend` returns: the session's lock held and its pool lent to the model for
    the block (a class rather than a generator-based context manager: entered once per step, it costs less)."""

    __slots__ = ("session",)

    def __init__(self, session: MemorySession) -> None:
        self.session = session

    def __enter__(self) -> None:
        session = self.session
        session.lock.acquire()
        try:
            pool = session.pool
            if pool is not None:
                session.lend_pool(pool)
        except BaseException:
            session.lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        session = self.session
        try:
            session.lend_pool(None)
        finally:
            session.lock.release()
