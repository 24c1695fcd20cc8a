"""Batches whose sample shape changes: each change re-plans once, and neither the pool nor the arena grows."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops, registry
from neuroflow.allocators.arena import ArenaAllocator
from neuroflow.buffers.planner import place
from neuroflow.buffers.pool import BufferPool
from neuroflow.buffers.trace import Slot

NUMPY_DATA = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
SIZES = (32, 28)
ROUNDS = 6


def any_size_cnn() -> nf.Sequential:
    """A model that takes 32×32 and 28×28 images alike: convolution, global pooling, a linear head."""
    if "Conv2d" not in registry.ops.names() or "GlobalAvgPool2d" not in registry.ops.names():
        pytest.skip("needs the vision ops (neuroflow-ops-vision)")
    nf.manual_seed(0)
    conv, pool = registry.ops.get("Conv2d"), registry.ops.get("GlobalAvgPool2d")
    return nf.Sequential(conv(1, 8, 3, padding=1), ops.ReLU(), pool(), ops.Flatten(), ops.Linear(8, 10))


def batches() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {s: (rng.standard_normal((16, 1, s, s)).astype(np.float32), rng.integers(0, 10, 16)) for s in SIZES}


def trainer(**options: object) -> nf.Trainer:
    return nf.Trainer(any_size_cnn(), optimizer=nf.optim.SGD(lr=0.1), batch_size=16, seed=1, progress=False,
                      **options)


@pytest.mark.parametrize("options", [{}, {"memory_budget_mb": 12}], ids=["no budget", "budget 12 MB"])
def test_alternating_sample_shapes_settle_and_train_as_on_one_shape_each(options):
    data = batches()
    alternating = trainer(**options)
    losses, stats, numpy_bytes = [], [], []
    tracemalloc.start()
    try:
        for _ in range(ROUNDS):
            for size in SIZES:
                losses.append(alternating.train_step(*data[size]))
                stats.append(alternating.memory_stats())  # raised OutOfMemoryError in round 4 under the budget
            numpy_bytes.append(tracemalloc.take_snapshot().filter_traces([NUMPY_DATA]).statistics("filename"))
    finally:
        tracemalloc.stop()

    # Each shape change re-plans into a fresh arena (its counters start anew): a step on a shape holds that shape's
    # plan and nothing of the other's, every round alike.
    for size_index, _ in enumerate(SIZES):
        seen = stats[size_index::len(SIZES)]
        assert {s.in_use_bytes for s in seen} == {seen[0].in_use_bytes}
        assert {s.allocations for s in seen} == {1}
        assert {s.pool_bytes for s in seen} == {seen[0].pool_bytes}
    assert max(s.in_use_bytes for s in stats) < 2 * 2**20  # one step needs ~1.2 MiB
    # the replaced arenas are released, not merely uncounted: the process holds no more numpy memory after round 6
    # than after round 2 (an arena or a 32×32 activation, kept, would be 0.5 MiB or more)
    held = [sum(stat.size for stat in snapshot) for snapshot in numpy_bytes]
    assert max(held[2:]) - held[1] < 256 * 2**10

    # Re-planning changes no arithmetic: the losses are those of the same steps taken by the direct allocator,
    # which plans nothing and gives every request a fresh array.
    direct = trainer(allocator="direct")
    expected = [direct.train_step(*data[size]) for _ in range(ROUNDS) for size in SIZES]
    assert losses == expected


def test_a_planned_pool_frees_the_buffer_a_new_shape_replaces():
    owner = object()
    allocator = ArenaAllocator(np)
    plan = place([Slot(owner, "out", (4, 8), np.float32, 128, 0, "forward", end=1)])
    allocator.reserve(64 * 2**10, plan.arena_bytes)
    pool = BufferPool(allocator, plan, strict=True)
    in_use = []
    for _ in range(20):  # 20 × (5 KiB + 4.5 KiB) would not fit the 64 KiB arena if nothing were freed
        for shape in ((4, 320), (4, 288)):
            out = pool.get(owner, "out", shape, np.float32)
            assert out.shape == shape
        in_use.append(allocator.stats().in_use_bytes)
    assert in_use[1:] == in_use[:-1]
    assert in_use[-1] <= plan.arena_bytes + 4 * 288 * 4 + 64
