"""The planner: places traced buffers at offsets of one arena so buffers that never live together share memory.

Placement is the interval-graph problem of static memory planning: each
buffer is an interval in time and a block in address space; two buffers may
overlap in address space only if their lifetimes are disjoint. Buffers are
placed largest first, each at the lowest aligned offset that does not collide
with an already placed buffer alive at the same time (greedy by size, the
heuristic TFLite and others use; within a few percent of the max-live lower
bound on chain-shaped networks).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from neuroflow.allocators.base import ALIGNMENT
from neuroflow.buffers.trace import Slot


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


@dataclass
class Plan:
    """Offsets for every traced buffer, the arena size they need, and the lower bound it is measured against."""

    slots: list[Slot]
    arena_bytes: int
    max_live_bytes: int

    @property
    def fragmentation(self) -> float:
        """Arena size over the most bytes ever alive at once (1.0 is perfect packing)."""
        return self.arena_bytes / self.max_live_bytes if self.max_live_bytes else 1.0

    @property
    def unshared_bytes(self) -> int:
        """What the same buffers would take if each had memory of its own."""
        return sum(_align(s.nbytes) for s in self.slots)


def max_live_bytes(slots: Sequence[Slot]) -> int:
    """The most bytes alive at any one time: no placement can use less."""
    events = []
    for s in slots:
        events.append((s.start, 1, _align(s.nbytes)))
        events.append((s.end + 1, 0, -_align(s.nbytes)))
    live = peak = 0
    for _, _, delta in sorted(events):
        live += delta
        peak = max(peak, live)
    return peak


#: Orders the greedy placement tries; the smallest arena wins. Largest first wins on most models, request
#: order on a few deep ones (by about 1 %), longest-lived first where long-lived activations and short
#: large workspaces interleave (the small CNN of benchmarks/cnn.py: 25.4 MiB against 26.9 and 27.3).
ORDERS = {
    "largest first": lambda s: (-s.nbytes, s.start),
    "request order": lambda s: s.start,
    "longest-lived first": lambda s: (s.start - s.end, -s.nbytes),
}


def place(slots: Sequence[Slot]) -> Plan:
    """Assign ``slot.offset`` for every slot; return the Plan (the best of the :data:`ORDERS`)."""
    best: tuple[int, list[int]] | None = None
    for key in ORDERS.values():
        arena = _place_in_order(slots, sorted(slots, key=key))
        if best is None or arena < best[0]:
            best = (arena, [s.offset for s in slots])
    arena, offsets = best if best is not None else (0, [])
    for slot, offset in zip(slots, offsets):
        slot.offset = offset
    return Plan(list(slots), arena, max_live_bytes(slots))


def _place_in_order(slots: Sequence[Slot], order: Sequence[Slot]) -> int:
    placed: list[Slot] = []
    arena = 0
    for slot in order:
        size = _align(slot.nbytes)
        conflicts = sorted(
            (p.offset, p.offset + _align(p.nbytes)) for p in placed if p.start <= slot.end and slot.start <= p.end
        )
        offset = 0
        for lo, hi in conflicts:
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        slot.offset = offset
        placed.append(slot)
        arena = max(arena, offset + size)
    return arena
