"""Qualification: a device is used in this process only after it has trained correctly in a child process.

A driver can crash (pocl 3.0's LLVM 14 segfaulted compiling our GEMM for AMD Zen 4), hang or compute wrong
results. None of that may take the user's program with it, so the first time a device is used on a machine
— per backend, device, driver version and the hash of the backend package's source (its kernels are made
from that source) — NeuroFlow runs ``python -m neuroflow.probe`` on it in a child process, bounded by a
timeout: the backend's own kernel set (``Backend.self_test``), then a few training steps checked against
cpu. The verdict is cached in ``$NEUROFLOW_CACHE_DIR/qualification.json``; a refused device is not offered
(``opencl:N`` numbers the qualified devices only) and asking for it raises an error that says what failed.

A backend that runs nothing but numpy (``Backend.needs_qualification = False``: cpu) is not qualified.
"""

from __future__ import annotations

import contextlib
import hashlib
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
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

from neuroflow import registry
from neuroflow.errors import BackendUnavailableError, ConfigError

CACHE_FILE = "qualification.json"
AUTO_CHOICE_FILE = "backend-choice.json"  # auto.CACHE_FILE: ``forget`` drops it with the verdicts
#: Seconds the child may take (cold driver caches compile every kernel); past it the device is "hung".
TIMEOUT_VAR = "NEUROFLOW_QUALIFY_TIMEOUT"
DEFAULT_TIMEOUT = 600.0
MAX_TIMEOUT = 86400.0
#: The child's protocol lines on stdout start with this (anything else a plugin prints is ignored).
PREFIX = "NEUROFLOW-PROBE "
#: The statuses of a refused device.
REFUSED = ("crashed", "hung", "wrong", "failed")


