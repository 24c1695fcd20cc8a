"""BufferPool: per-operator output and workspace arrays that are allocated once and reused."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from neuroflow.allocators.base import Allocator


class BufferPool:
    """Hands each (operator, key) the same array every step, so a steady-state step allocates nothing.

    A request with a smaller leading dimension than the held buffer (the last,
    short batch of an epoch) gets a leading slice of it, not a new array.
    """

    def __init__(self, allocator: Allocator) -> None:
        self.allocator = allocator
        self._held: dict[tuple[int, str], Any] = {}

    def get(self, owner: object, key: str, shape: tuple[int, ...], dtype: Any) -> Any:
        slot = (id(owner), key)
        held = self._held.get(slot)
        if held is not None and held.dtype == dtype:
            if held.shape == shape:
                return held
            if held.ndim == len(shape) and held.shape[1:] == shape[1:] and held.shape[0] >= shape[0]:
                return held[: shape[0]]
        array = self.allocator.allocate(shape, dtype)
        self._held[slot] = array
        return array

    def clear(self) -> None:
        self._held.clear()

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self._held.values())
