"""Training checkpoints: resuming equals never stopping, bit for bit; keep-K; a killed write loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    list_checkpoints,
    load_training_checkpoint,
    save_training_checkpoint,
)
from neuroflow.checkpoint.divergence import LossWatch, Verdict

N = 6  # optimisation steps before and after the restart


def _batches(count=2 * N, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((16, 6)).astype(np.float32), rng.integers(0, 3, 16)) for _ in range(count)]


def _trainer(seed: int, dropout: float = 0.3, **kwargs) -> nf.Trainer:
    """A new process's view: fresh model objects, optimizer, scheduler and trainer, from a given seed."""
    nf.manual_seed(seed)
    model = nf.Sequential(ops.Linear(6, 16), ops.Tanh(), ops.Dropout(dropout), ops.Linear(16, 3))
    optimizer = nf.optim.AdamW(lr=1e-2, weight_decay=0.05)
    scheduler = nf.schedulers.Cosine(warmup_steps=2, min_lr=1e-4)
    return nf.Trainer(model, optimizer=optimizer, scheduler=scheduler, seed=seed, progress=False, **kwargs)


def _bind(trainer: nf.Trainer) -> nf.Trainer:
    # train_step does not bind the scheduler (fit does): bind it to a run of 2N steps, 4 per epoch
    trainer.scheduler.bind(trainer.optimizer.lr, steps_per_epoch=4, total_steps=2 * N)
    return trainer


def _state(trainer: nf.Trainer) -> dict[str, np.ndarray]:
    state = {f"model.{k}": np.array(v) for k, v in trainer.model.state_dict().items()}
    opt = trainer.optimizer.state_dict()
    state.update({f"optimizer.{k}": v for k, v in opt["state"].items()})
    state["process_rng"] = nf.random.generator().random(4)
    state["dropout_rng"] = trainer.model[2].rng.random(4)
    return state


def test_n_steps_then_restart_then_n_steps_equals_2n_steps_bit_for_bit(tmp_path):
    """What Trainer.resume must give: the same weights, optimizer state, losses and random streams."""
    batches = _batches()
    straight = _bind(_trainer(seed=0))
    losses_straight = [straight.train_step(x, y) for x, y in batches]
    expected = _state(straight)  # before the next "process" reseeds the process generator
    lr_straight = straight.scheduler.lr(straight.step)

    first = _bind(_trainer(seed=0))
    losses = [first.train_step(x, y) for x, y in batches[:N]]
    path = save_training_checkpoint(first, tmp_path)
    assert path.name == f"ckpt-{N:08d}.safetensors"
    del first
    nf.manual_seed(12345)  # the new process's generator and parameters are unrelated to the first run's
    resumed = _trainer(seed=99)  # unbound scheduler, other initial weights, other dropout seed
    info = load_training_checkpoint(resumed, tmp_path)
    assert (info.path, info.step, info.epoch, info.data) == (path, N, 0, None)
    assert resumed.step == N and resumed.optimizer.step_count == N and resumed.seed == 0
    losses += [resumed.train_step(x, y) for x, y in batches[N:]]

    assert losses == losses_straight
    assert resumed.scheduler.lr(resumed.step) == lr_straight
    got = _state(resumed)
    assert list(got) == list(expected)
    for key in expected:
        assert np.array_equal(got[key], expected[key]), key


def test_resume_with_gradient_accumulation_is_exact(tmp_path):
    batches = _batches()
    straight = _bind(_trainer(seed=1, gradient_accumulation_steps=4))
    for x, y in batches:
        straight.train_step(x, y)
    first = _bind(_trainer(seed=1, gradient_accumulation_steps=4))
    for x, y in batches[:N]:
        first.train_step(x, y)
    save_training_checkpoint(first, tmp_path)
    resumed = _trainer(seed=2, gradient_accumulation_steps=4)
    load_training_checkpoint(resumed, tmp_path)
    for x, y in batches[N:]:
        resumed.train_step(x, y)
    for p, q in zip(straight.model.parameters(), resumed.model.parameters()):
        assert np.array_equal(p.data, q.data)


