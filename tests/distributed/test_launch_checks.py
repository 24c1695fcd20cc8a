"""What ``neuroflow train`` checks around its ranks: a batch too small for ``--nproc`` is refused before any rank
starts, ``--resume`` is advised only where a checkpoint is there, a rank that fails before meeting the others ends
the run instead of leaving them waiting, and the run directories of killed launchers are removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from cli_runs import command, environment, mnist_config, neuroflow

from neuroflow.cli import main

launch = pytest.importorskip("neuroflow_distributed.launch")

CONFIG = """batch_size = 16
epochs = 1
seed = 0
[model]
layers = [{{ type = "Linear", in_features = 4, out_features = 2 }}]
[data]
train = "{train}"
[loss]
type = "CrossEntropy"
[optimizer]
type = "SGD"
lr = 0.1
"""


def small_configs(directory):
    """``good.toml`` on a small training file, and ``missing.toml`` naming a file that is not there."""
    rng = np.random.default_rng(0)
    np.savez(directory / "train.npz", x=rng.normal(size=(64, 4)).astype(np.float32), y=rng.integers(0, 2, 64))
    (directory / "good.toml").write_text(CONFIG.format(train="train.npz"))
    (directory / "missing.toml").write_text(CONFIG.format(train="missing.npz"))


def test_a_batch_smaller_than_nproc_is_refused_before_any_rank_starts(tmp_path, capsys):
    small_configs(tmp_path)
    code = main(["train", str(tmp_path / "good.toml"), "--batch-size", "1", "--nproc", "2"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--nproc 2 shares each batch among 2 ranks, but the batch has 1 sample(s)" in err
    assert "--batch-size 2 or more" in err and "starting" not in err


def test_a_failed_run_without_checkpoints_gives_no_resume_advice(tmp_path):
    config = mnist_config(tmp_path, max_steps=20, shuffle=False, nan_row=40)
    result = neuroflow("train", str(config), "--nproc", "2", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "failed: NonFiniteDataError" in output and "--resume" not in output, output[-3000:]


def test_a_rank_that_fails_before_meeting_the_others_ends_the_run(tmp_path):
    small_configs(tmp_path)
    run = [launch.find_mpiexec(), "-n", "1", *command("train", "good.toml"), ":",
           "-n", "1", *command("train", "missing.toml")]
    began = time.monotonic()
    process = subprocess.Popen(run, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               env=environment(NEUROFLOW_COLLECTIVE_TIMEOUT="10"), start_new_session=True)
    try:
        out, err = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # mpiexec and its ranks
        process.communicate()
        pytest.fail("rank 0 was left waiting for the rank that failed")
    assert process.returncode != 0, out + err
    assert "rank 1 of 2 aborts the run" in err and "missing.npz' not found" in err, err[-3000:]
    assert time.monotonic() - began < 30


def test_the_run_directories_of_killed_launchers_are_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(launch.tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    stale = tmp_path / f"neuroflow-run-{gone.pid}-abc123"
    live = tmp_path / f"neuroflow-run-{os.getpid()}-def456"
    other = tmp_path / "neuroflow-run-unrelated"
    for folder in (stale, live, other):
        folder.mkdir()
        (folder / "rank-0.beat").write_text("{}")
    launch.remove_stale_run_directories()
    assert not stale.exists() and live.exists() and other.exists()
