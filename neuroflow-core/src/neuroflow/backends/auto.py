"""``NEUROFLOW_BACKEND=auto``: measure the installed backends once, remember the fastest, never pick one slower than cpu.

An integrated GPU can train slower than the CPU beside it (its launches
cost more than the arithmetic it saves), so the choice is measured, not
assumed: a few training steps of a small MLP on every backend that can run,
timed after warm-up. Each backend is measured in a child process
(``python -m neuroflow.probe``), which qualifies the device on the way
(``neuroflow.backends.qualification``): a driver that crashes, hangs or
computes wrong results there is "not chosen" and a line in
``neuroflow doctor``, and the user's process only ever runs the backend
that was chosen. The result is cached per machine — keyed by the host,
the CPU count and the installed backends with their versions — in
``$NEUROFLOW_CACHE_DIR`` (default ``~/.cache/neuroflow``), so later runs
start at once. An explicit name (``opencl:1``) never consults any of this,
and a plugin's ``neuroflow_select_backend`` answer wins over the measurement.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from neuroflow import registry
from neuroflow.backends import qualification, verdicts
from neuroflow.errors import ConfigError

#: A backend must be this much faster than cpu to be chosen: timing noise must not flip the choice.
MARGIN = 0.9
CACHE_FILE = verdicts.AUTO_CHOICE_FILE


def cache_path() -> Path:
    return verdicts.cache_dir() / CACHE_FILE


def fingerprint(names: list[str]) -> str:
    """What the choice depends on: this host, its CPUs, the installed backends' distributions and their
    devices as qualification knows them (a new driver is measured again)."""
    versions = []
    for name in sorted(names):
        dist = registry.backends.distribution(name)
        try:
            versions.append(f"{name}={metadata.version(dist) if dist else '?'}")
        except metadata.PackageNotFoundError:
            versions.append(f"{name}=?")
        cls = registry.backends.get(name)
        if cls.needs_qualification:
            with contextlib.suppress(Exception):  # a backend that cannot list its devices is measured as it is
                versions += [verdicts.key(cls, i) for i in range(cls.device_count())]
    return "|".join([platform.node(), platform.machine(), str(os.cpu_count()), sys.version.split()[0], *versions])


def measure(name: str, steps: int = 12) -> float:
    """Median seconds of one training step (MLP 784-128-10, batch 64, SGD) on the first device of backend
    ``name`` that qualifies, timed in a child process that qualifies it first (its verdict is cached)."""
    cls = registry.backends.get(name)
    if not cls.needs_qualification:
        found = qualification.run_child(name, 0, time_steps=steps)
        if not found.ok:
            raise RuntimeError(found.explain())
        return float(found.step_seconds or 0.0)
    refusals = []
    for index in range(cls.device_count()):
        known = verdicts.cached().get(verdicts.key(cls, index))
        if known is not None and not known.ok:
            refusals.append(f"{known.device}: {known.explain()}")
            continue
        found = qualification.run_child(name, index, time_steps=steps)
        verdicts.remember(cls, index, found)
        if found.ok and found.step_seconds is not None:
            return float(found.step_seconds)
        refusals.append(f"{found.device}: {found.explain()}")
    raise RuntimeError("; ".join(refusals) or f"backend {name!r} has no device")


def choose(available: list[str], timer: Callable[[str], float] | None = None) -> tuple[str, dict[str, Any]]:
    """The fastest runnable backend (cpu unless another beats it by the margin) and what was measured.

    ``timer(name)`` gives the seconds of one training step on backend ``name``; the default, :func:`measure`,
    times it in the qualification child, so nothing above the backends is imported here."""
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
        except ConfigError:  # the user's setting (a bad timeout), not the backend: say so, choose nothing
            raise
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
    if "cpu" in timings:  # without the baseline nothing was compared: measure again next time
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