def test_resume_with_gradient_compression_keeps_the_residual_and_is_exact(tmp_path):
    batches = _batches()
    kwargs = {"gradient_accumulation_steps": 2, "gradient_compression": "topk", "compression_ratio": 0.2}
    straight = _bind(_trainer(seed=3, **kwargs))
    for x, y in batches:
        straight.train_step(x, y)
    first = _bind(_trainer(seed=3, **kwargs))
    for x, y in batches[:N]:
        first.train_step(x, y)
    assert np.abs(first.compressor.residual).sum() > 0  # something was held back: the test has teeth
    save_training_checkpoint(first, tmp_path)
    resumed = _trainer(seed=5, **kwargs)
    load_training_checkpoint(resumed, tmp_path)
    for x, y in batches[N:]:
        resumed.train_step(x, y)
    for p, q in zip(straight.model.parameters(), resumed.model.parameters()):
        assert np.array_equal(p.data, q.data)
    with pytest.raises(CheckpointError, match="gradient compression"), \
            pytest.warns(RuntimeWarning, match="skipping checkpoint"):
        load_training_checkpoint(_trainer(seed=5), tmp_path)  # dense trainer, compressed checkpoint


def test_history_epoch_seed_and_data_position_are_restored(tmp_path):
    x, y = _batches(1)[0]
    trainer = _trainer(seed=4)
    trainer.fit((np.concatenate([x] * 4), np.concatenate([y] * 4)), epochs=2)
    loader = nf.data.DataLoader((x, y), batch_size=4, shuffle=True, seed=7, prefetch=0)
    batches = iter(loader)
    next(batches), next(batches)
    save_training_checkpoint(trainer, tmp_path, loader=loader, metadata={"note": "mid-epoch"})
    remaining = [b[0] for b in batches]

    fresh = _trainer(seed=5)
    fresh_loader = nf.data.DataLoader((x, y), batch_size=4, shuffle=True, seed=0, prefetch=0)
    info = load_training_checkpoint(fresh, tmp_path, loader=fresh_loader)
    assert info.data == {"epoch": 0, "position": 2, "seed": 7, "batch_size": 4, "num_samples": 16}
    assert (fresh.epoch, fresh.step, fresh.seed) == (2, trainer.step, 4)
    assert fresh.history.epochs == trainer.history.epochs and len(fresh.history) == 2
    assert fresh.scheduler.total_steps == trainer.scheduler.total_steps  # fit bound it; the binding came back
    for expected, got in zip(remaining, fresh_loader, strict=True):
        np.testing.assert_array_equal(got[0], expected)


