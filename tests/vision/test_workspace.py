"""Shared workspaces: steady-state steps allocate nothing; memory is the largest request, not a sum."""

from __future__ import annotations

import numpy as np

import neuroflow as nf
from neuroflow.allocators.direct import DirectAllocator
from neuroflow.memory import BufferPool
from neuroflow_ops_vision import Conv2d, neuroflow_cnn, workspace


def test_steady_state_steps_allocate_nothing(rng: np.random.Generator) -> None:
    model = neuroflow_cnn(num_classes=10, width=8)
    allocator = DirectAllocator(np)
    model.attach_pool(BufferPool(allocator))
    loss = nf.losses.CrossEntropy()
    x, y = rng.random((8, 1, 16, 16)).astype(np.float32), rng.integers(0, 10, 8)

    def step() -> None:
        model.zero_grad()
        loss.forward(model.forward(x), y)
        model.backward(loss.backward())

    step()
    allocations, held = allocator.stats().allocations, workspace.held_bytes()
    for _ in range(3):
        step()
    assert allocator.stats().allocations == allocations
    assert workspace.held_bytes() == held


def test_workspace_is_shared_between_layers(rng: np.random.Generator) -> None:
    workspace.release()
    convs = [Conv2d(16, 16, 3, padding=1, layout="NHWC", max_workspace_bytes=None) for _ in range(4)]
    x = rng.standard_normal((4, 8, 8, 16)).astype(np.float32)
    for conv in convs:
        conv.keep_columns = False
        x = conv.forward(x)
    columns = 4 * 8 * 8 * 9 * 16 * 4
    assert columns <= workspace.held_bytes() < 2 * columns  # one column buffer for all four layers
    workspace.release()
    assert workspace.held_bytes() == 0


def test_scratch_grows_and_reshapes() -> None:
    a = workspace.scratch(np, "test.role", (2, 3), np.float32)
    b = workspace.scratch(np, "test.role", (4, 5), np.float32)
    c = workspace.scratch(np, "test.role", (2, 2), np.float32)
    assert a.shape == (2, 3) and b.shape == (4, 5) and c.shape == (2, 2)
    assert np.shares_memory(b, c)
    assert workspace.scratch(np, "test.role", (2, 2), np.float64).dtype == np.float64
