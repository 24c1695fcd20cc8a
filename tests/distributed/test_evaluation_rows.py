"""Evaluation under ``mpiexec -n 2`` scores every held-out row, as one process does: a last batch shorter than the
ranks (which a training step leaves out) is evaluated, by the ranks its rows reach."""

from __future__ import annotations

import numpy as np
import pytest


def evaluate(launch, tmp_path, ranks, rows):
    out = tmp_path / f"eval-{ranks}-{rows}.npz"
    launch(ranks, "worker_train.py", str(out), "--steps", "3", "--batch", "16", "--eval-rows", str(rows),
           *(("--distributed", "none") if ranks is None else ()))
    return dict(np.load(out))


@pytest.mark.parametrize("rows", [17, 1], ids=["a-last-batch-of-one-row", "one-row-in-all"])
def test_two_ranks_evaluate_every_row_as_one_process(launch, tmp_path, rows):
    one, two = evaluate(launch, tmp_path, None, rows), evaluate(launch, tmp_path, 2, rows)
    assert int(two["size"]) == 2
    assert float(two["eval_loss"]) == pytest.approx(float(one["eval_loss"]), rel=1e-9)
    assert float(two["eval_accuracy"]) == float(one["eval_accuracy"])
