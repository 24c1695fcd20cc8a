"""Routing CuPy's allocations: big blocks (the arena) never stay cached, small temporaries go to a capped pool."""

from __future__ import annotations

import types
from typing import Any

import numpy as np
import pytest

from neuroflow.allocators.arena import ArenaAllocator
from neuroflow_cuda import pool
from neuroflow_cuda.pool import RoutedAllocator


def recording() -> tuple[list[int], Any]:
    calls: list[int] = []

    def allocate(nbytes: int) -> bytearray:
        calls.append(nbytes)
        return bytearray(nbytes)

    return calls, allocate


def test_requests_from_the_threshold_up_get_their_own_allocation() -> None:
    direct, direct_fn = recording()
    pooled, pooled_fn = recording()
    router = RoutedAllocator(direct_fn, pooled_fn, direct_threshold=1024)
    router(512)
    router(1024)
    router(4096)
    router(8)
    assert direct == [1024, 4096] and pooled == [512, 8]
    assert router.counters.direct_allocations == 2 and router.counters.direct_bytes == 5120
    assert router.counters.pool_requests == 2


def test_device_allocations_count_pool_growth_but_not_pool_hits() -> None:
    router = RoutedAllocator(lambda n: n, lambda n: n, direct_threshold=1 << 20)
    grow = router.count_device_allocation(lambda n: n)
    cache: dict[int, int] = {}

    def pooled(nbytes: int) -> int:  # a caching pool: grows once per size
        if nbytes not in cache:
            cache[nbytes] = grow(nbytes)
        return cache[nbytes]

    router._pooled = pooled
    for _ in range(5):
        router(256)
    router(2 << 20)
    assert router.counters.device_allocations == 2  # one growth, one direct
    assert router.counters.pool_requests == 5


def test_a_negative_threshold_is_refused() -> None:
    with pytest.raises(ValueError, match="direct_threshold must be >= 0 bytes; got -1"):
        RoutedAllocator(lambda n: n, lambda n: n, direct_threshold=-1)


def test_install_caps_the_pool_empties_the_default_one_and_routes_cupy() -> None:
    events: list[Any] = []

    class Pool:
        def __init__(self, allocator: Any) -> None:
            self.allocator = allocator

        def set_limit(self, size: int) -> None:
            events.append(("limit", size))

        def malloc(self, nbytes: int) -> Any:
            return ("pooled", self.allocator(nbytes))

    class Default:
        def free_all_blocks(self) -> None:
            events.append("default freed")

    cuda = types.SimpleNamespace(
        Memory=lambda n: ("memory", n), MemoryPointer=lambda mem, offset: ("pointer", mem, offset),
        MemoryPool=Pool, set_allocator=lambda fn: events.append(("allocator", fn)),
    )
    cupy = types.SimpleNamespace(cuda=cuda, get_default_memory_pool=lambda: Default())
    router, scratch = pool.install(cupy, scratch_limit=1000, direct_threshold=100)
    assert ("limit", 1000) in events and "default freed" in events and ("allocator", router) in events
    assert router(100) == ("pointer", ("memory", 100), 0)
    assert router(10) == ("pooled", ("pointer", ("memory", 10), 0))
    assert router.counters.device_allocations == 2


def test_the_arena_is_one_block_and_planned_offsets_are_views_of_it() -> None:
    # The arena logic the cuda backend relies on, exercised with numpy: one allocation, views at offsets.
    arena = ArenaAllocator(np, capacity=4096, planned_bytes=1024)
    a = arena.view(0, (16,), np.float32)
    b = arena.view(64, (4, 4), np.float32)
    a[...] = 1.0
    b[...] = 2.0
    assert arena.stats().allocations == 1
    assert np.shares_memory(a, arena.block) and np.shares_memory(b, arena.block)
    assert arena.block[:64].view(np.float32).tolist() == [1.0] * 16
