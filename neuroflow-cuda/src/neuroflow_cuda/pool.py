"""Where CuPy's device memory comes from while the cuda backend is in use.

NeuroFlow's arena (``neuroflow.allocators.arena``) asks ``xp.empty`` for one
block and hands out views of it. Under CuPy's default pool that block would
stay cached after it is freed (a re-plan for a larger batch would then hold
two arenas), and the pool would grow without bound with temporaries. So the
backend installs a :class:`RoutedAllocator`: big requests (the arena, the flat
parameter, gradient and optimizer buffers) get a device allocation of their
own that is returned to the driver when freed; small temporaries (reductions,
index arrays) come from a pool whose size is capped.

The routing itself knows nothing of CuPy: it is given the two allocation
functions, so its decisions and counters are tested on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_DIRECT_THRESHOLD = 8 * 2**20
DEFAULT_SCRATCH_LIMIT = 256 * 2**20


@dataclass
class RoutingCounters:
    """Device allocations made: direct ones (never cached) and pool growths, each with their bytes."""

    direct_allocations: int = 0
    direct_bytes: int = 0
    pool_requests: int = 0
    device_allocations: int = 0


class RoutedAllocator:
    """A CuPy allocator function: ``nbytes`` ≥ ``direct_threshold`` go to ``direct``, the rest to ``pooled``.

    ``direct(nbytes)`` must make a fresh device allocation released when its
    pointer is dropped; ``pooled(nbytes)`` takes from a capped, caching pool.
    ``count_device_allocation`` is called by the pool's own underlying
    allocator so that ``counters.device_allocations`` counts every real
    device allocation, direct or pool growth: the number a steady-state
    training step must not change.
    """

    def __init__(self, direct: Callable[[int], Any], pooled: Callable[[int], Any],
                 direct_threshold: int = DEFAULT_DIRECT_THRESHOLD) -> None:
        if direct_threshold < 0:
            raise ValueError(f"direct_threshold must be >= 0 bytes; got {direct_threshold}")
        self._direct = direct
        self._pooled = pooled
        self.direct_threshold = int(direct_threshold)
        self.counters = RoutingCounters()

    def __call__(self, nbytes: int) -> Any:
        if nbytes >= self.direct_threshold:
            self.counters.direct_allocations += 1
            self.counters.direct_bytes += int(nbytes)
            self.counters.device_allocations += 1
            return self._direct(nbytes)
        self.counters.pool_requests += 1
        return self._pooled(nbytes)

    def count_device_allocation(self, allocate: Callable[[int], Any]) -> Callable[[int], Any]:
        """Wrap the pool's underlying device allocator so its growths are counted."""

        def counted(nbytes: int) -> Any:
            self.counters.device_allocations += 1
            return allocate(nbytes)

        return counted


def install(cupy: Any, scratch_limit: int = DEFAULT_SCRATCH_LIMIT,
            direct_threshold: int = DEFAULT_DIRECT_THRESHOLD) -> tuple[RoutedAllocator, Any]:
    """Route CuPy's allocations for this process; returns the router and the capped scratch pool."""

    def direct(nbytes: int) -> Any:
        return cupy.cuda.MemoryPointer(cupy.cuda.Memory(nbytes), 0)

    # The router is built first so the pool's growths can be counted through it.
    holder: dict[str, Any] = {}
    router = RoutedAllocator(direct, lambda n: holder["pool"].malloc(n), direct_threshold)
    pool = cupy.cuda.MemoryPool(router.count_device_allocation(direct))
    pool.set_limit(size=int(scratch_limit))
    holder["pool"] = pool
    # Blocks CuPy's default pool cached before we took over would otherwise stay reserved forever.
    cupy.get_default_memory_pool().free_all_blocks()
    cupy.cuda.set_allocator(router)
    return router, pool
