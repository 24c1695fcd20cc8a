"""The cuda backend in training (GPU only): device, memory counters, zero steady-state allocations, offload, parity."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow_cuda import unavailable_reason
from neuroflow_cuda.offload import OffloadHandle

pytestmark = pytest.mark.skipif(unavailable_reason() is not None, reason=f"no usable CUDA device: {unavailable_reason()}")
GRANULE = 2 * 2**20  # the driver hands out device memory in 2 MiB pages


def mlp() -> Any:
    import neuroflow as nf
    from neuroflow import ops

    nf.manual_seed(0)
    return nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))


def cnn() -> Any:
    import neuroflow as nf
    from neuroflow import ops

    nf.manual_seed(0)
    return nf.Sequential(
        ops.Conv2d(3, 16, 3, padding=1, output_layout="NHWC"), ops.BatchNorm2d(16, layout="NHWC"), ops.ReLU(),
        ops.MaxPool2d(2, layout="NHWC"), ops.Flatten(), ops.Linear(16 * 16 * 16, 10),
    )


def batch(shape: tuple[int, ...], n: int = 32) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, *shape)).astype(np.float32), rng.integers(0, 10, n)


def trainer(model: Any, device: str, **kwargs: Any) -> Any:
    import neuroflow as nf

    return nf.Trainer(model, nf.losses.CrossEntropy(), nf.optim.AdamW(lr=1e-3), device=device, batch_size=32,
                      progress=False, seed=0, **kwargs)


def test_the_selected_device_is_current_and_described(cuda: Any) -> None:
    import cupy

    assert cupy.cuda.runtime.getDevice() == 0 and cuda.device == "cuda:0"
    facts = cuda.describe()
    assert facts["backend"] == "cuda" and facts["driver_cuda"].count(".") == 1 and "compute_capability" in facts


def test_the_arena_is_one_device_allocation_the_driver_sees(cuda: Any) -> None:
    from neuroflow.allocators.arena import ArenaAllocator

    device = cuda.cupy.cuda.Device(0)
    cuda.synchronize()
    free_before, _ = device.mem_info
    arena = ArenaAllocator(cuda.xp, capacity=64 * 2**20)
    free_after, _ = device.mem_info
    stats = arena.stats()
    assert stats.allocations == 1 and stats.pool_bytes >= 64 * 2**20
    assert stats.pool_bytes <= free_before - free_after <= stats.pool_bytes + GRANULE
    view = arena.view(4096, (128, 128), np.float32)
    assert int(view.data.ptr) == int(arena.block.data.ptr) + 4096
    del arena, view
    assert device.mem_info[0] >= free_after + 64 * 2**20  # freed to the driver, not kept by a pool


@pytest.mark.parametrize("build,shape", [(mlp, (784,)), (cnn, (3, 32, 32))], ids=["mlp", "cnn"])
def test_a_steady_state_step_makes_no_device_allocation(cuda: Any, build: Any, shape: tuple[int, ...]) -> None:
    t = trainer(build(), "cuda:0")
    x, y = batch(shape)
    for _ in range(3):
        t.train_step(x, y)
    cuda.synchronize()
    before = cuda.device_allocations()
    for _ in range(5):
        t.train_step(x, y)
    cuda.synchronize()
    assert cuda.device_allocations() == before


@pytest.mark.parametrize("build,shape", [(mlp, (784,)), (cnn, (3, 32, 32))], ids=["mlp", "cnn"])
def test_training_on_cuda_follows_training_on_cpu(build: Any, shape: tuple[int, ...]) -> None:
    x, y = batch(shape)
    on_cpu, on_gpu = trainer(build(), "cpu"), trainer(build(), "cuda:0")
    for _ in range(5):
        assert on_gpu.train_step(x, y) == pytest.approx(on_cpu.train_step(x, y), rel=1e-3)
    for (name, a), (_, b) in zip(on_cpu.model.named_parameters(), on_gpu.model.named_parameters()):
        np.testing.assert_allclose(on_gpu.backend.to_host(b.data), a.data, rtol=1e-3, atol=1e-4, err_msg=name)


def test_unload_and_reload_round_trip_through_pinned_memory(cuda: Any) -> None:
    rng = np.random.default_rng(5)
    host = rng.standard_normal((256, 1024)).astype(np.float32)
    device = cuda.from_host(host)
    handle = cuda.unload(device)
    del device
    assert isinstance(handle, OffloadHandle)
    back = cuda.reload(handle)
    np.testing.assert_array_equal(cuda.to_host(back), host)
    for _ in range(3):  # the pinned staging buffer is reused
        back = cuda.reload(cuda.unload(back))
        cuda.synchronize()
        cuda.offloader.collect()
    np.testing.assert_array_equal(cuda.to_host(back), host)
    assert cuda.offloader.pinned_allocations == 1


def test_cold_tensors_leave_the_device_when_the_pool_is_low_and_are_back_for_the_next_step(
        cuda: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    t = trainer(cnn(), "cuda:0", enable_async_unload=True)
    x, y = batch((3, 32, 32))
    t.train_step(x, y)
    monkeypatch.setattr(type(cuda), "free_bytes", lambda self: 0)
    t.train_step(x, y)
    assert t.offload is not None and t.offload.unloaded and t.offload.unloads == 1
    bn = t.model.layers[1]
    assert isinstance(bn.running_mean.data, OffloadHandle)
    stats_before = np.array(bn.running_mean.data.host, copy=True)
    monkeypatch.undo()
    t.train_step(x, y)  # reloads first, then trains with the same running statistics
    assert not isinstance(bn.running_mean.data, OffloadHandle)
    assert not np.allclose(t.backend.to_host(bn.running_mean.data), stats_before)  # updated by the third step
