"""Qualification verdicts: what a child run found for one device, and the file that keeps them per machine.

A verdict is cached under a key naming the device, its driver, the hash of the backend package's source and
the versions of neuroflow-core and Python (``key``), in ``$NEUROFLOW_CACHE_DIR/qualification.json``. Entries
are validated when read: a hand-edited or foreign entry is no verdict, and the device is qualified again.
:mod:`neuroflow.backends.qualification` decides when a device needs a child run and runs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

CACHE_FILE = "qualification.json"
AUTO_CHOICE_FILE = "backend-choice.json"  # auto.CACHE_FILE: ``forget`` drops it with the verdicts

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
    return package_hash(cls.__module__.partition(".")[0])


@cache
def package_hash(package: str) -> str:
    """A hash of every Python file of the importable package ``package`` (cached per process)."""
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


def remember(cls: type, index: int, found: Verdict) -> None:
    """Cache a verdict found by a child run (``auto`` times and qualifies in one child). An exception in the
    child (``failed``) is not cached: it may come from this environment rather than the device (a module the
    child imported from elsewhere, say), and it costs seconds to find again."""
    if found.status != "failed":
        _store(key(cls, index), found)


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
        import fcntl  # lazy: POSIX only
    except ImportError:
        yield
        return
    with open(directory / f"{CACHE_FILE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
