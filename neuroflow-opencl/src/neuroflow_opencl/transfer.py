"""Copies between host memory and device arrays."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from neuroflow_opencl.array import ClArray, empty


def from_host(device: Any, array: Any, dtype: Any = None) -> ClArray:
    """A new device array holding ``array``; the copy is queued, not waited for."""
    host = np.asarray(array, dtype=dtype, order="C")  # ascontiguousarray would make a 0-d array 1-d
    if host.dtype == np.float16:
        raise TypeError("the opencl backend has no float16 kernels; convert to float32 first")
    out = empty(device, host.shape, host.dtype)
    if host.size:
        # the event keeps ``host`` alive until the copy has read it; held, not dropped (dropping waits)
        device.keep_until_done(device.cl.enqueue_copy(device.queue, out.buffer, host, dst_offset=0,
                                                      is_blocking=False))
    return out


def write(target: ClArray, array: np.ndarray) -> None:
    """Copy a host array into the dense device array ``target`` (queued)."""
    host = np.asarray(array, dtype=target.dtype, order="C")
    if host.shape != target.shape:
        raise ValueError(f"cannot copy a host array of shape {host.shape} into a device array of shape {target.shape}")
    if not target.is_contiguous:
        target.assign(from_host(target.device, host))
        return
    if host.size:
        device = target.device
        device.keep_until_done(device.cl.enqueue_copy(device.queue, target.buffer, host,
                                                      dst_offset=target.offset * target.itemsize, is_blocking=False))


def start_to_host(array: ClArray) -> Callable[[], np.ndarray]:
    """Queue a copy of ``array`` to the host; calling the result waits for it (done by then if a later read
    waited: pocl takes ~50 µs for a blocking read even of an idle queue) and returns the numpy copy."""
    dense = array if array.is_contiguous else array.copy()
    host = np.empty(dense.shape, dense.dtype)
    if not host.size:
        return lambda: host
    device = dense.device
    event = device.cl.enqueue_copy(device.queue, host, dense.buffer, src_offset=dense.offset * dense.itemsize,
                                   is_blocking=False)

    def result() -> np.ndarray:
        event.wait()
        return host

    return result


def to_host(array: ClArray) -> np.ndarray:
    """A numpy copy of ``array``; waits only for the work queued before it."""
    return start_to_host(array)()
