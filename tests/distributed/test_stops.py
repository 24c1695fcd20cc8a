"""Stopping a ``neuroflow train --nproc 2`` run as a user or a scheduler does: Ctrl-C (SIGINT to the terminal's
whole process group, or to the launcher alone) stops every rank after its step and reports the model; SIGTERM to
the launcher stops the run and says so, with exit status 143."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from cli_runs import checkpoints, command, environment, finish, mnist_config, wait_for


def started(tmp_path):
    """A long 2-rank run in a session of its own (as under a terminal), once it has written a checkpoint."""
    config = mnist_config(tmp_path, epochs=50, checkpoint_dir="ckpt", checkpoint_every=5, keep_checkpoints=2)
    process = subprocess.Popen(command("train", str(config), "--nproc", "2"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=environment(),
                               start_new_session=True)
    wait_for(lambda: checkpoints(tmp_path / "ckpt"), process, "a first checkpoint")
    return process


@pytest.mark.parametrize("whom", ["process group", "launcher"])
def test_ctrl_c_stops_every_rank_after_its_step_and_reports_the_model(tmp_path, whom):
    process = started(tmp_path)
    if whom == "process group":  # what a terminal's Ctrl-C does: the launcher, and whatever shares its group
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.send_signal(signal.SIGINT)
    code, output = finish(process)
    assert code == 0, output[-3000:]
    assert "training interrupted; reporting the model as it is" in output, output[-3000:]
    assert "test: loss" in output and "exit status" not in output, output[-3000:]


def test_sigterm_to_the_launcher_stops_the_run_and_says_so(tmp_path):
    process = started(tmp_path)
    process.terminate()
    code, output = finish(process)
    assert code == 128 + signal.SIGTERM, output[-3000:]
    assert "the run was stopped by SIGTERM, sent to the launcher" in output, output[-3000:]
    assert "died" not in output, output[-3000:]
    assert "run the same command with --resume" in output, output[-3000:]  # the run wrote checkpoints
