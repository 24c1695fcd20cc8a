"""The lock that makes a checkpoint directory one run's: who holds it, taking it, and refusing a second run.

A run takes ``DIRECTORY/neuroflow.lock`` at its first checkpoint write or
at ``resume``: an advisory ``flock`` on the file, which holds the owner
(run id, pid, host, start time). Another process's run is refused while the
lock is held; the operating system drops the ``flock`` when its process
ends however it ends (kill -9 included), so a lock file left by a dead
process on this host is taken over with a warning. A lock file written on
another host is refused: this host cannot tell whether that run still
lives. Two Trainers of one process share the process's ``flock``; the
newer one takes the directory over with a warning, and the older one may
no longer write there. The lock is released (the file removed) when its
Trainer is garbage-collected or the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import itertools
import json
import os
import socket
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from neuroflow.checkpoint.errors import CheckpointError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: the lock file alone, with the owner's pid, decides
    fcntl = None  # type: ignore[assignment]

#: The lock file's name in a checkpoint directory.
LOCK_NAME = "neuroflow.lock"


class DirectoryLockedError(CheckpointError):
    """A checkpoint directory belongs to another run that may still be alive; carries the directory and owner."""

    def __init__(self, message: str, directory: Path, owner: Owner | None) -> None:
        super().__init__(message)
        self.directory, self.owner = directory, owner


@dataclass(frozen=True)
class Owner:
    """Who holds a checkpoint directory: the run's id, its process id and host, and when it took the lock."""

    run: str
    pid: int
    host: str
    started: float

    def describe(self) -> str:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"run {self.run} (pid {self.pid} on host {self.host}, since {when})"


def this_host() -> str:
    """The name this machine gives itself, as lock files and temporary-file names record it."""
    return socket.gethostname() or "localhost"


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host (a process of another user counts as alive)."""
    if pid <= 0:
        return False
    if os.name != "posix":  # pragma: no cover - os.kill(pid, 0) would end the process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _Held:
    """This process's hold on one directory: the locked file and the handle that owns it now."""

    def __init__(self, fd: int, owner: Owner, handle: int) -> None:
        self.fd, self.owner, self.handle = fd, owner, handle


# One flock per directory and process: every Trainer of the process goes through this table.
_HELD: dict[str, _Held] = {}
_GUARD = threading.Lock()
_HANDLES = itertools.count(1)
# Releases asked for by garbage collection, which can run inside a guarded block (of any thread, this one
# included): queued, and done where the guard is next let go.
_PENDING: list[tuple[str, int]] = []


@contextlib.contextmanager
def _guarded() -> Iterator[None]:
    with _GUARD:
        _drain()
        try:
            yield
        finally:
            _drain()


@atexit.register
def _drain_at_exit() -> None:
    with _guarded():
        pass


class DirectoryLock:
    """A run's hold on a checkpoint directory; :meth:`acquire` takes it, :meth:`check` before each write."""

    def __init__(self, directory: Path, key: str, owner: Owner, handle: int) -> None:
        self.directory, self.owner = directory, owner
        self._key = key
        self._handle = handle
        self._finalizer = weakref.finalize(self, _release, key, self._handle)

    @classmethod
    def acquire(cls, directory: str | os.PathLike[str], run: str) -> DirectoryLock:
        """Take ``directory`` for ``run``; raises :class:`DirectoryLockedError` while another live run holds it."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        key = os.path.realpath(folder)
        owner = Owner(run, os.getpid(), this_host(), time.time())
        with _guarded():
            contested = key in _HELD
        if contested:
            gc.collect()  # a Trainer of this process that nothing refers to any more lets go of it here
        with _guarded():
            held = _HELD.get(key)
            if held is None:
                fd = _lock_file(folder)
                try:
                    previous = _read_owner(fd)
                    _check_previous(folder, previous)
                except BaseException:
                    os.close(fd)
                    raise
                held = _HELD[key] = _Held(fd, owner, 0)
                why = "that process is no longer running"
            else:
                previous = held.owner
                why = "another Trainer of this process held it; that trainer can no longer write checkpoints there"
            _write_owner(held.fd, owner)
            held.owner, held.handle = owner, next(_HANDLES)
            lock = cls(folder, key, owner, held.handle)
        if previous is not None:
            warnings.warn(f"checkpoint directory {folder}: taking it over from {previous.describe()}: {why}",
                          RuntimeWarning, stacklevel=3)
        return lock

    def rename(self, run: str) -> None:
        """Record that this lock's run is now ``run`` (a resumed run carries on the id of the run it resumed)."""
        with _guarded():
            held = _HELD.get(self._key)
            if held is None or held.handle != self._handle:
                return
            self.owner = held.owner = Owner(run, self.owner.pid, self.owner.host, self.owner.started)
            _write_owner(held.fd, self.owner)

    def holds(self) -> bool:
        """Whether this lock still owns its directory (another Trainer of this process may have taken it over)."""
        with _guarded():
            held = _HELD.get(self._key)
            return held is not None and held.handle == self._handle

    def check(self) -> None:
        """Raise :class:`DirectoryLockedError` unless this lock still owns its directory."""
        if self.holds():
            return
        with _guarded():
            held = _HELD.get(self._key)
            owner = held.owner if held is not None else None
        taker = f"{owner.describe()}, another Trainer of this process" if owner is not None else "nobody"
        raise DirectoryLockedError(
            f"checkpoint directory {self.directory} was taken over by {taker}; this trainer no longer writes "
            "there. Give each Trainer its own checkpoint_dir, or go on training with the newer one",
            self.directory, owner)

    def release(self) -> None:
        """Give the directory up now (the lock file is removed); what garbage collection and exit do."""
        self._finalizer()


