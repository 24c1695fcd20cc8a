"""``train_step`` under ``memory_budget_mb``: its first call already runs the micro-batches the budget chose."""

from __future__ import annotations

import numpy as np

import neuroflow as nf
from neuroflow import ops


def mlp():
    nf.manual_seed(0)
    return nf.Sequential(ops.Linear(784, 256), ops.ReLU(), ops.Linear(256, 256), ops.ReLU(), ops.Linear(256, 10))


def test_the_first_train_step_runs_and_plans_the_budgets_micro_batches():
    probe = nf.memory.profile(mlp(), (96, 784), optimizer=nf.optim.Adam(lr=1e-3), gradient_accumulation_steps=2)
    inputs = 4 * 96 * (784 * 4 + 8)  # the input pipeline's batches, which the Trainer keeps out of the budget
    budget = (probe.predicted_peak_bytes + inputs) / 2**20  # batch 96 with accumulation fits; 256 does not
    trainer = nf.Trainer(mlp(), optimizer=nf.optim.Adam(lr=1e-3), batch_size=256, memory_budget_mb=budget,
                         progress=False)
    rng = np.random.default_rng(0)
    trainer.train_step(rng.random((256, 784), dtype=np.float32), rng.integers(0, 10, 256))
    b, k = trainer.batch_size, trainer.gradient_accumulation_steps
    assert b < 256 and k > 1 and b * k >= 256
    assert trainer.memory.planned_batch <= b  # planned for the micro-batch, not for the 256 rows at once
