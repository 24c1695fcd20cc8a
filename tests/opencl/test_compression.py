"""Gradient compression on opencl gives the steps it gives on cpu (its top-k selection reads back to the host)."""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf

pytest.importorskip("pyopencl")
from neuroflow_opencl.backend import OpenclBackend  # noqa: E402

if not OpenclBackend.is_available():
    pytest.skip("no OpenCL device", allow_module_level=True)


@pytest.mark.parametrize("mode, extra", [("topk", {}), ("threshold", {"compression_threshold": 0.01}), ("auto", {})])
def test_compressed_training_matches_cpu(backend, mode, extra):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((256, 20)).astype(np.float32), rng.integers(0, 3, 256)
    runs = {}
    for device in ("cpu", backend.device):
        nf.manual_seed(0)
        model = nf.Sequential(nf.ops.Linear(20, 32), nf.ops.ReLU(), nf.ops.Linear(32, 3))
        trainer = nf.Trainer(model, batch_size=32, gradient_accumulation_steps=2, gradient_compression=mode,
                             device=device, progress=False, seed=0, **extra)
        losses = [trainer.train_step(x[i:i + 64], y[i:i + 64]) for i in range(0, 256, 64)]
        sent = [s.sent for s in trainer.compressor.last_stats]
        residual = np.asarray(trainer.backend.to_host(trainer.compressor.residual))
        runs[device] = losses, sent, residual
    np.testing.assert_allclose(runs[backend.device][0], runs["cpu"][0], rtol=1e-5)
    assert runs[backend.device][1] == runs["cpu"][1]
    np.testing.assert_allclose(runs[backend.device][2], runs["cpu"][2], rtol=1e-4, atol=1e-6)


def test_count_nonzero_and_flatnonzero_match_numpy(backend):
    xp = backend.xp
    host = np.array([0.0, 1.5, 0.0, -2.0, 0.0, 3.0], np.float32)
    a = xp.asarray(host)
    assert xp.count_nonzero(a) == 3
    np.testing.assert_array_equal(xp.flatnonzero(a).get(), np.flatnonzero(host))
    a.partition(3)
    got = a.get()
    assert sorted(got[:3]) == sorted(np.partition(host, 3)[:3]) and got[3] == np.partition(host, 3)[3]