def _release(key: str, handle: int) -> None:
    _PENDING.append((key, handle))
    if _GUARD.acquire(blocking=False):
        try:
            _drain()
        finally:
            _GUARD.release()


def _drain() -> None:
    """Do the queued releases (the guard is held)."""
    while _PENDING:
        key, handle = _PENDING.pop()
        held = _HELD.get(key)
        if held is None or held.handle != handle:
            continue  # taken over by a newer Trainer of this process, which releases it in turn
        del _HELD[key]
        with contextlib.suppress(OSError):
            path = os.path.join(key, LOCK_NAME)
            if _same_file(held.fd, path):
                os.unlink(path)  # before the unlock, so a waiting process never locks a file about to vanish
        with contextlib.suppress(OSError):
            os.close(held.fd)


def _lock_file(folder: Path) -> int:
    """Open and lock ``folder/neuroflow.lock``; raise DirectoryLockedError when another process holds it."""
    path = folder / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is None:  # pragma: no cover - Windows
                raise OSError("no flock")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_owner(fd)
            os.close(fd)
            raise _locked(folder, owner) from None
        except OSError:  # no flock here (Windows, some network file systems): the owner's pid says if it lives
            owner = _read_owner(fd)
            if owner is not None and owner.host == this_host() and owner.pid != os.getpid() and pid_alive(owner.pid):
                os.close(fd)
                raise _locked(folder, owner) from None
            return fd
        if _same_file(fd, path):
            return fd
        os.close(fd)  # its owner removed the file as it let go: lock the file that is there now


def _same_file(fd: int, path: str | os.PathLike[str]) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _locked(folder: Path, owner: Owner | None) -> DirectoryLockedError:
    who = owner.describe() if owner is not None else "another process (its lock file is still being written)"
    return DirectoryLockedError(
        f"checkpoint directory {folder} belongs to {who}, which is still running; two runs in one directory "
        "would overwrite and prune each other's checkpoints. Give this run its own checkpoint_dir, or stop "
        "that run first (to continue it later, call trainer.resume() once it has ended)", folder, owner)


def _check_previous(folder: Path, previous: Owner | None) -> None:
    """Refuse a lock file from another host: whether its run lives cannot be told from here."""
    if previous is None or previous.host == this_host():
        return
    raise DirectoryLockedError(
        f"checkpoint directory {folder} belongs to {previous.describe()}, another host, and this host cannot tell "
        f"whether that run still lives. If it has ended, delete {folder / LOCK_NAME} and start again; "
        "otherwise give this run its own checkpoint_dir", folder, previous)


def _read_owner(fd: int) -> Owner | None:
    """The owner the lock file names, or None for an empty or unreadable one (a writer that died half way)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        raw = os.read(fd, 4096)
        fields: Any = json.loads(raw.decode("utf-8")) if raw else None
        if not isinstance(fields, dict):
            return None
        owner = Owner(str(fields["run"]), int(fields["pid"]), str(fields["host"]), float(fields["started"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return owner


def _write_owner(fd: int, owner: Owner) -> None:
    data = json.dumps(asdict(owner)).encode("utf-8")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, data)
    os.fsync(fd)
