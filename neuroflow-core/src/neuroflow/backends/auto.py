"""``NEUROFLOW_BACKEND=auto``: measure the installed backends once, remember the fastest, never pick one slower than cpu.

An integrated GPU can train slower than the CPU beside it (its launches
cost more than the arithmetic it saves), so the choice is measured, not
assumed: a few training steps of a small MLP on every backend that can run,
timed after warm-up. The result is cached per machine — keyed by the host,
the CPU count and the installed backends with their versions — in
``$NEUROFLOW_CACHE_DIR`` (default ``~/.cache/neuroflow``), so later runs
start at once. An explicit name (``opencl:1``) never consults any of this,
and a plugin's ``neuroflow_select_backend`` answer wins over the measurement.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

#: A backend must be this much faster than cpu to be chosen: timing noise must not flip the choice.
MARGIN = 0.9
CACHE_FILE = "backend-choice.json"


def cache_path() -> Path:
    root = os.environ.get("NEUROFLOW_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "neuroflow")
    return Path(root) / CACHE_FILE


def fingerprint(names: list[str]) -> str:
    """What the choice depends on: this host, its CPUs and the installed backends' distributions."""
    from neuroflow import registry

    versions = []
    for name in sorted(names):
        dist = registry.backends.distribution(name)
        try:
            versions.append(f"{name}={metadata.version(dist) if dist else '?'}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name}=?")
    return "|".join([platform.node(), platform.machine(), str(os.cpu_count()), sys.version.split()[0], *versions])


def measure(name: str, steps: int = 12) -> float:
    """Median seconds of one training step (MLP 784-128-10, batch 64, SGD) on backend ``name``."""
    import neuroflow as nf
    from neuroflow.backends.selection import get_backend

    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 784)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    model = nf.Sequential(nf.ops.Linear(784, 128), nf.ops.ReLU(), nf.ops.Linear(128, 10))
    trainer = nf.Trainer(model, optimizer=nf.optim.SGD(lr=0.01), device=get_backend(name), batch_size=64,
                         progress=False, seed=0)
    for _ in range(3):  # compiles kernels, plans the arena
        trainer.train_step(x, y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.train_step(x, y)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def choose(available: list[str], timer: Callable[[str], float] | None = None) -> tuple[str, dict[str, Any]]:
    """The fastest runnable backend (cpu unless another beats it by the margin) and what was measured."""
    from neuroflow import registry

    timer = timer or measure
    runnable = []
    for name in available:
        try:
            if registry.backends.get(name).is_available():
                runnable.append(name)
        except Exception:  # a broken plugin cannot be chosen; doctor reports why
            continue
    key = fingerprint(runnable)
    path = cache_path()
    cached = _read(path)
    if cached.get("fingerprint") == key and cached.get("choice") in runnable:
        return cached["choice"], cached
    timings: dict[str, float] = {}
    failures: dict[str, str] = {}
    for name in ["cpu", *(n for n in runnable if n != "cpu")]:
        try:
            timings[name] = timer(name)
        except Exception as exc:  # a backend that cannot train this workload is not a candidate
            failures[name] = f"{type(exc).__name__}: {exc}"
    choice = "cpu"
    baseline = timings.get("cpu", float("inf"))
    for name, seconds in sorted(timings.items(), key=lambda item: item[1]):
        if name != "cpu" and seconds < MARGIN * baseline:
            choice = name
        break
    record = {"fingerprint": key, "choice": choice, "step_seconds": timings, "failures": failures,
              "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    _write(path, record)
    return choice, record


def cached_choice() -> dict[str, Any]:
    """The cached measurement, for ``neuroflow doctor`` (empty when ``auto`` has not run on this machine)."""
    return _read(cache_path())


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write(path: Path, record: dict[str, Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(path)
    except OSError:  # a read-only home only costs a new measurement next time
        pass
