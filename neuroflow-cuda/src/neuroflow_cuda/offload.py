"""Asynchronous unload/reload of cold tensors: a copy stream, events and pinned host memory.

``unload`` makes the copy stream wait for the compute stream's work so far
(an event, not a host wait), copies the array into a pinned host buffer on
the copy stream and keeps the device array alive until the copy's event has
completed; only then may its memory be reused. ``reload`` copies back on the
copy stream and makes the compute stream wait for that one copy. The pinned
buffers are kept for the next unload of the same shape, so a tensor that
goes back and forth allocates host memory once.

The bookkeeping is written against :class:`CopyRuntime`, which
:class:`CupyCopyRuntime` implements with CuPy; tests drive it with a host
runtime whose events complete when told to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class CopyRuntime(Protocol):
    """The device operations an :class:`AsyncOffloader` needs."""

    def new_stream(self) -> Any: ...
    def compute_stream(self) -> Any: ...
    def record(self, stream: Any) -> Any: ...
    def wait(self, stream: Any, event: Any) -> None: ...
    def done(self, event: Any) -> bool: ...
    def empty_pinned(self, shape: tuple[int, ...], dtype: Any) -> Any: ...
    def empty_device(self, shape: tuple[int, ...], dtype: Any) -> Any: ...
    def to_host(self, device: Any, host: Any, stream: Any) -> None: ...
    def to_device(self, host: Any, device: Any, stream: Any) -> None: ...


@dataclass
class OffloadHandle:
    """An array in pinned host memory (or on its way there), and the event that says the copy is done."""

    host: Any
    copied: Any
    shape: tuple[int, ...]
    dtype: Any
    reloaded: bool = field(default=False)

    @property
    def nbytes(self) -> int:
        return int(self.host.nbytes)


class PinnedBuffers:
    """Pinned host buffers by shape and dtype: one given back is handed out again for the next of its shape."""

    def __init__(self, runtime: CopyRuntime) -> None:
        self.runtime = runtime
        self._free: dict[tuple[tuple[int, ...], str], list[Any]] = {}
        self.allocations = 0

    def take(self, shape: tuple[int, ...], dtype: Any) -> Any:
        free = self._free.get((shape, str(dtype)))
        if free:
            return free.pop()
        self.allocations += 1
        return self.runtime.empty_pinned(shape, dtype)

    def give_back(self, host: Any, shape: tuple[int, ...], dtype: Any) -> None:
        self._free.setdefault((shape, str(dtype)), []).append(host)


class AsyncOffloader:
    """Moves arrays between device and pinned host memory on its own stream, never blocking the host."""

    def __init__(self, runtime: CopyRuntime) -> None:
        self.runtime = runtime
        self.stream = runtime.new_stream()
        self._in_flight: list[tuple[Any, Any]] = []  # (event, object that must live until it completes)
        self.staging = PinnedBuffers(runtime)
        self.bytes_out = 0

    @property
    def pinned_allocations(self) -> int:
        """Pinned host buffers allocated so far (a tensor that goes back and forth needs one)."""
        return self.staging.allocations

    def unload(self, array: Any) -> OffloadHandle:
        """Start copying ``array`` to host memory; its device memory is released once the copy completes."""
        if not getattr(array, "flags", None) or not array.flags.c_contiguous:
            raise ValueError(f"unload needs a C-contiguous device array; got {type(array).__name__} "
                             f"of shape {getattr(array, 'shape', None)}: pass the tensor's own buffer, not a strided view")
        rt = self.runtime
        self.collect()
        host = self.staging.take(tuple(array.shape), array.dtype)
        rt.wait(self.stream, rt.record(rt.compute_stream()))  # what compute wrote so far is copied
        rt.to_host(array, host, self.stream)
        copied = rt.record(self.stream)
        self._in_flight.append((copied, array))
        self.bytes_out += int(array.nbytes)
        return OffloadHandle(host, copied, tuple(array.shape), array.dtype)

    def reload(self, handle: OffloadHandle) -> Any:
        """A device array with the handle's contents; compute waits for this copy only, the host not at all."""
        if handle.reloaded:
            raise ValueError("this offload handle was already reloaded; unload the tensor again first")
        rt = self.runtime
        device = rt.empty_device(handle.shape, handle.dtype)
        rt.to_device(handle.host, device, self.stream)  # same stream: ordered after the unload's copy
        back = rt.record(self.stream)
        rt.wait(rt.compute_stream(), back)
        handle.reloaded = True
        # The pinned buffer is read by the copy until ``back`` completes; only then may it be reused.
        self._in_flight.append((back, _Return(self.staging, handle)))
        self.collect()
        return device

    def collect(self) -> int:
        """Release what completed copies no longer need; returns how many copies are still in flight."""
        pending = []
        for event, keep in self._in_flight:
            if self.runtime.done(event):
                if isinstance(keep, _Return):
                    keep.give_back()
            else:
                pending.append((event, keep))
        self._in_flight = pending
        return len(pending)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)


class _Return:
    """Gives a reloaded handle's pinned buffer back to the staging buffers once its copy has completed."""

    def __init__(self, staging: PinnedBuffers, handle: OffloadHandle) -> None:
        self.staging, self.handle = staging, handle

    def give_back(self) -> None:
        self.staging.give_back(self.handle.host, self.handle.shape, self.handle.dtype)


class CupyCopyRuntime:
    """:class:`CopyRuntime` over CuPy: non-blocking streams, events, ``cupyx.empty_pinned``."""

    def __init__(self, cupy: Any) -> None:
        import cupyx  # lazy: CuPy is optional and heavy; imported when a cuda backend opens, not with this module

        self.cupy, self._cupyx = cupy, cupyx

    def new_stream(self) -> Any:
        return self.cupy.cuda.Stream(non_blocking=True)

    def compute_stream(self) -> Any:
        return self.cupy.cuda.get_current_stream()

    def record(self, stream: Any) -> Any:
        return stream.record()

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def done(self, event: Any) -> bool:
        return bool(event.done)

    def empty_pinned(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self._cupyx.empty_pinned(shape, dtype)

    def empty_device(self, shape: tuple[int, ...], dtype: Any) -> Any:
        return self.cupy.empty(shape, dtype)

    def to_host(self, device: Any, host: Any, stream: Any) -> None:
        device.get(stream=stream, out=host, blocking=False)

    def to_device(self, host: Any, device: Any, stream: Any) -> None:
        device.set(host, stream=stream)
