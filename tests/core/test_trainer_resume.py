"""Trainer checkpoints: fit, stop mid-epoch, resume in a fresh trainer, and end bit for bit where a straight run ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

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


# ---------------------------------------------------------------- History: part of the training checkpoint
def _rows(history):
    return [{k: v for k, v in row.items() if k != "time_s"} for row in history]


_KILLED = """
import os, signal, sys
sys.path.insert(0, sys.argv[3])
from test_trainer_resume import _data, _trainer
from neuroflow.hookspecs import hookimpl
from neuroflow.plugins import plugin_manager

where, when = sys.argv[2].split(":")


class Kill:
    @hookimpl
    def neuroflow_step_end(self, trainer, step):
        if where == "step" and step == int(when):
            os.kill(os.getpid(), signal.SIGKILL)

    @hookimpl
    def neuroflow_epoch_end(self, trainer, epoch):
        if where == "epoch_end" and epoch == int(when):  # after the epoch's last step checkpoint, before its row
            os.kill(os.getpid(), signal.SIGKILL)


plugin_manager().register(Kill())
_trainer(checkpoint_dir=sys.argv[1], checkpoint_every=1).fit(_data(), epochs=3, val_data=_data())
"""


@pytest.mark.parametrize("kill_at", ["step:3", "step:8", "epoch_end:1", "epoch_end:2"])
def test_killed_mid_epoch_or_before_the_epochs_row_the_resumed_history_equals_the_uninterrupted_one(tmp_path, kill_at):
    straight = _trainer()
    straight.fit(_data(), epochs=3, val_data=_data())
    script = tmp_path / "killed.py"
    script.write_text(_KILLED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "ckpts"), kill_at, str(Path(__file__).parent)],
                          env=env, capture_output=True, text=True)
    assert done.returncode == -signal.SIGKILL, done.stderr

    resumed = _trainer(checkpoint_dir=tmp_path / "ckpts")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the dead run's lock is taken over (test_checkpoint_lock.py tests that)
        info = resumed.resume()
    # killed in step 3's step_end hook: before that step's checkpoint
    assert info.step == {"step:3": 2, "step:8": 7, "epoch_end:1": 5, "epoch_end:2": 10}[kill_at]
    resumed.fit(_data(), epochs=3, val_data=_data())
    assert _rows(resumed.history) == _rows(straight.history)  # rows and values: loss, accuracy, lr, val_*
    assert len(resumed.history) == 3 and not resumed.history.interrupted
    for a, b in zip(straight.model.parameters(), resumed.model.parameters()):
        np.testing.assert_array_equal(a.data, b.data)


def test_a_stop_at_the_last_step_of_an_epoch_keeps_that_epochs_row(tmp_path):
    x, y = _data()
    straight = _trainer()
    straight.fit((x, y), epochs=2)
    first = _trainer(checkpoint_dir=tmp_path, checkpoint_every=1)

    class Crash(Exception):
        pass

    class CrashAtEpochEnd:
        @hookimpl
        def neuroflow_epoch_end(self, trainer, epoch):
            raise Crash  # the epoch's last step checkpoint is written; its row and epoch-end checkpoint are not

    crash = CrashAtEpochEnd()
    plugin_manager().register(crash)
    try:
        with pytest.raises(Exception) as stopped:
            first.fit((x, y), epochs=2)
    finally:
        plugin_manager().unregister(crash)
    assert isinstance(stopped.value, Crash) or isinstance(stopped.value.__cause__, Crash)
    del first
    resumed = _trainer(checkpoint_dir=tmp_path)
    assert resumed.resume().epoch_totals == {"epoch": 1, "loss_sum": pytest.approx(
        straight.history[0]["loss"] * 72), "correct": round(straight.history[0]["accuracy"] * 72), "seen": 72}
    resumed.fit((x, y), epochs=2)
    assert _rows(resumed.history) == _rows(straight.history)


# ---------------------------------------------------------------- resuming with another configuration
def test_a_resumed_trainer_with_another_lr_or_schedule_says_what_differs_and_its_own_values_win(tmp_path):
    x, y = _data()
    first = _trainer(checkpoint_dir=tmp_path, checkpoint_every=1)
    first.fit((x, y), epochs=1)
    saved_moments = first.optimizer.state_dict()["state"]["exp_avg"].copy()
    del first
    nf.manual_seed(1)
    model = nf.Sequential(ops.Linear(6, 16), ops.GELU(), ops.Dropout(0.2), ops.Linear(16, 3))
    lower = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=1e-3), scheduler=nf.schedulers.Cosine(warmup_steps=1),
                       batch_size=8, gradient_accumulation_steps=2, seed=5, progress=False, checkpoint_dir=tmp_path)
    with pytest.warns(RuntimeWarning) as said:
        lower.resume()
    message = " ".join(str(w.message) for w in said if "configuration differs" in str(w.message))
    assert "AdamW lr 0.001 (checkpoint: 0.01)" in message
    assert "scheduler Cosine(warmup_epochs=0.0, warmup_steps=1, min_lr=0.0) (checkpoint: Cosine(" \
           "warmup_epochs=0.0, warmup_steps=3, min_lr=0.0))" in message
    assert "The trainer's values are used from step 5 on" in message
    # the trainer's hyperparameters win; the state is the checkpoint's
    assert lower.optimizer.lr == 1e-3 and lower.scheduler.warmup_steps == 1
    assert lower.optimizer.step_count == 5 == lower.step
    np.testing.assert_array_equal(lower.optimizer.state_dict()["state"]["exp_avg"], saved_moments)
    history = lower.fit((x, y), epochs=2)
    assert history[-1]["lr"] <= 1e-3  # the schedule runs from the trainer's base lr


def test_resuming_with_the_same_configuration_says_nothing_about_it(tmp_path, recwarn):
    x, y = _data()
    _trainer(checkpoint_dir=tmp_path, checkpoint_every=2).fit((x, y), epochs=1)
    _trainer(checkpoint_dir=tmp_path).resume()
    assert not [w for w in recwarn if "configuration differs" in str(w.message) or "taking it over" in str(w.message)]


# ---------------------------------------------------------------- divergence
_RNG = np.random.default_rng(0)
_X = _RNG.standard_normal((512, 20)).astype(np.float32)
_Y = _RNG.integers(0, 4, 512)


def _mlp_trainer(folder, optimizer, scheduler=None):
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(20, 64), ops.ReLU(), ops.Linear(64, 4))
    return nf.Trainer(model, optimizer=optimizer, scheduler=scheduler, batch_size=32, checkpoint_dir=folder,
                      checkpoint_every=1, keep_checkpoints=2, progress=False)


def test_a_run_that_diverges_from_its_first_step_says_no_checkpoint_is_good(tmp_path):
    """The issue's probe: AdamW lr 1e3, a checkpoint every step, an MLP on random data. Step 2's loss is ~1e8:
    the weights the first step left are already ruined, so no checkpoint is one to resume from."""
    diverging = _mlp_trainer(tmp_path, nf.optim.AdamW(lr=1e3))
    with pytest.raises(NonFiniteLossError) as stopped, np.errstate(all="ignore"):
        diverging.fit((_X, _Y), epochs=5)
    assert stopped.value.checkpoint is None
    assert f"No checkpoint of this run in {tmp_path} is good: the loss exploded from the first ones on" \
        in str(stopped.value)
    del diverging
    blown = _mlp_trainer(tmp_path, nf.optim.AdamW(lr=1e3))
    with pytest.warns(RuntimeWarning, match="written while the loss was exploding .*no checkpoint of its run is "
                                            "known good: start again"), np.errstate(all="ignore"):
        blown.resume()
        assert not np.isfinite(blown.evaluate((_X, _Y))["loss"])  # what resuming gave, without a word, before


def test_a_diverging_run_keeps_its_last_good_checkpoint_and_the_error_names_it(tmp_path):
    """A warmup to a learning rate far too high: sane steps first, then the loss explodes."""
    diverging = _mlp_trainer(tmp_path, nf.optim.SGD(lr=30.0), nf.schedulers.Cosine(warmup_steps=30))
    with pytest.raises(NonFiniteLossError) as stopped, np.errstate(all="ignore"):
        diverging.fit((_X, _Y), epochs=5)
    good = stopped.value.checkpoint
    assert good is not None and f"The newest good checkpoint is {good}: resume from it, with a lower lr" \
        in str(stopped.value)
    last = stopped.value.step - 1
    kept = [p.name for p in list_checkpoints(tmp_path)]
    assert kept == [good.name, f"ckpt-{last - 1:08d}.safetensors", f"ckpt-{last:08d}.safetensors"]
    assert int(good.name[5:13]) < last - 1  # keep_checkpoints=2 alone would have pruned it
    del diverging

    calm = _mlp_trainer(tmp_path, nf.optim.SGD(lr=0.05))
    with pytest.warns(RuntimeWarning, match=r"SGD lr 0.05 \(checkpoint: 30.0\).*scheduler none"):
        info = calm.resume(good)
    assert calm.optimizer.lr == 0.05 and calm.step == info.step
    assert np.isfinite(calm.evaluate((_X, _Y))["loss"])
    history = calm.fit((_X, _Y), epochs=3)
    assert np.isfinite(history["loss"]).all() and history[-1]["loss"] < history[0]["loss"]
