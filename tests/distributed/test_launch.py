"""``neuroflow train CONFIG --nproc N``: the launcher finds mpiexec, starts N workers of the same command, trains as one
process would, and says what to install or set when something is missing."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from cli_runs import mnist_config, neuroflow, parameters  # tests/distributed is on sys.path

from neuroflow.cli import main

launch = pytest.importorskip("neuroflow_distributed.launch")
records = pytest.importorskip("neuroflow_distributed.records")
CommunicatorError = pytest.importorskip("neuroflow_distributed.communicator").CommunicatorError


def relative(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_two_processes_train_the_example_to_the_parameters_of_one(tmp_path):
    config = mnist_config(tmp_path, max_steps=20)
    one = neuroflow("train", str(config), "--save", "one.safetensors", cwd=tmp_path)
    assert one.returncode == 0, one.stdout + one.stderr
    two = neuroflow("train", str(config), "--nproc", "2", "--save", "two.safetensors", cwd=tmp_path)
    assert two.returncode == 0, two.stdout + two.stderr
    assert "starting 2 ranks (mpi, OMP_NUM_THREADS=1)" in two.stderr
    assert "2 ranks (the batch is the global one" in two.stdout
    # rank 0 alone prints and saves: one model line, one test line, one file
    assert two.stdout.count("test: loss") == 1 and two.stdout.count("saved the model") == 1, two.stdout
    a, b = parameters(tmp_path / "one.safetensors"), parameters(tmp_path / "two.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert relative(b[name], a[name]) <= 1e-5, name
    accuracy = [float(line.split("accuracy")[1]) for run in (one, two) for line in run.stdout.splitlines()
                if line.startswith("test:")]
    assert accuracy[0] == pytest.approx(accuracy[1], abs=2e-3)  # evaluate sums every rank's rows


def test_one_process_through_mpiexec_is_a_run_of_one_rank(tmp_path):
    config = mnist_config(tmp_path, max_steps=3)
    result = neuroflow("train", str(config), "--nproc", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "starting 1 ranks" in result.stderr and "test: loss" in result.stdout
    assert "1 ranks (the batch" not in result.stdout  # the data line of one rank reads as one process's


def test_workers_get_the_same_arguments_less_nproc(tmp_path):
    import argparse

    from neuroflow.cli import train

    parser = argparse.ArgumentParser()
    train.configure(parser)
    args = parser.parse_args(["c.toml", "--nproc", "4", "--epochs", "3", "--save", "m.safetensors", "--resume",
                              "--max-steps", "7"])
    argv = train._worker_argv(args)
    assert argv[:2] == ["train", "c.toml"] and "--nproc" not in argv and "--resume" in argv
    assert argv[argv.index("--epochs") + 1] == "3" and argv[argv.index("--max-steps") + 1] == "7"
    assert argv[argv.index("--save") + 1] == str(Path("m.safetensors").resolve())
    command = launch.worker_command("/x/mpiexec", 4, argv)
    assert command[:3] == ["/x/mpiexec", "-n", "4"] and command[3] == sys.executable and command[-len(argv):] == argv


def test_mpiexec_arguments_from_the_environment_go_before_the_program(monkeypatch):
    monkeypatch.setenv(launch.MPIEXEC_ARGS_VARIABLE, "-f hosts.txt")
    assert launch.worker_command("mpiexec", 4, ["train", "c.toml"])[:5] == ["mpiexec", "-n", "4", "-f", "hosts.txt"]


def test_neuroflow_mpiexec_names_the_mpiexec_to_use(monkeypatch, tmp_path):
    fake = tmp_path / "my-mpiexec"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv(launch.MPIEXEC_VARIABLE, str(fake))
    assert launch.find_mpiexec() == str(fake)
    monkeypatch.setenv(launch.MPIEXEC_VARIABLE, str(tmp_path / "missing"))
    with pytest.raises(CommunicatorError, match="NEUROFLOW_MPIEXEC=.*missing.* is not an executable"):
        launch.find_mpiexec()


def test_without_mpi4py_the_error_says_what_to_install(monkeypatch):
    monkeypatch.delenv(launch.MPIEXEC_VARIABLE, raising=False)
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # import mpi4py now raises ImportError
    with pytest.raises(CommunicatorError, match=r"--nproc needs mpi4py.*pip install 'neuroflow-distributed\[mpich\]'"):
        launch.find_mpiexec()


def test_nproc_with_mpi4py_missing_is_a_clear_cli_error(monkeypatch, tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text('[model]\nlayers = [{ type = "Linear", in_features = 2, out_features = 2 }]\n'
                      '[data]\ntrain = "t.npz"\n')
    monkeypatch.delenv(launch.MPIEXEC_VARIABLE, raising=False)
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    assert main(["train", str(config), "--nproc", "2"]) == 1
    assert "pip install 'neuroflow-distributed[mpich]'" in capsys.readouterr().err


def test_nproc_with_an_unknown_communicator_lists_the_known_ones(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text('distributed = "carrier-pigeon"\n[model]\nlayers = [{ type = "Linear", in_features = 2, '
                      'out_features = 2 }]\n[data]\ntrain = "t.npz"\n')
    assert main(["train", str(config), "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert "carrier-pigeon" in err and "mpi" in err


def test_nproc_with_nccl_and_no_cupy_or_gpu_says_so_before_starting_any_rank(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError, as on a machine without CuPy
    config = tmp_path / "c.toml"
    config.write_text('distributed = "nccl"\n[model]\nlayers = [{ type = "Linear", in_features = 2, '
                      'out_features = 2 }]\n[data]\ntrain = "t.npz"\n')
    assert main(["train", str(config), "--nproc", "2"]) == 1  # (a missing library, not a bad config: status 1)
    err = capsys.readouterr().err
    assert "the nccl communicator needs CuPy with NCCL: pip install cupy-cuda12x" in err
    assert "starting 2 ranks" not in err  # refused before mpiexec, not once by every rank


def test_nproc_without_neuroflow_distributed_says_what_to_install(tmp_path):
    config = mnist_config(tmp_path, max_steps=1)
    result = neuroflow("train", str(config), "--nproc", "2", cwd=tmp_path, NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD="1")
    assert result.returncode == 2
    assert "communicator 'mpi' is not installed; it comes with: pip install neuroflow-distributed" in result.stderr


def test_resume_without_a_checkpoint_dir_is_refused_before_any_rank_starts(tmp_path, capsys):
    config = tmp_path / "c.toml"
    config.write_text('[model]\nlayers = [{ type = "Linear", in_features = 2, out_features = 2 }]\n'
                      '[data]\ntrain = "t.npz"\n')
    assert main(["train", str(config), "--nproc", "2", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "--resume needs checkpoint_dir" in err and "starting" not in err


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_nproc_must_be_a_positive_integer(value, capsys):
    assert main(["train", "c.toml", "--nproc", value]) == 2
    assert "--nproc" in capsys.readouterr().err


def test_launch_refuses_a_bad_process_count():
    for bad in (0, -2, True, 1.5):
        with pytest.raises(CommunicatorError, match="--nproc must be a positive integer"):
            launch.launch(bad, ["train", "c.toml"])


# ---------------------------------------------------------------------------- naming the lost rank, from records
def run_dir_with(tmp_path, size=2):
    directory = records.RunDirectory(tmp_path / "run")
    for rank in range(size):
        directory._write(rank, "json", {"rank": rank, "size": size, "pid": 1000 + rank, "host": "node", "time": 0})
    return directory


def test_a_rank_mpiexec_reports_killed_is_named_by_its_pid(tmp_path):
    directory = run_dir_with(tmp_path)
    hydra = (b"=   BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES\n=   PID 1001 RUNNING AT node\n"
             b"=   EXIT CODE: 9\n=   CLEANING UP REMAINING PROCESSES\nYOUR APPLICATION TERMINATED WITH THE EXIT "
             b"STRING: Killed (signal 9)\n")
    message = launch.lost_rank_message(directory, 2, 9, hydra)
    assert message.startswith("rank 1 of 2 (pid 1001 on node) died: killed by signal 9 (SIGKILL)")
    assert "--resume" not in message  # said by neuroflow train, and only where a checkpoint is there
    open_mpi = b"mpiexec noticed that process rank 0 with PID 1000 on node node exited on signal 9 (Killed)."
    assert launch.lost_rank_message(directory, 2, 137, open_mpi).startswith("rank 0 of 2 (pid 1000 on node) died")


def test_a_rank_that_failed_is_named_with_its_error(tmp_path):
    directory = run_dir_with(tmp_path)
    directory.write_exit(1, 1, "NonFiniteDataError: loss became nan at step 1.")
    message = launch.lost_rank_message(directory, 2, 1)
    assert message.startswith("rank 1 of 2 (pid 1001 on node) failed: NonFiniteDataError: loss became nan at step 1;")


def test_a_lost_rank_another_rank_found_is_named(tmp_path):
    directory = run_dir_with(tmp_path)
    directory.write_exit(0, 70, "rank 0 waited 5 s in an allreduce: rank 1 is not answering", lost=[1])
    message = launch.lost_rank_message(directory, 2, 70)
    assert message.startswith("rank 1 of 2 was lost, and rank 0 ended the run: rank 0 waited 5 s")


def test_a_rank_that_never_started_is_named(tmp_path):
    directory = records.RunDirectory(tmp_path / "run")
    directory._write(0, "json", {"rank": 0, "size": 2, "pid": 1, "host": "node", "time": 0})
    assert launch.lost_rank_message(directory, 2, 1).startswith("rank 1 of 2 never started")
    assert "no rank left a record" in launch.lost_rank_message(run_dir_with(tmp_path), 2, 3)
