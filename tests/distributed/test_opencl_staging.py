"""The mpi communicator stages opencl arrays through host buffers: collectives on one rank and on two, and a
``neuroflow train --device opencl --nproc 2`` run that ends as the same run on cpu (skipped without OpenCL)."""

from __future__ import annotations

import numpy as np
import pytest
from cli_runs import neuroflow


@pytest.fixture(scope="module")
def opencl():
    neuroflow_opencl = pytest.importorskip("neuroflow_opencl")
    reason = neuroflow_opencl.OpenclBackend.unavailable_reason()
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("ranks", [None, 2], ids=["one rank", "two ranks"])
def test_collectives_on_opencl_arrays(opencl, launch, ranks):
    result = launch(ranks, "worker_opencl.py")
    assert result.stdout.count(": ok") == (ranks or 1), result.stdout + result.stderr


def test_training_on_opencl_in_two_ranks_ends_as_on_cpu(opencl, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(160, 20)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    np.savez(tmp_path / "train.npz", x=x[:128], y=y[:128])
    np.savez(tmp_path / "test.npz", x=x[128:], y=y[128:])
    (tmp_path / "mlp.toml").write_text(
        'batch_size = 32\nepochs = 1\nseed = 0\n[model]\nlayers = [{ type = "Linear", in_features = 20, '
        'out_features = 8 }, { type = "ReLU" }, { type = "Linear", in_features = 8, out_features = 2 }]\n'
        '[data]\ntrain = "train.npz"\ntest = "test.npz"\n[loss]\ntype = "CrossEntropy"\n[optimizer]\ntype = "SGD"\n'
        'lr = 0.1\n')
    runs = {device: neuroflow("train", "mlp.toml", "--device", device, *nproc, cwd=tmp_path)
            for device, nproc in (("opencl", ("--nproc", "2")), ("cpu", ()))}
    tests = {}
    for device, result in runs.items():
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        tests[device] = [line for line in result.stdout.splitlines() if line.startswith("test: ")]
    assert tests["opencl"] == tests["cpu"] and tests["cpu"]
