"""Trainer checkpoints: fit, stop mid-epoch, resume in a fresh trainer, and end bit for bit where a straight run ends."""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.checkpoint.training import list_checkpoints
from neuroflow.errors import ConfigError, NonFiniteLossError
from neuroflow.hookspecs import hookimpl
from neuroflow.plugins import plugin_manager


def _data():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 72)
    return (rng.standard_normal((72, 6)) + y[:, None]).astype(np.float32), y


def _trainer(**kwargs):
    nf.manual_seed(1)
    model = nf.Sequential(ops.Linear(6, 16), ops.GELU(), ops.Dropout(0.2), ops.Linear(16, 3))
    return nf.Trainer(model, optimizer=nf.optim.AdamW(lr=1e-2), scheduler=nf.schedulers.Cosine(warmup_steps=3),
                      batch_size=8, gradient_accumulation_steps=2, seed=5, progress=False, **kwargs)


class StopAt:
    def __init__(self, step):
        self.step = step

    @hookimpl
    def neuroflow_step_end(self, trainer, step):
        if step == self.step:
            trainer.request_stop()


@pytest.mark.parametrize("stop_at", [3, 5, 10])
def test_stop_and_resume_equals_an_uninterrupted_run(tmp_path, stop_at):
    x, y = _data()
    straight = _trainer()
    straight.fit((x, y), epochs=3)

    first = _trainer(checkpoint_dir=tmp_path, checkpoint_every=1)
    stopper = StopAt(stop_at)
    plugin_manager().register(stopper)
    try:
        first.fit((x, y), epochs=3)
    finally:
        plugin_manager().unregister(stopper)
    assert first.step == stop_at and first.history.interrupted

    nf.manual_seed(12345)  # a new process: the process generator is whatever it is
    resumed = _trainer(checkpoint_dir=tmp_path)
    info = resumed.resume()
    assert info.step == stop_at
    resumed.fit((x, y), epochs=3)
    assert resumed.step == straight.step == 15  # 5 windows of 2 micro-batches per epoch (9 batches)
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        np.testing.assert_array_equal(a.data, b.data)
    assert [e["epoch"] for e in resumed.history] == [1, 2, 3][: len(resumed.history)]


def test_checkpoints_are_kept_to_the_last_k_and_a_nan_stop_keeps_the_last_good_one(tmp_path):
    x, y = _data()
    trainer = _trainer(checkpoint_dir=tmp_path, checkpoint_every=2, keep_checkpoints=2)
    trainer.fit((x, y), epochs=2)
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["ckpt-00000008.safetensors", "ckpt-00000010.safetensors"]
    trainer.model[3].weight.data[0, 0] = np.nan
    with pytest.raises(NonFiniteLossError):
        trainer.fit((x, y), epochs=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == names
    fresh = _trainer(checkpoint_dir=tmp_path)
    assert fresh.resume().step == 10
    assert np.isfinite(fresh.model[3].weight.data).all()


def test_checkpoint_arguments_are_checked():
    with pytest.raises(ConfigError, match="checkpoint_every needs checkpoint_dir"):
        _trainer(checkpoint_every=5)
    with pytest.raises(ConfigError, match="checkpoint_every must be a positive integer"):
        _trainer(checkpoint_dir="x", checkpoint_every=0)
    with pytest.raises(ConfigError, match="resume needs a checkpoint directory"):
        _trainer().resume()
