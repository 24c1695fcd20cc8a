"""Async unload on opencl: copies run on the second queue after the work that writes the array, and come back intact."""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops

pytest.importorskip("pyopencl")
from neuroflow_opencl.offload import Unloaded  # noqa: E402

# ``backend``: the shared opencl fixture (tests/opencl/conftest.py), which skips without a driver.


def test_unload_reads_after_queued_writes_and_releases_device_memory(backend):
    a = backend.from_host(np.zeros((64, 32), np.float32))
    backend.xp.add(a, 3.0, out=a)  # queued, not waited for: the copy must still see it
    handle = backend.unload(a.T)
    assert isinstance(handle, Unloaded)
    handle.event.wait()
    backend.free_bytes()  # polls finished copies and releases their device arrays
    assert handle.device_array is None
    back = backend.reload(handle)
    np.testing.assert_array_equal(backend.to_host(back), np.full((32, 64), 3.0, np.float32))


def test_reload_before_release_returns_the_device_array_without_a_copy(backend):
    a = backend.from_host(np.arange(10, dtype=np.float32))
    handle = backend.unload(a)
    assert backend.reload(handle) is a
    assert backend.reload(a) is a  # something never unloaded passes through


def test_free_bytes_falls_as_buffers_are_held(backend):
    before = backend.free_bytes()
    held = backend.xp.empty((1 << 20,), np.float32)
    assert backend.free_bytes() <= before - held.nbytes
    assert backend.free_bytes() <= backend.cl_device.facts.global_mem_bytes


def test_training_with_unloads_matches_training_without(backend, monkeypatch):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 8)).astype(np.float32), rng.integers(0, 3, 64)

    def model():
        nf.manual_seed(0)
        m = nf.Sequential(ops.Linear(8, 16), ops.Tanh(), ops.Linear(16, 3))
        m[0].weight.requires_grad = m[0].bias.requires_grad = False  # frozen: cold
        return m

    plain = nf.Trainer(model(), batch_size=16, progress=False, seed=0, device=backend.device)
    plain.fit((x, y), epochs=2)
    offloading = nf.Trainer(model(), batch_size=16, progress=False, seed=0, device=backend.device,
                            enable_async_unload=True)
    monkeypatch.setattr(type(offloading.backend), "free_bytes", lambda self: 1024)  # a nearly full device
    offloading.fit((x, y), epochs=2)
    assert offloading.offload.unloads == 8
    assert isinstance(offloading.model[0].weight.data, Unloaded)
    assert offloading.evaluate((x, y)) == plain.evaluate((x, y))
    for a, b in zip(plain.model.parameters(), offloading.model.parameters()):
        np.testing.assert_array_equal(np.asarray(a.data), np.asarray(b.data))
