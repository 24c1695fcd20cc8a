"""Qualification: a device is used in this process only after it has trained correctly in a child process.

A driver can crash (pocl 3.0's LLVM 14 segfaulted compiling our GEMM for AMD Zen 4), hang or compute wrong
results. None of that may take the user's program with it, so the first time a device is used on a machine
— per backend, device, driver version and the hash of the backend package's source (its kernels are made
from that source) — NeuroFlow runs ``python -m neuroflow.probe`` on it in a child process, bounded by a
timeout: the backend's own kernel set (``Backend.self_test``), then a few training steps checked against
cpu. The verdict is cached in ``$NEUROFLOW_CACHE_DIR/qualification.json``; a refused device is not offered
(``opencl:N`` numbers the qualified devices only) and asking for it raises an error that says what failed.
The verdicts and their cache live in :mod:`neuroflow.backends.verdicts`; this module decides when a device
needs a child run and runs it; the names the verdicts module holds are importable from here too.

A backend that runs nothing but numpy (``Backend.needs_qualification = False``: cpu) is not qualified.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from neuroflow import registry
from neuroflow.backends.verdicts import (
    AUTO_CHOICE_FILE,
    CACHE_FILE,
    REFUSED,
    Verdict,
    cache_dir,
    cached,
    forget,
    key,
    remember,
    source_hash,
)
from neuroflow.errors import BackendUnavailableError, ConfigError

__all__ = [
    "AUTO_CHOICE_FILE", "CACHE_FILE", "CLIP", "DEFAULT_TIMEOUT", "MAX_TIMEOUT", "PREFIX", "REFUSED", "TIMEOUT_VAR",
    "Verdict", "cache_dir", "cached", "configured_timeout", "forget", "key", "offered", "remember", "resolve",
    "run_child", "source_hash", "verdict",
]

#: Seconds the child may take (cold driver caches compile every kernel); past it the device is "hung".
TIMEOUT_VAR = "NEUROFLOW_QUALIFY_TIMEOUT"
DEFAULT_TIMEOUT = 600.0
MAX_TIMEOUT = 86400.0
#: The child's protocol lines on stdout start with this (anything else a plugin prints is ignored).
PREFIX = "NEUROFLOW-PROBE "


def verdict(name: str, index: int, *, refresh: bool = False) -> Verdict:
    """The qualification of raw device ``index`` of backend ``name``: cached, else found by a child run."""
    cls = registry.backends.get(name)
    unreachable = _not_importable(name, cls)
    if unreachable:
        return Verdict(name, index, {"backend": name, "device": str(index)}, "failed", unreachable)
    k = key(cls, index)
    timeout = configured_timeout()
    if not refresh:
        known = cached().get(k)
        if known is not None and not (known.status == "hung" and timeout > known.timeout):
            return known
    found = run_child(name, index, timeout=timeout)
    remember(cls, index, found)
    return found


def _not_importable(name: str, cls: type) -> str:
    """Why a child process could not import backend class ``cls``, or "" when it can."""
    if not registry.backends.registered_at_run_time(name):
        return ""  # an entry point: the child loads it as this process did
    if cls.__module__ == "__main__" or "<locals>" in cls.__qualname__:
        where = "in __main__" if cls.__module__ == "__main__" else "inside a function"
        return (f"{cls.__name__} is defined {where}, where a child process cannot import it, so its devices "
                "cannot be qualified: define the class in a module of its own (my_backend.py) and register it "
                "from there, or, to run it unchecked in this process, set needs_qualification = False on it")
    return ""


def offered(name: str) -> list[tuple[int, Verdict]]:
    """(raw index, verdict) of every device of backend ``name``, qualifying those not yet qualified, their
    children side by side (an iGPU's and a CPU driver's first compiles then overlap)."""
    _STOPPING.clear()  # a Ctrl-C of an earlier call does not stop this one
    try:
        count = registry.backends.get(name).device_count()
    except Exception as exc:  # a plugin's enumeration that raises is that backend's failure, named
        raise BackendUnavailableError(f"backend {name!r} could not count its devices: {type(exc).__name__}: {exc}") from exc
    if count <= 1:
        return [(i, verdict(name, i)) for i in range(count)]
    pool = ThreadPoolExecutor(max_workers=count)
    try:
        futures = [pool.submit(verdict, name, i) for i in range(count)]
        return [(i, future.result()) for i, future in enumerate(futures)]
    except BaseException:  # Ctrl-C reaches this thread only: end the children the workers are waiting on
        _interrupt()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def resolve(name: str, index: int) -> int:
    """The raw device index behind ``name:index``, which counts the qualified devices only.

    Raises ``BackendUnavailableError`` naming every refused device, what failed and what to do, when fewer
    than ``index + 1`` devices qualified."""
    cls = registry.backends.get(name)
    if not getattr(cls, "needs_qualification", True):
        return index
    devices = offered(name)
    good = [raw for raw, v in devices if v.ok]
    if index < len(good):
        return good[index]
    refused = [(raw, v) for raw, v in devices if not v.ok]
    found = ", ".join(f"{name}:{i} = {dict(devices)[raw].device}" for i, raw in enumerate(good)) or "none"
    lines = [f"there is no {name} device {index} that qualified ({len(good)} of {len(devices)} did); found {found}"]
    for raw, v in refused:
        lines.append(f"  refused: {v.device}: {v.explain()}")
        hint = cls.driver_help(raw) if v.drivers_fault else ""
        if hint:
            lines.append(f"    {hint}")
    lines.append(f"Qualification runs in a child process and is cached in {cache_dir() / CACHE_FILE}; "
                 "`neuroflow doctor` shows every device, `neuroflow doctor --requalify` checks them again.")
    raise BackendUnavailableError("\n".join(lines))


def run_child(name: str, index: int, *, time_steps: int = 0, timeout: float | None = None) -> Verdict:
    """Run ``python -m neuroflow.probe`` on raw device ``index`` of backend ``name`` and judge how it ended:
    ``ok``, ``wrong`` (a result disagreed with numpy), ``failed`` (an exception), ``crashed`` (a signal) or
    ``hung`` (killed after ``timeout`` seconds). ``time_steps`` > 0 also times that many training steps."""
    cls = registry.backends.get(name)
    identity = cls.device_identity(index)
    if timeout is None:
        timeout = configured_timeout()
    unreachable = _not_importable(name, cls)
    if unreachable:
        return Verdict(name, index, identity, "failed", unreachable)
    # The child also ends itself a little after the timeout, and when this process dies.
    command = [sys.executable, "-m", "neuroflow.probe", name, str(index), "--time", str(time_steps),
               "--deadline", str(timeout + 30)]
    if registry.backends.registered_at_run_time(name):  # the child imports the class itself
        command += ["--class", f"{cls.__module__}:{cls.__qualname__}"]
    # This process's import path, made absolute; the child's working directory does not join it (a numpy.py
    # there would shadow numpy in the child alone and refuse the device for a reason of its own).
    path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "PYTHONSAFEPATH": "1"}
    env.pop("NEUROFLOW_BACKEND", None)  # the child opens the device it is given, and cpu; nothing it chooses
    start = time.monotonic()
    # Output goes to files, not pipes: a driver's debug output must not fill this process's memory.
    with tempfile.TemporaryFile("w+", errors="replace") as out, tempfile.TemporaryFile("w+", errors="replace") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, stdin=subprocess.DEVNULL, text=True, env=env,
                                 start_new_session=True)
        with _LIVE_LOCK:
            _LIVE.add(child)
            # a worker's child started after a Ctrl-C ended the others (its Popen returned too late for that)
            late = _STOPPING.is_set() and threading.current_thread() is not threading.main_thread()
            if late:
                _INTERRUPTED.add(child)
        if late:
            _kill(child)
        try:
            child.wait(timeout=timeout)
            hung = False
        except subprocess.TimeoutExpired:
            _kill(child)
            child.wait()
            hung = True
        except BaseException:  # Ctrl-C here must not wait for the child to finish
            _kill(child)
            raise
        finally:
            with _LIVE_LOCK:
                _LIVE.discard(child)
        with _LIVE_LOCK:
            interrupted = child in _INTERRUPTED
            _INTERRUPTED.discard(child)
        if interrupted:  # killed by _interrupt: not the device's verdict
            raise KeyboardInterrupt
        messages = list(_messages(out))
        tail = _last_words(_tail(err))
    seconds = time.monotonic() - start
    stage = next((m["stage"] for m in reversed(messages) if isinstance(m.get("stage"), str)), "")
    result = next((m for m in reversed(messages) if m.get("status") in ("ok", "wrong", "failed")), None)
    common = {"backend": name, "index": index, "identity": identity, "stage": _clip(stage), "seconds": round(seconds, 2)}
    if hung:
        return Verdict(**common, status="hung", detail=f"no answer after {timeout:.0f} s ({TIMEOUT_VAR})",
                       timeout=timeout)
    if child.returncode < 0:
        try:
            signame = signal.Signals(-child.returncode).name
        except ValueError:
            signame = f"signal {-child.returncode}"
        return Verdict(**common, status="crashed", detail=f"the child died of {signame}" + (f" ({tail})" if tail else ""))
    if result is None:
        return Verdict(**common, status="failed",
                       detail=f"the child exited with code {child.returncode} without a verdict" + (f" ({tail})" if tail else ""))
    step = result.get("step_seconds")
    return Verdict(**common, status=result["status"], detail=_clip(str(result.get("detail", ""))),
                   step_seconds=float(step) if isinstance(step, (int, float)) else None)


#: Children running now, so that a Ctrl-C in the main thread can end those that worker threads wait on.
_LIVE: set[subprocess.Popen[str]] = set()
_LIVE_LOCK = threading.Lock()
_INTERRUPTED: set[subprocess.Popen[str]] = set()
#: Set by a Ctrl-C while devices qualify side by side: a child whose Popen returns after it is ended at once, so
#: that no worker thread waits out the timeout on it (the interpreter's exit joins those threads).
_STOPPING = threading.Event()
#: Characters of a child's words kept in a verdict.
CLIP = 400


def _interrupt() -> None:
    """Kill every running child; their waiting threads then raise instead of recording a verdict."""
    with _LIVE_LOCK:
        _STOPPING.set()
        children = list(_LIVE)
        _INTERRUPTED.update(children)
    for child in children:
        _kill(child)


def _clip(text: str) -> str:
    return text if len(text) <= CLIP else text[:CLIP] + "…"


def _tail(file: Any, size: int = 16384) -> str:
    """The last ``size`` bytes or so of a text file."""
    file.seek(0, os.SEEK_END)
    end = file.tell()
    file.seek(max(0, end - size))
    return file.read()


def configured_timeout() -> float:
    """``NEUROFLOW_QUALIFY_TIMEOUT`` in seconds (a positive number), else ``DEFAULT_TIMEOUT``."""
    value = os.environ.get(TIMEOUT_VAR)
    if not value:
        return DEFAULT_TIMEOUT
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_TIMEOUT:
        raise ConfigError(f"{TIMEOUT_VAR}={value!r}; expected the seconds a qualification child may take, a "
                          f"positive number up to {MAX_TIMEOUT:.0f} (default {DEFAULT_TIMEOUT:.0f})")
    return seconds


def _last_words(err: str) -> str:
    """What the child's stderr says about its end: faulthandler's fatal error and the innermost Python frame
    of the thread that crashed (the child enables it), else its last lines."""
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
    if fatal is None:
        return _clip(" | ".join(lines[-3:]))
    frame = next((line for line in lines[fatal + 1:] if line.startswith("File ")), "")
    return _clip(lines[fatal] + (f", at {frame}" if frame else ""))


def _kill(child: subprocess.Popen[str]) -> None:
    """End the child and whatever it started (pocl's compiler, say): its whole process group where there is one."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if hasattr(os, "killpg"):
            os.killpg(child.pid, signal.SIGKILL)
        else:
            child.kill()


def _messages(out: Any) -> Iterator[dict[str, Any]]:
    """The protocol messages in the child's stdout file (other lines, however long, are skipped)."""
    out.seek(0)
    for line in out:
        if line.startswith(PREFIX) and len(line) < 65536:
            with contextlib.suppress(ValueError):
                message = json.loads(line[len(PREFIX):])
                if isinstance(message, dict):
                    yield message
