"""Runs for the fault tests, under ``mpiexec -n 2``: ``python worker_faults.py diverge|raise|stop``.

``diverge``: rank 1's parameters are changed between two steps; debug=True must end the run naming the step.
``raise``: rank 1's data holds a NaN, so only rank 1 raises; the run must end instead of rank 0 waiting.
``stop``: rank 1 alone asks to stop (as Ctrl-C does); both ranks must stop after the same step.
``evaluate_alone``: rank 0 evaluates while rank 1 trains; the run must end naming evaluate.
``evaluate_after``: rank 0 evaluates alone after rank 1 has finished; the run must end, long before the timeout.
``predict_alone``: rank 0 predicts between two steps; nothing waits for it.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import neuroflow as nf
from neuroflow import ops
from neuroflow.hookspecs import hookimpl
from neuroflow.plugins import plugin_manager


class StopAtStep:
    """A plugin asking its trainer to stop after ``step`` (what Ctrl-C does), on the rank it is registered on."""

    def __init__(self, step: int) -> None:
        self.step = step

    @hookimpl
    def neuroflow_step_end(self, trainer, step, loss):
        if step == self.step:
            trainer.request_stop()


def main() -> None:
    case = sys.argv[1]
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(4, 8), ops.ReLU(), ops.Linear(8, 3))
    trainer = nf.Trainer(model, batch_size=8, progress=False, seed=0, debug=True, distributed="mpi")
    rank = trainer.parallel.rank
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 4)).astype(np.float32), rng.integers(0, 3, 64)
    if case == "diverge":
        trainer.train_step(x[:8], y[:8])
        if rank == 1:
            trainer.flat_parameters.data[0] += 1.0
        trainer.train_step(x[8:16], y[8:16])
    elif case == "raise":
        if rank == 1:
            x[20:24] = np.nan  # the third global batch: rows 16..23, rank 1 takes 20..23
        trainer.fit((x, y), epochs=1)
    elif case == "evaluate_alone":  # rank 0 evaluates while rank 1 trains on: an error, not sums of the wrong numbers
        trainer.train_step(x[:8], y[:8])
        if rank == 0:
            trainer.evaluate((x, y))
        else:
            trainer.train_step(x[8:16], y[8:16])
    elif case == "evaluate_after":  # rank 0 evaluates alone once rank 1 has finished: no rank will join it
        trainer.train_step(x[:8], y[:8])
        if rank == 0:
            time.sleep(0.5)  # rank 1 is at the end of the run by then
            trainer.evaluate((x, y))
    elif case == "predict_alone":  # predict needs no other rank
        trainer.train_step(x[:8], y[:8])
        if rank == 0:
            print(f"rank 0 predicted {trainer.predict(x).shape}", flush=True)
        trainer.train_step(x[8:16], y[8:16])
    elif case == "stop":
        if rank == 1:
            plugin_manager().register(StopAtStep(3))
        history = trainer.fit((x, y), epochs=1)
        print(f"rank {rank} stopped after step {trainer.step}, interrupted={history.interrupted}", flush=True)
    print(f"rank {rank} finished", flush=True)


if __name__ == "__main__":
    main()