def test_keeps_the_newest_k_and_cleans_interrupted_writes(tmp_path):
    trainer = _bind(_trainer(seed=0))
    (tmp_path / ".ckpt-00000002.safetensors.1a2b3c.tmp").write_bytes(b"half a checkpoint")
    (tmp_path / "notes.txt").write_text("not ours")
    for x, y in _batches(5):
        trainer.train_step(x, y)
        save_training_checkpoint(trainer, tmp_path, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["ckpt-00000004.safetensors", "ckpt-00000005.safetensors"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-00000004.safetensors", "ckpt-00000005.safetensors", "neuroflow.lock", "notes.txt",
    ]
    assert latest_checkpoint(tmp_path).name == "ckpt-00000005.safetensors"
    assert latest_checkpoint(tmp_path / "nothing") is None
    with pytest.raises(CheckpointError, match="keep must be an integer >= 1"):
        save_training_checkpoint(trainer, tmp_path, keep=0)


def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    trainer = _bind(_trainer(seed=0))
    for x, y in _batches(2):
        trainer.train_step(x, y)
        save_training_checkpoint(trainer, tmp_path)
    newest = latest_checkpoint(tmp_path)
    content = bytearray(newest.read_bytes())
    content[-5] ^= 0x01
    newest.write_bytes(bytes(content))
    fresh = _trainer(seed=0)
    with pytest.warns(RuntimeWarning, match="skipping checkpoint ckpt-00000002.safetensors: .*checksum"):
        info = load_training_checkpoint(fresh, tmp_path)
    assert info.step == 1 == fresh.step
    with pytest.raises(CheckpointError, match="fails its checksum"):
        load_training_checkpoint(fresh, newest)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoints"):
        load_training_checkpoint(fresh, tmp_path / "empty")


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    trainer = _bind(_trainer(seed=0))
    trainer.train_step(*_batches(1)[0])
    good = save_training_checkpoint(trainer, tmp_path)
    trainer.model[0].weight.data[0, 0] = np.inf
    trainer.step += 1
    with pytest.raises(CheckpointError, match="0.weight hold NaN or Inf"):
        save_training_checkpoint(trainer, tmp_path, keep=1)
    assert list_checkpoints(tmp_path) == [good]


def test_a_checkpoint_of_another_model_or_optimizer_is_refused_and_changes_nothing(tmp_path):
    trainer = _bind(_trainer(seed=0))
    trainer.train_step(*_batches(1)[0])
    path = save_training_checkpoint(trainer, tmp_path)

    other = nf.Trainer(nf.Sequential(ops.Linear(6, 16), ops.ReLU(), ops.Dropout(0.3), ops.Linear(16, 3)),
                       progress=False)
    with pytest.raises(CheckpointError, match="another topology"):
        load_training_checkpoint(other, path)
    wider = nf.Trainer(nf.Sequential(ops.Linear(6, 8), ops.Tanh(), ops.Dropout(0.3), ops.Linear(8, 3)),
                       progress=False)
    with pytest.raises(CheckpointError, match=r"0.weight has shape \(16, 6\) in the file; the model needs \(8, 6\)"):
        load_training_checkpoint(wider, path)
    sgd = _trainer(seed=3)
    sgd.optimizer = nf.optim.SGD(lr=0.1)
    before = [p.data.copy() for p in sgd.model.parameters()]
    with pytest.raises(CheckpointError, match="saved with optimizer AdamW; the trainer has SGD"):
        load_training_checkpoint(sgd, path)
    assert sgd.step == 0 and all(np.array_equal(a, p.data) for a, p in zip(before, sgd.model.parameters()))
    plain = _trainer(seed=3)
    plain.scheduler = None  # the trainer's configuration wins: no scheduler, said in a warning
    with pytest.warns(RuntimeWarning, match=r"scheduler none, a constant lr \(checkpoint: Cosine\(warmup_epochs"):
        load_training_checkpoint(plain, path)
    assert plain.step == 1 and plain.scheduler is None


def test_a_training_checkpoint_opens_as_a_model_file(tmp_path):
    trainer = _bind(_trainer(seed=0))
    trainer.train_step(*_batches(1)[0])
    model = nf.load(save_training_checkpoint(trainer, tmp_path))
    for p, q in zip(trainer.model.parameters(), model.parameters()):
        assert np.array_equal(p.data, q.data)
    nf.save(trainer.model, tmp_path / "m.safetensors")
    with pytest.raises(CheckpointError, match="format 'neuroflow.model' is not one of neuroflow.training"):
        load_training_checkpoint(trainer, tmp_path / "m.safetensors")


_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    import neuroflow as nf
    from neuroflow import ops
    from neuroflow.checkpoint import save_training_checkpoint

    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(512, 512), ops.Tanh(), ops.Linear(512, 10))
    trainer = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=1e-3), progress=False)
    x = np.random.default_rng(0).standard_normal((8, 512)).astype(np.float32)
    y = np.arange(8) % 10
    if sys.argv[2] == "hang-in-write-3":  # the third write stops half way, as if the machine died
        import time
        import safetensors.numpy

        real = safetensors.numpy.save_file

        def half_then_hang(tensors, filename, metadata=None):
            real(tensors, filename, metadata=metadata)
            if trainer.step == 3:
                with open(filename, "r+b") as f:
                    f.truncate(f.seek(0, 2) // 2)
                print("writing", flush=True)
                time.sleep(600)

        safetensors.numpy.save_file = half_then_hang
    while True:
        trainer.train_step(x, y)
        save_training_checkpoint(trainer, sys.argv[1], keep=2)
        print(trainer.step, flush=True)
""")


def _run_writer(tmp_path, mode):
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen([sys.executable, str(script), str(tmp_path / "ckpts"), mode], stdout=subprocess.PIPE,
                            env=env, text=True)


def _fresh_writer_trainer():
    nf.manual_seed(1)
    return nf.Trainer(nf.Sequential(ops.Linear(512, 512), ops.Tanh(), ops.Linear(512, 10)),
                      optimizer=nf.optim.AdamW(lr=1e-3), progress=False)


def test_killed_in_the_middle_of_a_write_the_previous_checkpoint_is_intact(tmp_path):
    process = _run_writer(tmp_path, "hang-in-write-3")
    try:
        lines = [process.stdout.readline().strip() for _ in range(3)]
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
        process.stdout.close()
    assert lines == ["1", "2", "writing"]
    folder = tmp_path / "ckpts"
    assert [p.name for p in list_checkpoints(folder)] == ["ckpt-00000001.safetensors", "ckpt-00000002.safetensors"]
    leftovers = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert len(leftovers) == 1 and leftovers[0].name.startswith(".ckpt-00000003.safetensors.")
    trainer = _fresh_writer_trainer()
    assert load_training_checkpoint(trainer, folder).step == 2
    trainer.train_step(np.zeros((8, 512), np.float32), np.arange(8))
    save_training_checkpoint(trainer, folder, keep=2)  # the resumed run cleans up the half-written file
    assert sorted(p.name for p in folder.iterdir()) == ["ckpt-00000002.safetensors", "ckpt-00000003.safetensors",
                                                        "neuroflow.lock"]  # the resumed run holds the directory


def test_killed_at_any_moment_the_newest_checkpoint_loads(tmp_path):
    folder = tmp_path / "ckpts"
    for delay in (0.05, 0.17):
        process = _run_writer(tmp_path, "run")
        try:
            assert process.stdout.readline()  # one checkpoint is complete
            time.sleep(delay)  # then kill at some point of a later step or write
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
            process.stdout.close()
        info = load_training_checkpoint(_fresh_writer_trainer(), folder)
        assert info.step >= 1 and info.path == latest_checkpoint(folder)
        for path in list_checkpoints(folder):
            nf.checkpoint.open_model_file(path)  # every listed checkpoint is whole


def test_checkpoint_metadata_is_json(tmp_path):
    trainer = _bind(_trainer(seed=0))
    trainer.train_step(*_batches(1)[0])
    path = save_training_checkpoint(trainer, tmp_path)
    opened = nf.checkpoint.open_model_file(path)
    training = json.loads(opened.header.metadata["training"])
    assert training["optimizer"]["type"] == "AdamW" and training["step"] == 1
    assert training["scheduler"]["state"]["type"] == "Cosine"
    assert set(training["rng"]["ops"]) == {"2"}
    assert {"optimizer::exp_avg", "optimizer::exp_avg_sq"} <= set(opened.header.tensors)


# ---------------------------------------------------------------- good and bad checkpoints (divergence)
def _verdicts(losses_per_window):
    """The verdict on each window (one checkpoint after each): whether training from the checkpoint before was sane."""
    watch = LossWatch()
    verdicts = []
    for step, window in enumerate(losses_per_window, start=1):
        for loss in window:
            watch.observe(loss)
        verdict, state = watch.judge(step)
        watch.commit(state)
        verdicts.append(verdict.good)
    return verdicts


def test_the_rule_marks_an_explosion_bad_and_never_a_noisy_converging_run():
    rng = np.random.default_rng(0)
    converging = [[2.3 * 0.9 ** i * rng.uniform(0.02, 1.0)] for i in range(80)]  # one step a window, 50x noise
    assert all(_verdicts(converging))
    assert _verdicts([[1.4], [7.7e7], [6.7e9], [1.2]]) == [True, False, False, True]  # AdamW lr 1e3: step 2 explodes
    # above the first loss and 10x the best window mean: bad; either alone is not divergence
    assert _verdicts([[2.3], [0.05], [0.4], [2.0], [3.0]]) == [True, True, True, True, False]
    assert _verdicts([[1.0], [float("nan")], [1.0]]) == [True, False, True]


def test_a_checkpoint_is_judged_by_the_steps_taken_from_it():
    watch = LossWatch()
    for loss in (1.0, 2.0):
        watch.observe(loss)
    verdict, state = watch.judge(2)
    assert verdict == Verdict(True, 1.5, 2, "mean loss 1.5 <= 10", judges=None)  # the run's start, never saved
    assert watch.judge(2)[0] == verdict and watch.pending is None  # not committed: a failed write changes nothing
    watch.commit(state)
    assert (watch.pending, watch.newest_good) == (2, None)  # ckpt 2 waits for the steps after it
    assert watch.judge(2) == (verdict, watch.state_dict())  # written again at the same step: nothing new
    watch.observe(1.2)
    watch.commit(watch.judge(3)[1])
    assert (watch.pending, watch.newest_good) == (3, 2)  # step 3 went well from ckpt 2
    again = LossWatch()
    again.load_state_dict(json.loads(json.dumps(watch.state_dict())))  # what a checkpoint carries
    again.observe(20.0)
    verdict, state = again.judge(4)
    assert (verdict.good, verdict.judges, state["newest_good"]) == (False, 3, 2) and "exploded" in verdict.reason


def test_pruning_keeps_the_newest_good_checkpoint_and_each_checkpoint_records_the_verdicts(tmp_path):
    trainer = _bind(_trainer(seed=0, checkpoint_dir=tmp_path))
    batches = _batches(5)
    for x, y in batches[:2]:
        trainer.train_step(x, y)
        save_training_checkpoint(trainer, tmp_path, keep=1)
    good = tmp_path / "ckpt-00000001.safetensors"  # step 2, taken from it, went well
    for x, y in batches[2:]:
        trainer.train_step(x, y)
        trainer.checkpoints.observe(1e30)  # as if the step's loss had exploded
        save_training_checkpoint(trainer, tmp_path, keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == [good.name, "ckpt-00000005.safetensors"]
    training = json.loads(nf.checkpoint.open_model_file(tmp_path / "ckpt-00000005.safetensors").header
                          .metadata["training"])
    assert training["verdict"]["good"] is False and training["verdict"]["judges"] == 4
    assert "exploded" in training["verdict"]["reason"] and training["divergence"]["newest_good"] == 1
    assert trainer.checkpoints.newest_good() == good
    fresh = _trainer(seed=1)
    with pytest.warns(RuntimeWarning, match=f"ckpt-00000005.safetensors, written while the loss was exploding .*the "
                                            f"newest good checkpoint is {good}: resume that file"):
        info = load_training_checkpoint(fresh, tmp_path)
    assert info.diverging and info.newest_good == good
    del fresh
    back = _trainer(seed=1)
    info = load_training_checkpoint(back, good)
    assert info.step == 1 and not info.diverging
    assert info.run != trainer.checkpoints.run.id  # an older checkpoint starts a new run: 5 is not its own
