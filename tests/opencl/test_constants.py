"""Device.constants: the parameter buffers kernels read their offsets, strides and sizes from."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow_opencl import device as device_module


def read(backend: Any, buffer: Any, count: int, dtype: Any = np.int64) -> np.ndarray:
    host = np.empty(count, dtype)
    backend.cl_device.cl.enqueue_copy(backend.cl_device.queue, host, buffer)
    return host


def test_holds_the_values_and_is_made_once_per_tuple(backend: Any) -> None:
    dev = backend.cl_device
    values = (0, -3, 2**40, 7)
    first = dev.constants(values)
    assert dev.constants(values) is first
    assert dev.constants((0, -3, 2**40, 8)) is not first
    np.testing.assert_array_equal(read(backend, first, 4), values)


def test_a_float_tuple_gets_its_own_typed_buffer(backend: Any) -> None:
    dev = backend.cl_device
    ints = dev.constants((1, 2))
    floats = dev.constants((1.0, 2.0), np.dtype(np.float32))  # equal to (1, 2) as a Python tuple
    assert floats is not ints
    assert dev.constants((1.0, 2.0), np.dtype(np.float32)) is floats
    np.testing.assert_array_equal(read(backend, floats, 2, np.float32), (1.0, 2.0))


def test_arguments_are_a_fresh_buffer_each_time(backend: Any) -> None:
    dev = backend.cl_device
    first = dev.arguments((0.5, 3.0), np.dtype(np.float64))
    assert dev.arguments((0.5, 3.0), np.dtype(np.float64)) is not first
    np.testing.assert_array_equal(read(backend, first, 2, np.float64), (0.5, 3.0))


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
