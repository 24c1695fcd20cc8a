"""``neuroflow train`` runs for the launch and fault tests: a small MNIST config from examples/mnist_mlp.toml, the
command run (or started) as a user would, with OMP_NUM_THREADS=1 and a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import neuroflow as nf

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "mnist_mlp.toml"
#: every run ends within this many seconds or the test fails: a hung run must not hang the suite
TIMEOUT_S = 120
MAIN = "import sys; from neuroflow.cli.main import main; sys.exit(main(sys.argv[1:]))"


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{key} = {toml_value(v)}" for key, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return json.dumps(value)


def mnist_config(directory: Path, train_rows: int = 2048, test_rows: int = 512, nan_row: int | None = None,
                 **keys: Any) -> Path:
    """examples/mnist_mlp.toml on the first MNIST rows (``.npz`` files), with top-level ``keys`` added.

    ``nan_row`` puts a NaN into that training row (with ``shuffle = false`` it is in a known rank's shard).
    """
    try:
        train = nf.data.mnist("train", flat=True, normalize=True)
        test = nf.data.mnist("test", flat=True, normalize=True)
    except FileNotFoundError as exc:
        pytest.skip(f"MNIST is not on this machine: {exc}")
    x = np.array(train.x[:train_rows])
    if nan_row is not None:
        x[nan_row, 0] = np.nan
    np.savez(directory / "train.npz", x=x, y=train.y[:train_rows])
    np.savez(directory / "test.npz", x=test.x[:test_rows], y=test.y[:test_rows])
    raw = tomllib.loads(EXAMPLE.read_text())
    raw["data"] = {"train": "train.npz", "test": "test.npz"}
    raw.update(keys)
    lines = [f"{key} = {toml_value(value)}" for key, value in raw.items() if not isinstance(value, dict)]
    for table, values in ((k, v) for k, v in raw.items() if isinstance(v, dict)):
        lines += [f"[{table}]", *(f"{key} = {toml_value(value)}" for key, value in values.items())]
    path = directory / "mnist_mlp.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def environment(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    for name in ("NEUROFLOW_DISTRIBUTED", "NEUROFLOW_RUN_DIR", "NEUROFLOW_COLLECTIVE_TIMEOUT", "NEUROFLOW_MPIEXEC"):
        env.pop(name, None)
    env.update(extra)
    return env


def command(*args: str) -> list[str]:
    return [sys.executable, "-c", MAIN, *args]


def neuroflow(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``neuroflow ARGS`` to its end (at most TIMEOUT_S)."""
    return subprocess.run(command(*args), capture_output=True, text=True, timeout=TIMEOUT_S, cwd=cwd,
                          env=environment(**env))


def start(*args: str, cwd: Path, **env: str) -> subprocess.Popen[str]:
    """``neuroflow ARGS`` started; :func:`finish` collects it."""
    return subprocess.Popen(command(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env=environment(**env))


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    """The exit status and output of a started run (killed, and the test failed, past TIMEOUT_S)."""
    try:
        out, err = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the run did not end within {TIMEOUT_S} s:\n{out[-3000:]}\n{err[-3000:]}")
    return process.returncode, out + err


def wait_for(condition: Any, process: subprocess.Popen[str], what: str) -> None:
    """Poll ``condition()`` until true; fail when the run ended first or TIMEOUT_S passed."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if process.poll() is not None or time.monotonic() > deadline:
            code, output = finish(process)
            pytest.fail(f"{what} never happened (run exited {code}):\n{output[-4000:]}")
        time.sleep(0.05)


def rank_pid(run_dir: Path, rank: int) -> int | None:
    try:
        return int(json.loads((run_dir / f"rank-{rank}.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def checkpoints(directory: Path) -> list[Path]:
    return sorted(directory.glob("ckpt-*.safetensors"))


def parameters(path: Path) -> dict[str, np.ndarray]:
    return {name: np.array(p.data) for name, p in nf.load(path).named_parameters()}
