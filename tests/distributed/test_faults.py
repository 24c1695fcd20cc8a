"""A rank that dies, hangs or fails ends the whole ``neuroflow train --nproc 2`` run within a bounded time (every run
here has a timeout), with a non-zero exit and a message naming the lost rank; the last checkpoint stays intact and
``--resume`` continues from it. Real mpiexec runs (OMP_NUM_THREADS=1), then the monitor's logic on fakes."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import numpy as np
import pytest
from cli_runs import checkpoints, finish, mnist_config, neuroflow, parameters, rank_pid, start, wait_for

faults = pytest.importorskip("neuroflow_distributed.faults")
records = pytest.importorskip("neuroflow_distributed.records")


def kill_quietly(pid: int | None) -> None:
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def started_training(tmp_path, **env):
    """A 2-rank run of 120 steps writing a checkpoint every 5, once its first checkpoint is there."""
    config = mnist_config(tmp_path, max_steps=120, checkpoint_dir="ckpt", checkpoint_every=5, keep_checkpoints=2)
    run_dir = tmp_path / "run"
    process = start("train", str(config), "--nproc", "2", "--save", "killed.safetensors", cwd=tmp_path,
                    NEUROFLOW_RUN_DIR=str(run_dir), **env)
    wait_for(lambda: rank_pid(run_dir, 1) is not None and checkpoints(tmp_path / "ckpt"), process,
             "a first checkpoint")
    return config, process, run_dir


def test_a_killed_rank_ends_the_run_naming_it_and_resume_continues_from_the_last_checkpoint(tmp_path):
    config, process, run_dir = started_training(tmp_path)
    victim = rank_pid(run_dir, 1)
    os.kill(victim, signal.SIGKILL)
    code, output = finish(process)  # within TIMEOUT_S, or the test fails
    assert code != 0
    assert f"rank 1 of 2 (pid {victim} on " in output and "killed by signal 9 (SIGKILL)" in output, output[-3000:]
    assert "--resume" in output
    assert not (tmp_path / "killed.safetensors").exists()
    kept = checkpoints(tmp_path / "ckpt")  # whole files only: a write the abort cut short is a temporary file
    assert kept
    last = int(kept[-1].stem.split("-")[1])
    assert last < 120

    resumed = neuroflow("train", str(config), "--nproc", "2", "--resume", "--save", "resumed.safetensors",
                        cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # rank 0 may have been writing a checkpoint when the run was aborted: its writer is gone, and the resumed
    # run's saves removed what it left
    assert not list((tmp_path / "ckpt").glob(".ckpt-*"))
    assert f"resumed from {kept[-1]} at step {last}" in resumed.stdout
    assert "written by" not in resumed.stdout  # the same number of ranks: nothing to say

    # the resumed run ends where a run never killed ends
    (tmp_path / "whole").mkdir()
    whole_config = mnist_config(tmp_path / "whole", max_steps=120, checkpoint_dir="ckpt", checkpoint_every=5)
    whole = neuroflow("train", str(whole_config), "--nproc", "2", "--save", "whole.safetensors", cwd=tmp_path / "whole")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    a, b = parameters(tmp_path / "resumed.safetensors"), parameters(tmp_path / "whole" / "whole.safetensors")
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_a_hung_rank_ends_the_run_after_the_collective_timeout_naming_it(tmp_path):
    config, process, run_dir = started_training(tmp_path, NEUROFLOW_COLLECTIVE_TIMEOUT="4")
    victim = rank_pid(run_dir, 1)
    os.kill(victim, signal.SIGSTOP)  # alive, but answering nothing: what a deadlock or a frozen machine looks like
    try:
        code, output = finish(process)
    finally:
        kill_quietly(victim)
    assert code == faults.EXIT_LOST, output[-3000:]
    assert "rank 1 of 2 was lost, and rank 0 ended the run: rank 0 waited 4 s" in output, output[-3000:]
    assert f"rank 1 (pid {victim} on " in output and "is not answering" in output
    assert checkpoints(tmp_path / "ckpt")


def test_an_error_on_one_rank_does_not_leave_the_other_waiting(tmp_path):
    # no shuffling: the first global batch is rows 0..63, and rank 1 takes rows 32..63
    config = mnist_config(tmp_path, max_steps=20, shuffle=False, nan_row=40)
    result = neuroflow("train", str(config), "--nproc", "2", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "rank 1 of 2 (pid " in output and "failed: NonFiniteDataError: loss became nan at step 1" in output


def test_resuming_with_another_number_of_ranks_says_what_it_means(tmp_path):
    config = mnist_config(tmp_path, max_steps=10, checkpoint_dir="ckpt", checkpoint_every=5)
    first = neuroflow("train", str(config), "--nproc", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    more = neuroflow("train", str(config), "--resume", "--max-steps", "15", cwd=tmp_path)
    assert more.returncode == 0, more.stdout + more.stderr
    assert "at step 10" in more.stdout
    assert "written by 2 rank(s) and training continues with 1: the same global batches" in more.stdout


# ---------------------------------------------------------------------------- the monitor, on fakes
class FakeCommunicator:
    def __init__(self, rank=0, size=2):
        self.rank, self.size = rank, size
        self.aborted: list[tuple[int, str]] = []

    def abort(self, code, message):
        self.aborted.append((code, message))


class NeverDone:
    def Test(self):  # noqa: N802 - mpi4py's name
        return False


def monitor_with(tmp_path, beats, timeout=0.05):
    directory = records.RunDirectory(tmp_path / "run")
    for rank, beat in beats.items():
        directory.write_start(rank, 2)
        if beat is not None:
            directory.write_beat(rank, beat)
    return faults.FaultMonitor(FakeCommunicator(), directory, timeout), directory


def test_a_collective_past_its_deadline_names_a_rank_whose_heartbeat_stopped(tmp_path):
    monitor, directory = monitor_with(tmp_path, {0: {"waiting": None}, 1: {"waiting": None}})
    stale = records.RunDirectory(directory.path)._read(1, "beat")
    stale["time"] = time.time() - 60
    directory._write(1, "beat", stale)
    with pytest.raises(faults.LostRankError, match="rank 1 .* is not answering: its last heartbeat was 60 s ago"):
        monitor.wait(NeverDone(), "a gradient allreduce")
    code, message = monitor.communicator.aborted[0]
    assert code == faults.EXIT_LOST and "rank 0 waited 0 s" in message and "in a gradient allreduce" in message
    assert directory.read(0).exit["lost"] == [1]


def test_a_rank_alive_outside_any_collective_is_named_as_stuck(tmp_path):
    monitor, _ = monitor_with(tmp_path, {0: None, 1: {"waiting": None, "collectives": 7}})
    lost, text = monitor.diagnose()
    assert lost == [1] and "alive but not in a collective" in text and "after 7 collectives" in text


def test_every_rank_waiting_means_mismatched_collectives(tmp_path):
    monitor, _ = monitor_with(tmp_path, {0: None, 1: {"waiting": "a barrier", "since": time.time()}})
    assert monitor.diagnose() == ([], "every other rank is waiting in a collective too: the ranks called "
                                      "different collectives (rank 1 in a barrier)")


def test_a_rank_that_never_started_or_ended_is_named(tmp_path):
    monitor, directory = monitor_with(tmp_path, {0: None})
    assert "rank 1 left no record in the run directory (it never started, or runs on another host" in \
        monitor.diagnose()[1]
    directory.write_start(1, 2)
    directory.write_exit(1, 1, "ValueError: x")
    assert monitor.diagnose() == ([1], "rank 1 has ended (ValueError: x)")


def test_without_a_run_directory_the_timeout_still_ends_the_run(tmp_path):
    monitor = faults.FaultMonitor(FakeCommunicator(), None, 0.01)
    with pytest.raises(faults.LostRankError, match="another of the 2 ranks is lost or hung"):
        monitor.wait(NeverDone(), "a barrier")


def test_an_unhandled_exception_aborts_every_rank(tmp_path, capsys):
    monitor, directory = monitor_with(tmp_path, {0: None})
    monitor._excepthook(ValueError, ValueError("bad batch"), None)
    assert monitor.communicator.aborted == [(1, "unhandled ValueError: bad batch")]
    assert directory.read(0).exit["reason"] == "unhandled ValueError: bad batch"
    monitor.record_abort(1, "again")  # the communicator's abort after it records nothing more
    assert directory.read(0).exit["reason"] == "unhandled ValueError: bad batch"


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_a_bad_collective_timeout_is_named(monkeypatch, value):
    monkeypatch.setenv(faults.TIMEOUT_VARIABLE, value)
    with pytest.raises(faults.CommunicatorError, match=f"NEUROFLOW_COLLECTIVE_TIMEOUT must be a positive number "
                                                       f"of seconds; got '{value}'"):
        faults.collective_timeout()


def test_the_collective_timeout_defaults_to_five_minutes(monkeypatch):
    monkeypatch.delenv(faults.TIMEOUT_VARIABLE, raising=False)
    assert faults.collective_timeout() == 300.0
    monkeypatch.setenv(faults.TIMEOUT_VARIABLE, "2.5")
    assert faults.collective_timeout() == 2.5


def test_killing_the_lead_rank_mid_save_keeps_the_last_checkpoint_and_resume_continues(tmp_path):
    config, process, run_dir = started_training(tmp_path)
    victim = rank_pid(run_dir, 0)  # rank 0 writes the checkpoints: killed while one is half written, if caught so
    folder = tmp_path / "ckpt"
    deadline = time.monotonic() + 20
    while not list(folder.glob(".ckpt-*")) and time.monotonic() < deadline and process.poll() is None:
        pass
    os.kill(victim, signal.SIGKILL)
    code, output = finish(process)
    assert code != 0
    assert f"rank 0 of 2 (pid {victim} on " in output and "killed by signal 9 (SIGKILL)" in output, output[-3000:]
    kept = checkpoints(folder)
    assert kept
    for path in kept:  # every checkpoint left is whole: it loads
        assert parameters(path)
    resumed = neuroflow("train", str(config), "--nproc", "2", "--resume", "--max-steps", str(_step_of(kept[-1]) + 5),
                        cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"resumed from {kept[-1]} at step {_step_of(kept[-1])}" in resumed.stdout
    assert not list(folder.glob(".ckpt-*"))  # the half-written file of the killed rank is gone


def _step_of(path) -> int:
    return int(path.stem.split("-")[1])
