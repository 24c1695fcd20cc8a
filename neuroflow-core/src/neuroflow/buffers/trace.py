"""TracingPool: runs one training step while recording every buffer's size and lifetime.

The planner needs, for each (operator, key) buffer, when it is first
requested and when it is last needed. Requests are seen directly; ends are
derived from two events that composites report while tracing:

- ``handoff(consumed, produced, owner)`` after ``owner.backward`` returned
  ``produced`` from ``consumed``: the owner (and everything under it) is done,
  so its forward caches and backward scratch die now; ``consumed`` dies now
  unless ``produced`` is a view of it; ``produced`` lives until released.
- ``release(array)``: the caller has read ``array`` for the last time.
- ``keep(array)`` … ``release(array, kept=True)``: a composite reads
  ``array`` (its ``grad_out``) again after handing it to a child (a
  residual's shortcut), so the child's handoff does not end it.
- ``drop(array, result, reader)``: a forward output that its producer's
  backward does not read (``backward_reads_output`` false) dies with its
  consumer: at once when the consumer's backward does not read it either
  (a convolution's output after the ReLU that read it), else when the
  consumer is done (a max-pool's output after the convolution it feeds).

A buffer handed out of a backward and never released lives to the end of
the step, so an operator that reports nothing is planned safely, only less
tightly. A *workspace* (``workspace(owner, key, ...)``) is transient: it
lives from its request until the op calls ``retire(array)`` at the end of
the call that used it.

The traced step runs on real memory, so the pool reuses it as the plan
will: a workspace's memory goes back at its retirement, an operator's own
buffers (forward caches, backward scratch) when the operator is done, and a
gradient it handed out when that gradient is consumed or released and no
composite keeps it. The first step then needs about the planned arena, not
the sum of all buffers.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from neuroflow.allocators.base import ALIGNMENT
from neuroflow.buffers.heap import return_freed_heap


@dataclass
class Slot:
    """One buffer of a traced step: who asked, how big, and when it lives."""

    owner: Any
    key: str
    shape: tuple[int, ...]
    dtype: Any
    nbytes: int
    start: int
    phase: str
    end: int = -1
    escaped: bool = False
    released_at: int = -1
    dropped_at: int = -1
    transient: bool = False
    retired_at: int = -1
    index: int = 0
    offset: int = 0
    address: int = field(default=0, repr=False)


class TracingPool:
    """A buffer pool that allocates fresh arrays and records their lifetimes for the planner."""

    tracing = True
    grads_zeroed = False
    gradient_sink: Any = None  # as BufferPool's
    #: A step's :class:`~neuroflow.replay.Recording` while a Trainer records one: composites report their layers.
    recording: Any = None

    def __init__(self, xp: Any) -> None:
        self.xp = xp
        self.whole_gradients: set[int] = set()  # as BufferPool's, handed to the planned pool
        self.slots: list[Slot] = []
        self._by_owner_key: dict[tuple[int, str], Slot] = {}
        self._done: dict[int, int] = {}
        self.time = 0
        self.phase = "forward"
        self.reused_key: tuple[str, str] | None = None
        self._arrays: list[Any] = []
        self._by_array: dict[int, Slot] = {}
        # Memory is a few 1-D byte arrays (on the host, one reservation the size of physical memory that costs only
        # the pages it touches); a slot holds a byte range of one (split from a free range, merged back with its
        # free neighbours when it dies), so dead small buffers of any dtype can serve a later large one.
        self._bases: list[Any] = []
        self._blocks: dict[int, tuple[int, int, int]] = {}  # slot index -> (base, start, stop) while it holds one
        self._free: list[tuple[int, int, int]] = []  # ranges of dead buffers, for later requests
        self._owned: dict[int, list[Slot]] = {}  # id(module) -> its slots, until the module is done
        self._kept: dict[int, int] = {}  # slot index -> how many composites will read it again
        self._tied: dict[int, list[Slot]] = {}  # id(module) -> outputs whose last reader it is

    def _tick(self) -> int:
        self.time += 1
        return self.time

    def get(self, owner: object, key: str, shape: tuple[int, ...], dtype: Any) -> Any:
        slot_key = (id(owner), key)
        known = self._by_owner_key.get(slot_key)
        if known is not None:
            # An op asking again for one key (scratch shared by its forward and backward) gets the same buffer,
            # as from a planned pool; a different shape means a layer used twice, which cannot be planned by key.
            if known.shape == tuple(shape) and known.dtype == np.dtype(dtype):
                if known.index in self._blocks:
                    return self._arrays[known.index]
                if known.transient or known.escaped:  # asked for again after its memory went back: it lives on
                    known.retired_at = -1
                    return self._hold(known, shape, dtype)
                if known.dropped_at >= 0:
                    raise RuntimeError(
                        f"{owner!r} asked for its buffer {key!r} again after its output was dropped; an op whose "
                        "backward reads its output (through the pool or otherwise) must keep backward_reads_output "
                        "True"
                    )
            self.reused_key = (repr(owner), key)
        slot = Slot(owner, key, tuple(shape), np.dtype(dtype), math.prod(shape) * np.dtype(dtype).itemsize,
                    self._tick(), self.phase, index=len(self.slots))
        self.slots.append(slot)
        self._arrays.append(None)
        self._by_owner_key[slot_key] = slot
        self._owned.setdefault(id(owner), []).append(slot)
        return self._hold(slot, shape, dtype)

    def workspace(self, owner: object, key: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """A transient buffer of ``owner``: it lives until ``retire(array)``."""
        array = self.get(owner, key, shape, dtype)
        self._by_array[id(array)].transient = True
        return array

    def retire(self, array: Any) -> None:
        """``array``, a workspace, is dead: its memory may serve the next request."""
        slot = self._by_array.get(id(array))
        if slot is not None and slot.transient:
            slot.retired_at = self._tick()
            self._recycle(slot)

    def _hold(self, slot: Slot, shape: tuple[int, ...], dtype: Any) -> Any:
        """Give ``slot`` memory: the lowest free byte range that fits (first fit, as the planner places
        buffers in request order), else a new base."""
        dtype = np.dtype(dtype)
        count = math.prod(shape)
        size = -(-max(count, 1) * dtype.itemsize // ALIGNMENT) * ALIGNMENT
        fits = [i for i, (_, lo, hi) in enumerate(self._free) if hi - lo >= size]
        if fits:
            base, lo, hi = self._free.pop(min(fits, key=lambda i: self._free[i][:2]))
            if hi > lo + size:
                self._free.append((base, lo + size, hi))
        else:
            base, lo = len(self._bases), 0
            held = sum(b.shape[0] for b in self._bases)
            memory = _reserved_bytes(self.xp, size) if not self._bases else None
            # Else at least a quarter of what is held already: later neighbours then share a base and merge when
            # they die, and the untouched tail costs no resident memory.
            self._bases.append(memory if memory is not None else self.xp.empty(max(size, held // 4), np.uint8))
            if self._bases[base].shape[0] > size:
                self._free.append((base, size, self._bases[base].shape[0]))
        array = self._bases[base][lo:lo + count * dtype.itemsize].view(dtype).reshape(shape)
        slot.address = _address(array)
        old = self._arrays[slot.index]
        if old is not None:
            self._by_array.pop(id(old), None)
        self._arrays[slot.index] = array
        self._by_array[id(array)] = slot
        self._blocks[slot.index] = (base, lo, lo + size)
        return array

    def _recycle(self, slot: Slot) -> None:
        held = self._blocks.pop(slot.index, None)
        if held is None:
            return
        base, lo, hi = held
        for i in reversed(range(len(self._free))):  # merge with the free neighbours
            b, flo, fhi = self._free[i]
            if b == base and (fhi == lo or flo == hi):
                lo, hi = min(lo, flo), max(hi, fhi)
                del self._free[i]
        self._free.append((base, lo, hi))

    def _slot_of(self, array: Any) -> Slot | None:
        if array is None:
            return None
        address = _address(array)
        for slot in reversed(self.slots):
            if slot.address <= address < slot.address + max(slot.nbytes, 1):
                return slot
        return None

    def handoff(self, consumed: Any, produced: Any, owner: Any) -> None:
        now = self._tick()
        finished = []
        for module in owner.modules() if hasattr(owner, "modules") else [owner]:
            if id(module) not in self._done:
                self._done[id(module)] = now
                finished.append(id(module))
        source, result = self._slot_of(consumed), self._slot_of(produced)
        if result is not None and result is not source:
            result.escaped = True
        if source is not None and source is not result:
            source.released_at = max(source.released_at, now)
            self._end_gradient(source)
        # A finished operator reads its own buffers no more, nor the outputs tied to it as their last reader;
        # a gradient it handed out ends when consumed.
        for module_id in finished:
            for slot in self._tied.pop(module_id, []):
                if not slot.escaped:
                    self._end_dropped(slot)
            for slot in self._owned.pop(module_id, []):
                if not slot.escaped and not slot.transient:
                    self._recycle(slot)

    def keep(self, array: Any) -> None:
        """The caller reads ``array`` again after handing it on: it lives until ``release(array, kept=True)``."""
        slot = self._slot_of(array)
        if slot is not None:
            self._kept[slot.index] = self._kept.get(slot.index, 0) + 1

    def release(self, array: Any, kept: bool = False) -> None:
        """The caller has read ``array`` for the last time (``kept``: it had called ``keep(array)``)."""
        slot = self._slot_of(array)
        if slot is None:
            return
        slot.released_at = max(slot.released_at, self._tick())
        if kept and self._kept.get(slot.index, 0) > 0:
            self._kept[slot.index] -= 1
        self._end_gradient(slot)

    def _end_gradient(self, slot: Slot) -> None:
        """A handed-out gradient nobody keeps is dead: its memory may serve the next request."""
        if slot.escaped and not slot.transient and not self._kept.get(slot.index, 0):
            self._recycle(slot)

    def drop(self, output: Any, consumer_result: Any, reader: Any = None) -> None:
        """``output``, a layer's forward result that its producer's backward does not read, was just read by
        its consumer's forward, which returned ``consumer_result``. With ``reader`` (the consumer, whose
        backward reads its input) the output dies when the reader is done; without, it dies now, unless the
        result is a view of it. Either way its producer, which lives on, no longer holds it. Also for an
        output nobody reads again before the step ends: one recomputed in backward later, or one its
        producer's backward has just read for the last time."""
        slot = self._slot_of(output)
        if slot is None or slot.escaped or slot.transient:
            return
        if reader is not None:
            self._tied.setdefault(id(reader), []).append(slot)
        elif slot is not self._slot_of(consumer_result):
            self._end_dropped(slot)

    def _end_dropped(self, slot: Slot) -> None:
        slot.dropped_at = self._tick()
        self._recycle(slot)

    def done(self, owner: Any) -> None:
        """``owner`` will read none of its buffers again in this step (losses, the root model)."""
        self.handoff(None, None, owner)

    def finish(self) -> list[Slot]:
        """Close the trace: give every slot its end time and return the slots."""
        end_of_step = self._tick()
        for slot in self.slots:
            done = self._done.get(id(slot.owner), end_of_step)
            if slot.transient and slot.retired_at >= 0:
                slot.end = slot.retired_at
            elif slot.escaped:
                slot.end = slot.released_at if slot.released_at >= 0 else end_of_step
            elif slot.dropped_at >= 0:
                slot.end = slot.dropped_at
            else:
                slot.end = max(done, slot.released_at)
            slot.end = max(slot.end, slot.start)
        return self.slots

    def forget(self, modules: Any) -> None:
        """Drop the traced arrays, and every operator attribute still pointing at one.

        Ops keep caches until their next forward; left alone, the traced
        step's arrays would live on beside the arena during the next step.
        """
        traced = {id(a) for a in self._arrays} | {id(b) for b in self._bases}

        def holds_traced(value: Any, depth: int = 0) -> bool:
            if isinstance(value, (tuple, list)):
                return depth < 3 and any(holds_traced(v, depth + 1) for v in value)
            if isinstance(value, dict):
                return depth < 3 and any(holds_traced(v, depth + 1) for v in value.values())
            for _ in range(4):  # a reshape of a slice of a traced array is still a traced array
                if value is None:
                    return False
                if id(value) in traced:
                    return True
                value = getattr(value, "base", None)
            return False

        for module in modules:
            for name, value in list(vars(module).items()):
                if not name.startswith("__") and holds_traced(value):
                    object.__setattr__(module, name, None)
        self._arrays.clear()
        self._by_array.clear()
        self._blocks.clear()
        self._free.clear()
        self._bases.clear()
        if self.xp is np:
            return_freed_heap()


def _reserved_bytes(xp: Any, least: int) -> Any:
    """On the host, one byte array as large as physical memory that costs only the pages it touches, so the
    traced step's first-fit placement is bounded by what it uses, not by how bases were cut; None elsewhere
    (a device allocates what it is asked for) or where the OS will not reserve it."""
    if xp is not np or not hasattr(mmap, "MAP_PRIVATE") or not hasattr(os, "sysconf"):
        return None
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        flags = mmap.MAP_PRIVATE | getattr(mmap, "MAP_ANONYMOUS", 0) | getattr(mmap, "MAP_NORESERVE", 0)
        memory = mmap.mmap(-1, max(physical, least), flags=flags)
    except (OSError, ValueError, OverflowError):
        return None
    return np.frombuffer(memory, np.uint8)


def _address(array: Any) -> int:
    interface = getattr(array, "__array_interface__", None) or getattr(array, "__cuda_array_interface__", None)
    if interface is not None:
        return int(interface["data"][0])
    data = getattr(array, "data", None)
    return int(getattr(data, "ptr", 0))
