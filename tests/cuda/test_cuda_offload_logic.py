"""The async offloader's bookkeeping, driven by a host runtime whose copies complete when the test says so.

What this proves on the CPU: data round-trips, the device array stays alive
until its copy completes, compute waits on the reload event (never the host),
pinned buffers are reused, and misuse is refused. Real streams are covered by
test_gpu_offload.py on a GPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow.backends.cpu import CpuBackend
from neuroflow.memory.offload import OffloadManager
from neuroflow.tensor import Tensor
from neuroflow_cuda.offload import AsyncOffloader, OffloadHandle


class Event:
    def __init__(self, stream: str) -> None:
        self.stream, self.complete = stream, False


class HostRuntime:
    """Copies happen at once (numpy), but an event only reports done after ``finish_all``."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.waits: list[tuple[str, str]] = []
        self.pinned = 0

    def new_stream(self) -> str:
        return "copy"

    def compute_stream(self) -> str:
        return "compute"

    def record(self, stream: str) -> Event:
        self.events.append(Event(stream))
        return self.events[-1]

    def wait(self, stream: str, event: Event) -> None:
        self.waits.append((stream, event.stream))

    def done(self, event: Event) -> bool:
        return event.complete

    def empty_pinned(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        self.pinned += 1
        return np.empty(shape, dtype)

    def empty_device(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.empty(shape, dtype)

    def to_host(self, device: np.ndarray, host: np.ndarray, stream: str) -> None:
        host[...] = device

    def to_device(self, host: np.ndarray, device: np.ndarray, stream: str) -> None:
        device[...] = host

    def finish_all(self) -> None:
        for event in self.events:
            event.complete = True


def test_unload_then_reload_gives_back_the_same_values() -> None:
    rt = HostRuntime()
    offloader = AsyncOffloader(rt)
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    handle = offloader.unload(data)
    back = offloader.reload(handle)
    np.testing.assert_array_equal(back, data)
    assert back is not data and back.shape == (3, 4) and back.dtype == np.float32


def test_the_copy_waits_for_compute_and_compute_waits_for_the_reload() -> None:
    rt = HostRuntime()
    offloader = AsyncOffloader(rt)
    offloader.reload(offloader.unload(np.ones(4, np.float32)))
    assert rt.waits == [("copy", "compute"), ("compute", "copy")]


def test_the_device_array_lives_until_its_copy_completes() -> None:
    rt = HostRuntime()
    offloader = AsyncOffloader(rt)
    data = np.ones(8, np.float32)
    offloader.unload(data)
    assert offloader.collect() == 1 and any(keep is data for _, keep in offloader._in_flight)
    rt.finish_all()
    assert offloader.collect() == 0 and offloader.in_flight == 0


def test_pinned_buffers_are_reused_once_their_reload_completed() -> None:
    rt = HostRuntime()
    offloader = AsyncOffloader(rt)
    data = np.ones((2, 3), np.float32)
    for _ in range(4):
        data = offloader.reload(offloader.unload(data))
        rt.finish_all()
        offloader.collect()
    assert rt.pinned == 1 and offloader.pinned_allocations == 1


def test_a_pinned_buffer_still_being_read_is_not_handed_out_again() -> None:
    rt = HostRuntime()
    offloader = AsyncOffloader(rt)
    first = offloader.unload(np.ones(4, np.float32))
    offloader.reload(first)  # its copy back has not completed
    second = offloader.unload(np.zeros(4, np.float32))
    assert second.host is not first.host and rt.pinned == 2


def test_misuse_is_refused_with_what_to_do() -> None:
    offloader = AsyncOffloader(HostRuntime())
    handle = offloader.unload(np.ones(4, np.float32))
    offloader.reload(handle)
    with pytest.raises(ValueError, match="already reloaded; unload the tensor again first"):
        offloader.reload(handle)
    with pytest.raises(ValueError, match="C-contiguous device array"):
        offloader.unload(np.ones((4, 4), np.float32)[:, ::2])


class OffloadingBackend(CpuBackend):
    """The cpu backend with the cuda backend's unload/reload and a pool that reports itself low."""

    def __init__(self) -> None:
        super().__init__(0)
        self.runtime = HostRuntime()
        self.offloader = AsyncOffloader(self.runtime)

    def free_bytes(self) -> int:
        return 0

    def unload(self, array: Any) -> OffloadHandle:
        return self.offloader.unload(array)

    def reload(self, handle: Any) -> Any:
        return self.offloader.reload(handle)


def test_the_core_offload_manager_moves_cold_tensors_out_and_back_through_the_offloader() -> None:
    backend = OffloadingBackend()
    running = Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    manager = OffloadManager(backend, [running], low_water_bytes=1 << 20)
    manager.after_step()
    assert isinstance(running.data, OffloadHandle) and manager.unloads == 1
    manager.ensure_loaded()
    np.testing.assert_array_equal(running.data, [1.0, 2.0, 3.0])
    assert not manager.unloaded
