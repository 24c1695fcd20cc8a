"""Copies to the host: ``start_to_host`` queues a read whose result is the array as its place in the queue saw it."""

from __future__ import annotations

from typing import Any

import numpy as np

import neuroflow as nf
from neuroflow import ops


def test_a_started_copy_sees_the_array_before_later_work(backend: Any, xp: Any) -> None:
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    a = xp.asarray(host)
    dense, strided = backend.start_to_host(a), backend.start_to_host(a[:, ::2])
    a += 1  # queued after both copies
    np.testing.assert_array_equal(dense(), host)
    np.testing.assert_array_equal(strided(), host[:, ::2])
    np.testing.assert_array_equal(backend.to_host(a), host + 1)


def test_empty_arrays_and_host_arrays(backend: Any, xp: Any) -> None:
    assert backend.start_to_host(xp.empty((0, 3)))().shape == (0, 3)
    np.testing.assert_array_equal(backend.start_to_host(np.ones(3))(), np.ones(3))


def test_the_trainer_counts_the_step_s_own_logits(backend: Any) -> None:
    """The accuracy of a step is its logits' argmax against the labels, as before the step's update."""
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((50, 12), dtype=np.float32), rng.integers(0, 5, 50)
    nf.manual_seed(0)
    trainer = nf.Trainer(nf.Sequential(ops.Linear(12, 16), ops.ReLU(), ops.Linear(16, 5)), batch_size=50,
                         progress=False, seed=0, device=backend.device, shuffle=False)
    trainer.train_step(x, y)  # the first step traces and plans; the second runs the planned steady state
    expected = int((trainer.predict(x).argmax(axis=1) == y).sum()) / 50
    history = trainer.fit((x, y), epochs=1)
    assert history["accuracy"] == [expected]
