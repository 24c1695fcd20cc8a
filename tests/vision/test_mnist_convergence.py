"""NeuroFlow-CNN reaches ≥ 99 % MNIST test accuracy in three epochs of AdamW (slow: real data, a few minutes)."""

from __future__ import annotations

import time

import numpy as np
import pytest

import neuroflow as nf
from neuroflow.allocators.direct import DirectAllocator
from neuroflow.memory import BufferPool
from neuroflow_ops_vision import neuroflow_cnn

EPOCHS, BATCH, LR = 3, 64, 3e-3


def _mnist(split: str) -> tuple[np.ndarray, np.ndarray]:
    data = nf.data.mnist(split, flat=False, normalize=True)
    return np.ascontiguousarray(data.x, dtype=np.float32), np.asarray(data.y, dtype=np.int64)


def accuracy(model: nf.Operator, x: np.ndarray, y: np.ndarray, batch: int = 1000) -> float:
    model.eval()
    correct = sum(int((model.forward(x[i:i + batch]).argmax(axis=1) == y[i:i + batch]).sum())
                  for i in range(0, len(x), batch))
    model.train()
    return correct / len(x)


@pytest.mark.slow
@pytest.mark.convergence
def test_neuroflow_cnn_reaches_99_percent_on_mnist_in_three_epochs() -> None:
    x_train, y_train = _mnist("train")
    x_test, y_test = _mnist("test")
    nf.manual_seed(0)
    model = neuroflow_cnn(num_classes=10)
    model.attach_pool(BufferPool(DirectAllocator(np)))  # every step reuses the first step's buffers
    model[0].needs_input_grad = False  # the data needs no gradient
    loss = nf.losses.CrossEntropy()
    optimizer = nf.optim.AdamW(lr=LR, weight_decay=1e-4)
    flat = optimizer.bind_parameters(model.trainable_parameters())
    rng = np.random.default_rng(0)
    steps_per_epoch = len(x_train) // BATCH
    total = EPOCHS * steps_per_epoch
    start = time.perf_counter()
    for epoch in range(EPOCHS):
        order = rng.permutation(len(x_train))
        for step in range(steps_per_epoch):
            index = order[step * BATCH:(step + 1) * BATCH]
            flat.zero_grad()
            loss.forward(model.forward(x_train[index]), y_train[index])
            model.backward(loss.backward())
            done = epoch * steps_per_epoch + step
            optimizer.step(lr=LR * 0.5 * (1 + np.cos(np.pi * done / total)))  # cosine decay to 0
    seconds = time.perf_counter() - start
    acc = accuracy(model, x_test, y_test)
    print(f"\nNeuroFlow-CNN on MNIST: {acc:.2%} test accuracy after {EPOCHS} epochs, {seconds:.0f} s of training")
    assert acc >= 0.99
