"""BufferPool: per-operator output and workspace arrays, allocated once (or planned) and reused."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from neuroflow.errors import OutOfMemoryError

if TYPE_CHECKING:
    from neuroflow.allocators.base import Allocator
    from neuroflow.buffers.planner import Plan


class BufferPool:
    """Hands each (operator, key) the same array every step, so a steady-state step allocates nothing.

    With a ``plan``, every traced buffer is a view at its planned offset of
    the allocator's arena, so buffers whose lifetimes never overlap share
    memory. A request with a smaller leading dimension than the held buffer
    (the last, short batch of an epoch) gets a leading slice of it; a larger
    or unforeseen request is allocated once through the allocator and kept.

    Workspaces (transient buffers of one call, see ``TracingPool.workspace``)
    are planned like any buffer; without a plan, every op shares one array
    per key, grown to the largest request.
    """

    tracing = False
    #: True while every parameter gradient is known to be zero when a backward starts (no accumulation):
    #: ops may then write weight gradients straight into ``param.grad`` instead of adding a workspace.
    grads_zeroed = False
    #: Set by a Trainer that updates inside backward: ``sink(param, gradient)`` applies ``param``'s update and
    #: returns True when it takes that parameter's gradients (see ``Operator.accumulate_grad``).
    gradient_sink: Any = None
    #: A step's :class:`~neuroflow.replay.Recording` while a Trainer records one: composites report their layers.
    recording: Any = None

    def __init__(self, allocator: Allocator, plan: Plan | None = None, strict: bool = False) -> None:
        #: ids of the parameters whose gradient an op wrote whole into ``param.grad`` (see
        #: ``Operator.writes_whole_gradient``): the next step need not zero them first.
        self.whole_gradients: set[int] = set()
        self.allocator = allocator
        self.plan = plan
        self.strict = strict
        self._held: dict[tuple[int, str], Any] = {}
        self._shared: dict[tuple[str, str], Any] = {}
        if plan is not None:
            view = allocator.view  # type: ignore[attr-defined]
            for slot in plan.slots:
                self._held[(id(slot.owner), slot.key)] = view(slot.offset, slot.shape, slot.dtype)

    def get(self, owner: object, key: str, shape: tuple[int, ...], dtype: Any) -> Any:
        slot = (id(owner), key)
        held = self._held.get(slot)
        if held is not None and held.dtype == dtype:
            if held.shape == shape:
                return held
            if held.ndim == len(shape) and held.shape[1:] == shape[1:] and held.shape[0] >= shape[0]:
                return held[: shape[0]]
        if held is not None and held.base is not None:
            # the replaced buffer goes back to the allocator, planned pool or not (a planned view is no allocation
            # of the allocator's, and freeing it does nothing): else every new shape for a slot keeps the old one
            self.allocator.free(held)
        array = self._allocate(shape, dtype)
        self._held[slot] = array
        return array

    def _allocate(self, shape: tuple[int, ...], dtype: Any) -> Any:
        try:
            return self.allocator.allocate(shape, dtype)
        except OutOfMemoryError:
            if self.strict:  # a budget or pool size was set: never grow past it
                raise
            array = self.allocator.xp.empty(shape, dtype)
            self.allocator.count_allocation(int(array.nbytes))
            return array

    def workspace(self, owner: object, key: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """A transient buffer for ``owner``'s current call; valid until that call's ``retire``."""
        if self.plan is not None:
            return self.get(owner, key, shape, dtype)
        slot = (key, str(dtype))
        held = self._shared.get(slot)
        if held is not None and held.ndim == len(shape) and held.shape[1:] == shape[1:] and held.shape[0] >= shape[0]:
            return held[: shape[0]]
        if held is not None:
            self.allocator.free(held)
        array = self._allocate(shape, dtype)
        self._shared[slot] = array
        return array

    # Lifetime events matter only while tracing; a planned pool ignores them.
    def retire(self, array: Any) -> None:
        pass

    def handoff(self, consumed: Any, produced: Any, owner: Any) -> None:
        pass

    def keep(self, array: Any) -> None:
        pass

    def release(self, array: Any, kept: bool = False) -> None:
        pass

    def done(self, owner: Any) -> None:
        pass

    def clear(self) -> None:
        self._held.clear()
        self._shared.clear()

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in (*self._held.values(), *self._shared.values()))
