"""Async unload: cold tensors leave the device when its pool runs low and are back, unchanged, before use."""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops, registry
from neuroflow.backends.cpu import CpuBackend


class HostCopy:
    """What the small-pool backend keeps of an unloaded array: a host copy, no device memory."""

    def __init__(self, array):
        self.host = np.array(array, copy=True)


class SmallPoolBackend(CpuBackend):
    """A 'device' with a nearly full pool: it reports little free memory and really moves unloaded arrays."""

    name = "smallpool"

    def __init__(self, index=0):
        super().__init__(index)
        self.unloaded = self.reloaded = 0

    def free_bytes(self):
        return 1024

    def unload(self, array):
        self.unloaded += 1
        return HostCopy(array)

    def reload(self, handle):
        self.reloaded += 1
        return np.array(handle.host, copy=True)


@pytest.fixture
def smallpool():
    registry.backends.register("smallpool", SmallPoolBackend)
    yield
    registry.backends.unregister("smallpool")


def _model():
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(8, 16), ops.Tanh(), ops.Linear(16, 3))
    model[0].weight.requires_grad = False  # frozen layer: cold
    model[0].bias.requires_grad = False
    return model


def test_cold_tensors_unload_when_the_pool_is_low_and_training_is_unchanged(smallpool):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 8)).astype(np.float32), rng.integers(0, 3, 64)
    plain = nf.Trainer(_model(), batch_size=16, progress=False, seed=0)
    plain.fit((x, y), epochs=2)

    offloading = nf.Trainer(_model(), batch_size=16, progress=False, seed=0, device="smallpool",
                            enable_async_unload=True)
    offloading.fit((x, y), epochs=2)
    backend = offloading.backend
    assert backend.unloaded == 2 * 8  # two cold tensors after each of the 8 steps
    assert isinstance(offloading.model[0].weight.data, HostCopy)  # out of the device between steps
    metrics = offloading.evaluate((x, y))  # evaluation brings them back first
    assert isinstance(offloading.model[0].weight.data, np.ndarray)
    assert metrics == plain.evaluate((x, y))
    for a, b in zip(plain.model.parameters(), offloading.model.parameters()):
        np.testing.assert_array_equal(a.data, b.data)


def test_cpu_backend_never_unloads():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 8)).astype(np.float32), rng.integers(0, 3, 32)
    trainer = nf.Trainer(_model(), batch_size=16, progress=False, enable_async_unload=True)
    trainer.fit((x, y), epochs=1)
    assert trainer.offload is not None and trainer.offload.unloads == 0
    assert isinstance(trainer.model[0].weight.data, np.ndarray)