def cache_dir() -> Path:
    """``$NEUROFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/neuroflow``, else ``~/.cache/neuroflow``."""
    root = os.environ.get("NEUROFLOW_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "neuroflow")
    return Path(root)


@dataclass(frozen=True)
class Verdict:
    """What the child found for one device: ``status`` is ``ok`` or one of ``REFUSED``."""

    backend: str
    index: int
    identity: dict[str, str]
    status: str
    detail: str = ""
    stage: str = ""
    seconds: float = 0.0
    step_seconds: float | None = None
    timeout: float = 0.0  # the bound a "hung" verdict was found under: a longer one tries again
    checked_at: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S"))

    @classmethod
    def from_record(cls, record: Any) -> Verdict | None:
        """The verdict a cache entry holds, or None for anything that is not one (a hand-edited or foreign file
        is read as no verdict: the device is qualified again)."""
        if not isinstance(record, dict):
            return None
        try:
            found = cls(**record)
        except TypeError:
            return None
        number = (int, float)
        valid = (isinstance(found.backend, str) and isinstance(found.index, int) and isinstance(found.identity, dict)
                 and all(isinstance(k, str) and isinstance(v, str) for k, v in found.identity.items())
                 and found.status in ("ok", *REFUSED) and isinstance(found.detail, str)
                 and isinstance(found.stage, str) and isinstance(found.seconds, number)
                 and isinstance(found.timeout, number) and isinstance(found.checked_at, str)
                 and (found.step_seconds is None or isinstance(found.step_seconds, number)))
        return found if valid else None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def drivers_fault(self) -> bool:
        """Whether the driver itself failed (a crash or a wrong result), so another driver is the advice."""
        return self.status in ("crashed", "wrong")

    @property
    def device(self) -> str:
        """The device and its driver, as its backend named them."""
        known = self.identity
        device = known.get("device", str(self.index))
        driver = " ".join(known.get("platform version", known.get("platform", "")).split())
        return f"{device} ({driver})" if driver else f"{self.backend} device {device}"

    def explain(self) -> str:
        """One line for an error message or ``neuroflow doctor``."""
        if self.ok:
            return f"qualified ({self.seconds:.1f} s, checked {self.checked_at})"
        where = f" in stage {self.stage!r}" if self.stage else ""
        return f"{self.status}{where}: {self.detail}"


def source_hash(cls: type) -> str:
    """A hash of every Python file of the top-level package that defines ``cls``: its kernels' source."""
    return _package_hash(cls.__module__.partition(".")[0])


@cache
def _package_hash(package: str) -> str:
    module = sys.modules.get(package) or __import__(package)
    digest = hashlib.sha256()
    roots = [Path(p) for p in getattr(module, "__path__", [])] or [Path(getattr(module, "__file__", None) or "")]
    for root in roots:
        files = sorted(root.rglob("*.py")) if root.is_dir() else [root]
        for path in files:
            with contextlib.suppress(OSError):
                digest.update(str(path.relative_to(root.parent)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def key(cls: type, index: int) -> str:
    """The cache key of device ``index`` of backend class ``cls``."""
    try:
        core = metadata.version("neuroflow-core")
    except metadata.PackageNotFoundError:
        core = "?"
    identity = cls.device_identity(index)  # type: ignore[attr-defined]
    return json.dumps({**identity, "sources": source_hash(cls), "neuroflow-core": core,
                       "python": sys.version.split()[0]}, sort_keys=True)


def verdict(name: str, index: int, *, refresh: bool = False) -> Verdict:
    """The qualification of raw device ``index`` of backend ``name``: cached, else found by a child run."""
    cls = registry.backends.get(name)
    unreachable = _not_importable(name, cls)
    if unreachable:
        return Verdict(name, index, {"backend": name, "device": str(index)}, "failed", unreachable)
    k = key(cls, index)
    timeout = configured_timeout()
    if not refresh:
        cached = Verdict.from_record(_read().get(k))
        if cached is not None and not (cached.status == "hung" and timeout > cached.timeout):
            return cached
    found = run_child(name, index, timeout=timeout)
    remember(cls, index, found)
    return found


def remember(cls: type, index: int, found: Verdict) -> None:
    """Cache a verdict found by a child run (``auto`` times and qualifies in one child). An exception in the
    child (``failed``) is not cached: it may come from this environment rather than the device (a module the
    child imported from elsewhere, say), and it costs seconds to find again."""
    if found.status != "failed":
        _store(key(cls, index), found)


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
#: Characters of a child's words kept in a verdict.
CLIP = 400


def _interrupt() -> None:
    """Kill every running child; their waiting threads then raise instead of recording a verdict."""
    with _LIVE_LOCK:
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


def cached() -> dict[str, Verdict]:
    """Every cached verdict, by key (for ``neuroflow doctor``)."""
    found = {}
    for k, v in _read().items():
        verdict_ = Verdict.from_record(v)
        if verdict_ is not None:
            found[k] = verdict_
    return found


def forget() -> None:
    """Drop every cached verdict: the next use of each device qualifies it again."""
    with contextlib.suppress(OSError), _locked():
        for stale in (CACHE_FILE, AUTO_CHOICE_FILE):  # auto's choice was made from these verdicts
            with contextlib.suppress(FileNotFoundError):
                (cache_dir() / stale).unlink()


def _read() -> dict[str, Any]:
    try:
        data = json.loads((cache_dir() / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _store(k: str, found: Verdict) -> None:
    """Add one verdict to the cache file: read, merge and replace under a lock, so that two processes
    qualifying at once keep both verdicts (a read-only cache only costs a new child run next time)."""
    path = cache_dir() / CACHE_FILE
    with contextlib.suppress(OSError), _locked():
        data = _read()
        data[k] = asdict(found)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            tmp.write_text(json.dumps(data, indent=2))
            tmp.replace(path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """An exclusive lock on the cache file's lock file (where the platform has ``flock``; elsewhere the
    atomic replace alone, at worst losing one of two verdicts written at once: a child run next time)."""
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(directory / f"{CACHE_FILE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
