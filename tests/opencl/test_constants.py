"""Device.constants: the parameter buffers kernels read their offsets, strides and sizes from."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow_opencl import device as device_module


def read(backend: Any, buffer: Any, count: int) -> np.ndarray:
    host = np.empty(count, np.int64)
    backend.cl_device.cl.enqueue_copy(backend.cl_device.queue, host, buffer)
    return host


def test_holds_the_values_and_is_made_once_per_tuple(backend: Any) -> None:
    dev = backend.cl_device
    values = (0, -3, 2**40, 7)
    first = dev.constants(values)
    assert dev.constants(values) is first
    assert dev.constants((0, -3, 2**40, 8)) is not first
    np.testing.assert_array_equal(read(backend, first, 4), values)


def test_starts_over_past_the_limit_and_stays_correct(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_module, "MAX_CONSTANTS", 3)
    dev = backend.cl_device
    dev._constants.clear()
    buffers = [dev.constants((i, i + 1)) for i in range(5)]
    assert len(dev._constants) <= 3
    for i, buffer in enumerate(buffers):
        np.testing.assert_array_equal(read(backend, buffer, 2), (i, i + 1))


def test_kernels_see_new_offsets_of_the_same_shapes(xp: Any) -> None:
    """The same plan launched on views at other offsets reads each launch's own offsets."""
    host = np.arange(40, dtype=np.float32).reshape(4, 10)
    dev = xp.asarray(host)
    for row in range(4):
        dev[row, ::2] += 1.0
        host[row, ::2] += 1.0
    np.testing.assert_array_equal(dev.get(), host)
    got = xp.matmul(dev[1:3], xp.asarray(np.eye(10, dtype=np.float32)))
    np.testing.assert_array_equal(got.get(), host[1:3])
