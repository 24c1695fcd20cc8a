"""Training on opencl follows training on cpu: real MNIST MLP accuracy, CNN losses, arena vs direct allocator."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops

STEPS, BATCH = 250, 64


def _mlp_run(device: str) -> tuple[list[float], float]:
    train, test = nf.data.mnist("train", normalize=True), nf.data.mnist("test", normalize=True)
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))
    trainer = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=2e-3), batch_size=BATCH, seed=0, progress=False,
                         device=device)
    losses = [trainer.train_step(train.x[i * BATCH:(i + 1) * BATCH], train.y[i * BATCH:(i + 1) * BATCH])
              for i in range(STEPS)]
    return losses, trainer.evaluate((test.x[:2000], test.y[:2000]))["accuracy"]


def test_mnist_mlp_on_opencl_learns_as_on_cpu(backend: Any) -> None:
    cpu_losses, cpu_accuracy = _mlp_run("cpu")
    cl_losses, cl_accuracy = _mlp_run(backend.device)
    np.testing.assert_allclose(cl_losses[:5], cpu_losses[:5], rtol=0, atol=1e-4)
    assert cl_accuracy > 0.88  # it learned: 250 steps of real MNIST, not a lucky constant
    assert abs(cl_accuracy - cpu_accuracy) <= 0.005


def _cnn_losses(device: str, allocator: str | None = None, steps: int = 5) -> list[float]:
    from neuroflow_ops_vision import neuroflow_cnn

    data = nf.data.mnist("train", flat=False, normalize=True)
    x, y = np.ascontiguousarray(data.x[:steps * 32], dtype=np.float32), np.asarray(data.y[:steps * 32])
    nf.manual_seed(0)
    trainer = nf.Trainer(neuroflow_cnn(width=8), optimizer=nf.optim.AdamW(lr=3e-3), batch_size=32, seed=0,
                         progress=False, device=device, allocator=allocator)
    return [trainer.train_step(x[i * 32:(i + 1) * 32], y[i * 32:(i + 1) * 32]) for i in range(steps)]


def test_neuroflow_cnn_losses_on_opencl_follow_cpu(backend: Any) -> None:
    cpu, cl = _cnn_losses("cpu"), _cnn_losses(backend.device)
    assert len(set(cpu)) == len(cpu)  # the weights move: equal losses would say nothing
    np.testing.assert_allclose(cl, cpu, rtol=0, atol=2e-4)


def test_arena_allocator_gives_the_direct_allocators_losses(backend: Any) -> None:
    arena = _cnn_losses(backend.device, steps=4)  # the default allocator
    direct = _cnn_losses(backend.device, "direct", steps=4)
    np.testing.assert_allclose(arena, direct, rtol=0, atol=1e-6)


@pytest.mark.parametrize("allocator", ["arena", "direct"])
def test_trainer_reports_the_allocator_it_uses(backend: Any, allocator: str) -> None:
    trainer = nf.Trainer(nf.Sequential(ops.Linear(4, 2)), device=backend.device, allocator=allocator, progress=False)
    assert trainer.options.allocator_name == allocator and trainer.backend is backend
    rng = np.random.default_rng(0)
    first = trainer.train_step(rng.standard_normal((8, 4)).astype(np.float32), rng.integers(0, 2, 8))
    assert np.isfinite(first)


def test_update_in_backward_is_refused_off_the_cpu(backend: Any) -> None:
    from neuroflow.errors import ConfigError

    with pytest.raises(ConfigError, match="update_in_backward runs on the cpu backend only; this trainer is on 'opencl'"):
        nf.Trainer(nf.Sequential(ops.Linear(4, 2)), device=backend.device, update_in_backward=True)


def test_predict_folds_batchnorm_into_the_convolution_on_opencl_as_on_cpu(backend: Any) -> None:
    """Inference folding (neuroflow.folding) on the device: no BatchNorm2d runs in predict, and the probabilities
    after a training step are the cpu backend's."""
    from tests.vision.folding_models import CallCounter, convnet, norms

    def run(device: str) -> tuple[np.ndarray, int]:
        model = convnet("NCHW", np.random.default_rng(5))
        trainer = nf.Trainer(model, nf.losses.CrossEntropy(), nf.optim.SGD(lr=0.01), batch_size=8, progress=False,
                             seed=0, device=device)
        rng = np.random.default_rng(0)
        x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
        trainer.train_step(x, rng.integers(0, 5, 8))
        counter = CallCounter(norms(model))
        return trainer.predict(x), counter.calls

    (cpu, _), (cl, calls) = run("cpu"), run(backend.device)
    assert calls == 0
    np.testing.assert_allclose(cl, cpu, atol=2e-6)
