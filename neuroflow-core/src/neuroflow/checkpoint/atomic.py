"""Atomic file replacement: a reader sees the old file or the new one, never half of one.

A write goes to a temporary file next to its target, named after the
process that writes it: ``.{target}.nf-{host}-{pid}-{random}.tmp`` (``host``
is a short hash of this host's name). A write killed half way (kill -9,
the OOM killer) leaves that file behind; the next write in the same
directory removes the temporary files of writers on this host whose
process has ended, never a live writer's. In a checkpoint directory the
run that holds the directory's lock removes every temporary file but a
live writer's (:func:`remove_stale_temps` with ``exclusive=True``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
from collections.abc import Callable
from pathlib import Path

from neuroflow.checkpoint.lock import pid_alive, this_host

#: Suffix of the temporary files an interrupted write can leave next to its target.
TEMP_SUFFIX = ".tmp"
# .{target}.nf-{host}-{pid}-{random}.tmp; older versions wrote .{target}.{random}.tmp (no writer in the name)
_WRITER = re.compile(r"\..+\.nf-(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-[0-9a-f]+\.tmp")


def temp_prefix(path: Path) -> str:
    """The name prefix of temporary files written for ``path`` (hidden, next to it)."""
    return f".{path.name}."


def host_tag() -> str:
    """This host's name as it appears in temporary-file names: 8 hex digits of its hash."""
    return hashlib.sha1(this_host().encode("utf-8", "replace")).hexdigest()[:8]


def temp_path(target: Path) -> Path:
    """A fresh temporary path for a write of ``target``, naming this process as its writer."""
    return target.parent / f"{temp_prefix(target)}nf-{host_tag()}-{os.getpid()}-{secrets.token_hex(6)}{TEMP_SUFFIX}"


def write_atomically(path: str | os.PathLike[str], write: Callable[[str], None]) -> Path:
    """Call ``write(temp_path)``, flush it to disk and rename it over ``path``.

    The temporary file lives in the target's directory so the rename never
    crosses file systems; the directory is synced after the rename so the new
    name survives a power cut. A failed or interrupted ``write`` leaves
    ``path`` untouched. The temporary files that killed writers left in the
    directory are removed afterwards (:func:`remove_stale_temps`).
    """
    target = Path(path)
    directory = target.parent
    temp = str(temp_path(target))
    # Created with mode 0o666 less the umask: the permissions a plain open() would give. Writers that
    # replace the file (the safetensors library makes it 0o600) get that mode back below.
    os.close(os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    mode = os.stat(temp).st_mode & 0o777
    try:
        write(temp)
        os.chmod(temp, mode)
        with open(temp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    _sync_directory(directory)
    remove_stale_temps(directory)
    return target


def temp_writer_gone(name: str, *, exclusive: bool = False) -> bool:
    """Whether the temporary file ``name`` is one whose writer has ended, so removing it loses nothing.

    A name that records its writer (host and pid) is gone when that host is
    this one and that process no longer exists. With ``exclusive`` (the
    caller holds the directory's lock, so no other run writes there), a
    temporary file from another host or of the older unnamed kind is gone
    too; a live writer's on this host never is.
    """
    if not (name.startswith(".") and name.endswith(TEMP_SUFFIX)):
        return False
    match = _WRITER.fullmatch(name)
    if match is None:
        return exclusive
    if match["host"] != host_tag():
        return exclusive
    pid = int(match["pid"])
    return pid != os.getpid() and not pid_alive(pid)


def remove_stale_temps(directory: str | os.PathLike[str], *, exclusive: bool = False,
                       prefix: str = ".") -> list[Path]:
    """Remove the temporary files in ``directory`` (names starting with ``prefix``) whose writers have ended
    (see :func:`temp_writer_gone`); the paths removed."""
    removed = []
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.startswith(prefix) and temp_writer_gone(entry.name, exclusive=exclusive):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def _sync_directory(directory: Path) -> None:
    # Windows cannot open a directory; its rename is durable enough there.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
