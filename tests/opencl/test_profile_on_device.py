"""nf.memory.profile traces on the host even when the Trainer (and its loss) run on opencl."""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf

pytest.importorskip("pyopencl")
from neuroflow_opencl.backend import OpenclBackend  # noqa: E402

if not OpenclBackend.is_available():
    pytest.skip("no OpenCL device", allow_module_level=True)


def test_profile_of_a_model_trained_on_opencl_equals_the_cpu_prediction(backend):
    def model():
        nf.manual_seed(0)
        return nf.Sequential(nf.ops.Linear(20, 32), nf.ops.ReLU(), nf.ops.Linear(32, 3))

    reference = nf.memory.profile(model(), (16, 20), nf.losses.CrossEntropy(), nf.optim.AdamW())
    net = model()
    trainer = nf.Trainer(net, optimizer=nf.optim.AdamW(), device=backend.device, batch_size=16, progress=False)
    before = nf.memory.profile(net, (16, 20), trainer.loss, trainer.optimizer)  # the loss knows the opencl backend
    rng = np.random.default_rng(0)
    trainer.train_step(rng.standard_normal((16, 20)).astype(np.float32), rng.integers(0, 3, 16))
    # the model now lives on opencl: the trace runs there, fused loss included (its row-loss buffer is planned)
    after = nf.memory.profile(net, (16, 20), trainer.loss, trainer.optimizer)
    assert before.predicted_peak_bytes == reference.predicted_peak_bytes
    assert after.static_bytes == reference.static_bytes
    assert 0 <= after.arena_bytes - reference.arena_bytes <= 16 * 4 + 64
