"""A checkpoint directory belongs to one run (a lock); a killed save's temporary file is removed once its writer is gone."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.checkpoint import DirectoryLockedError, latest_checkpoint, list_checkpoints, open_model_file
from neuroflow.checkpoint.atomic import host_tag, remove_stale_temps
from neuroflow.checkpoint.lock import LOCK_NAME, this_host

_RNG = np.random.default_rng(0)
X = _RNG.standard_normal((32, 6)).astype(np.float32)
Y = _RNG.integers(0, 3, 32)


def _trainer(folder, seed: int = 0, **kwargs) -> nf.Trainer:
    nf.manual_seed(seed)
    model = nf.Sequential(ops.Linear(6, 8), ops.Tanh(), ops.Linear(8, 3))
    return nf.Trainer(model, optimizer=nf.optim.AdamW(lr=1e-2), checkpoint_dir=folder, seed=seed, batch_size=8,
                      progress=False, **kwargs)


def _training(path) -> dict:
    return json.loads(open_model_file(path).header.metadata["training"])


# A child process that trains into argv[1] and then waits; with argv[2] == "hang-in-write" its third
# checkpoint write stops after creating (and filling) the temporary file, as if the machine froze there.
_CHILD = textwrap.dedent("""
    import sys, time
    import numpy as np
    import neuroflow as nf
    from neuroflow import ops

    nf.manual_seed(0)
    trainer = nf.Trainer(nf.Sequential(ops.Linear(6, 8), ops.Tanh(), ops.Linear(8, 3)), checkpoint_dir=sys.argv[1],
                         seed=0, progress=False)
    x = np.random.default_rng(0).standard_normal((8, 6)).astype(np.float32)
    y = np.arange(8) % 3
    if sys.argv[2] == "hang-in-write":
        import safetensors.numpy

        real = safetensors.numpy.save_file

        def hang_on_the_third(tensors, filename, metadata=None):
            real(tensors, filename, metadata=metadata)
            if trainer.step == 3:
                print("writing", filename, flush=True)
                time.sleep(600)

        safetensors.numpy.save_file = hang_on_the_third
    for _ in range(3):
        trainer.train_step(x, y)
        trainer.save_checkpoint()
    print("holding", flush=True)
    time.sleep(600)
""")


@pytest.fixture
def child(tmp_path):
    """Start a child training into a folder; yields a function (mode -> (process, first output line))."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    started = []

    def start(folder, mode="hold"):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        process = subprocess.Popen([sys.executable, str(script), str(folder), mode], stdout=subprocess.PIPE,
                                   env=env, text=True)
        started.append(process)
        return process, process.stdout.readline().split()

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        process.wait()
        process.stdout.close()


def _kill(process) -> None:
    process.send_signal(signal.SIGKILL)  # kill -9: nothing of the child's runs after this
    process.wait()


# ---------------------------------------------------------------- one directory, one run
def test_a_second_live_run_is_refused_naming_the_directory_and_its_owner_then_takes_over_once_it_died(tmp_path, child):
    folder = tmp_path / "ckpts"
    process, said = child(folder)
    assert said == ["holding"]
    owner = json.loads((folder / LOCK_NAME).read_text())
    assert (owner["pid"], owner["host"]) == (process.pid, this_host())
    written = [p.name for p in list_checkpoints(folder)]

    second = _trainer(folder, seed=1, checkpoint_every=1)
    with pytest.raises(DirectoryLockedError) as refused:
        second.fit((X, Y), epochs=1)
    message = str(refused.value)
    assert f"checkpoint directory {folder} belongs to run {owner['run']} (pid {process.pid} on host {this_host()}" \
        in message and "still running" in message and "its own checkpoint_dir" in message
    assert refused.value.owner.pid == process.pid and refused.value.directory == folder
    with pytest.raises(DirectoryLockedError, match=f"pid {process.pid}"):
        _trainer(folder, seed=1).resume()  # resuming takes the directory too
    assert [p.name for p in list_checkpoints(folder)] == written  # the refused run wrote and pruned nothing
    assert second.step == 0

    _kill(process)
    resumed = _trainer(folder, seed=1)
    with pytest.warns(RuntimeWarning, match=f"taking it over from run {owner['run']} \\(pid {process.pid} .*"
                                            "that process is no longer running"):
        info = resumed.resume()
    assert info.step == 3 and info.run == owner["run"]  # the resumed run carries on the dead one
    now = json.loads((folder / LOCK_NAME).read_text())
    assert (now["pid"], now["run"]) == (os.getpid(), owner["run"])
    del resumed  # a Trainer nothing refers to lets go of its directory at once
    assert not (folder / LOCK_NAME).exists()


def test_a_lock_from_another_host_is_refused_with_how_to_remove_it(tmp_path):
    folder = tmp_path / "ckpts"
    folder.mkdir()
    (folder / LOCK_NAME).write_text(json.dumps({"run": "abc", "pid": 12, "host": "gpu-node-7", "started": 0.0}))
    trainer = _trainer(folder, checkpoint_every=1)
    with pytest.raises(DirectoryLockedError, match=(
            f"belongs to run abc \\(pid 12 on host gpu-node-7, since .*\\), another host, and this host cannot tell "
            f"whether that run still lives. If it has ended, delete {folder / LOCK_NAME} and start again")):
        trainer.fit((X, Y), epochs=1)
    (folder / LOCK_NAME).unlink()  # what the message says to do once that run is gone
    trainer.fit((X, Y), epochs=1)
    assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()


