"""predict and evaluate on opencl from several threads: each call gets its own outputs, as on cpu."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.operator import Operator

THREADS, CALLS = 4, 10


class _Yield(Operator):
    """Identity that lets the other threads run here, so that their calls overlap inside the model."""

    backward_reads_input = backward_reads_output = False

    def forward(self, x: Any) -> Any:
        time.sleep(0)
        return x

    def backward(self, grad_out: Any) -> Any:
        return grad_out


@pytest.mark.parametrize("call", ["predict", "evaluate"])
def test_inference_from_several_threads_on_opencl(backend: Any, call: str) -> None:
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(20, 64), _Yield(), ops.ReLU(), ops.Linear(64, 5))
    trainer = nf.Trainer(model, batch_size=16, progress=False, device=backend.device)
    rng = np.random.default_rng(0)
    trainer.fit((rng.standard_normal((64, 20)).astype(np.float32), rng.integers(0, 5, 64)), epochs=1)
    batches = [[(rng.standard_normal((32, 20)).astype(np.float32), rng.integers(0, 5, 32)) for _ in range(CALLS)]
               for _ in range(THREADS)]

    def result(x: np.ndarray, y: np.ndarray) -> Any:
        return trainer.predict(x) if call == "predict" else trainer.evaluate((x, y))["loss"]

    expected = [[result(x, y) for x, y in calls] for calls in batches]
    got: list[list[Any]] = [[None] * CALLS for _ in range(THREADS)]
    barrier = threading.Barrier(THREADS)

    def work(i: int) -> None:
        barrier.wait()
        for j, (x, y) in enumerate(batches[i]):
            got[i][j] = result(x, y)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wrong = sum(not np.allclose(got[i][j], expected[i][j], rtol=1e-6, atol=1e-7)
                for i in range(THREADS) for j in range(CALLS))
    assert wrong == 0, f"{wrong} of {THREADS * CALLS} calls returned another call's outputs"
