"""Async unload to host memory over the device's second (copy) queue.

The copy waits for a marker on the compute queue — so it reads the array
only after the work that writes it — and never blocks the compute queue.
The device array is released once its copy has completed (checked without
waiting, whenever the backend is asked about memory); reloading an array
whose device copy is still alive costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from neuroflow_opencl.array import ClArray
from neuroflow_opencl.transfer import from_host


@dataclass
class Unloaded:
    """A handle from ``unload``: the host copy, the copy's event and, until it completes, the device array."""

    host: np.ndarray
    event: Any
    device_array: ClArray | None


class Offloader:
    def __init__(self, device: Any) -> None:
        self.device = device
        self.pending: list[Unloaded] = []

    def unload(self, array: ClArray) -> Unloaded:
        cl, device = self.device.cl, self.device
        dense = array if array.is_contiguous else array.copy()
        host = np.empty(dense.shape, dense.dtype)
        marker = cl.enqueue_marker(device.queue)
        device.queue.flush()  # the copy queue waits on the marker: the compute queue must reach it
        event = cl.enqueue_copy(device.copy_queue, host, dense.buffer, src_offset=dense.offset * dense.itemsize,
                                wait_for=[marker], is_blocking=False)
        device.copy_queue.flush()
        handle = Unloaded(host, event, dense)
        self.pending.append(handle)
        return handle

    def reload(self, handle: Unloaded) -> ClArray:
        if handle in self.pending:
            self.pending.remove(handle)
        if handle.device_array is not None:  # not released yet: the data never left
            array, handle.device_array = handle.device_array, None
            return array
        handle.event.wait()
        return from_host(self.device, handle.host)

    def release_finished(self) -> None:
        """Drop the device arrays whose copies have completed (their buffers return to the pool)."""
        complete = self.device.cl.command_execution_status.COMPLETE
        for handle in list(self.pending):
            if handle.event.command_execution_status == complete:
                handle.device_array = None
                self.pending.remove(handle)