def test_two_trainers_of_one_process_the_newer_takes_over_and_the_older_may_no_longer_write(tmp_path):
    folder = tmp_path / "ckpts"
    first = _trainer(folder, checkpoint_every=1)
    first.fit((X, Y), epochs=1)
    second = _trainer(folder, seed=1)
    with pytest.warns(RuntimeWarning, match="another Trainer of this process held it"):
        second.resume()
    with pytest.raises(DirectoryLockedError, match=f"{folder} was taken over by run {second.checkpoints.run.id}"):
        first.fit((X, Y), epochs=1)
    del first, second
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing holds the directory now: no takeover to warn about
        third = _trainer(folder)
        third.resume()
    third.fit((X, Y), epochs=2)


def test_a_dropped_trainer_lets_go_even_inside_a_reference_cycle(tmp_path):
    folder = tmp_path / "ckpts"
    trainer = _trainer(folder, checkpoint_every=2)
    trainer.fit((X, Y), epochs=1)
    trainer.me = trainer  # only the cyclic garbage collector can free it
    del trainer
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _trainer(folder).resume()  # the contested directory makes the lock collect garbage first


def test_pruning_and_resuming_touch_only_this_runs_checkpoints(tmp_path):
    folder = tmp_path / "ckpts"
    old = _trainer(folder, checkpoint_every=1, keep_checkpoints=2)
    old.fit((X, Y), epochs=2)  # 8 steps: keeps 7 and 8
    old_run = old.checkpoints.run.id
    del old
    gc.collect()
    fresh = _trainer(folder, seed=3, checkpoint_every=1, keep_checkpoints=1)
    with pytest.warns(RuntimeWarning, match=f"holds 2 checkpoint\\(s\\) of another run \\(run {old_run}: steps 7-8\\)"):
        fresh.fit((X, Y), epochs=1)  # 4 steps, a fresh run (its own seed), keeps 1
    runs = {p.name: _training(p)["run"]["id"] for p in list_checkpoints(folder)}
    assert runs == {"ckpt-00000003.safetensors": fresh.checkpoints.run.id,  # its newest good one (4 is pending)
                    "ckpt-00000004.safetensors": fresh.checkpoints.run.id,
                    "ckpt-00000007.safetensors": old_run, "ckpt-00000008.safetensors": old_run}
    assert latest_checkpoint(folder).name == "ckpt-00000004.safetensors"  # the run that saved last
    del fresh
    resumed = _trainer(folder)
    with pytest.warns(RuntimeWarning, match=f"also holds checkpoints of other runs \\(run {old_run}: steps 7-8\\)"):
        info = resumed.resume()
    assert (info.step, resumed.seed) == (4, 3)  # this run's state, not the other run's step 8 and seed 0


# ---------------------------------------------------------------- temporary files of killed saves
def test_a_save_killed_mid_write_leaves_a_temp_file_that_the_next_save_removes_but_never_a_live_writers(
        tmp_path, child):
    folder = tmp_path / "ckpts"
    process, said = child(folder, "hang-in-write")
    assert said[0] == "writing"
    temp = folder / os.path.basename(said[1])
    assert temp.is_file() and temp.stat().st_size > 0 and temp.name.startswith(".ckpt-00000003.safetensors.")
    assert f"nf-{host_tag()}-{process.pid}-" in temp.name  # the name says which process writes it

    # a live writer's temporary file survives another save in the same directory
    assert remove_stale_temps(folder, exclusive=True) == []
    nf.save(nf.Sequential(ops.Linear(2, 2)), folder / "other.safetensors")
    assert temp.is_file()

    _kill(process)  # now its writer is gone
    leftovers = sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp"))
    assert leftovers == [temp.name]
    with pytest.warns(RuntimeWarning, match="that process is no longer running"):
        info = _trainer(folder).resume()  # resuming removes it
    assert info.step == 2 and not temp.exists()
    assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_a_model_files_temp_left_by_a_dead_writer_goes_at_the_next_save_in_that_directory(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process that has ended
    stale = tmp_path / f".mlp.safetensors.nf-{host_tag()}-{pid}-0123456789ab.tmp"
    live = tmp_path / f".mlp.safetensors.nf-{host_tag()}-{os.getppid()}-0123456789ab.tmp"
    elsewhere = tmp_path / f".mlp.safetensors.nf-{'0' * 8 if host_tag() != '0' * 8 else '1' * 8}-{pid}-ab.tmp"
    for path in (stale, live, elsewhere):
        path.write_bytes(b"half a file")
    nf.save(nf.Sequential(ops.Linear(2, 2)), tmp_path / "mlp.safetensors")
    assert not stale.exists()
    assert live.exists() and elsewhere.exists()  # a live writer's, and one this host cannot judge
