"""Atomic file replacement: a reader sees the old file or the new one, never half of one."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable
from pathlib import Path

#: Suffix of the temporary files an interrupted write can leave next to its target.
TEMP_SUFFIX = ".tmp"


def temp_prefix(path: Path) -> str:
    """The name prefix of temporary files written for ``path`` (hidden, next to it)."""
    return f".{path.name}."


def write_atomically(path: str | os.PathLike[str], write: Callable[[str], None]) -> Path:
    """Call ``write(temp_path)``, flush it to disk and rename it over ``path``.

    The temporary file lives in the target's directory so the rename never
    crosses file systems; the directory is synced after the rename so the new
    name survives a power cut. A failed or interrupted ``write`` leaves
    ``path`` untouched.
    """
    target = Path(path)
    directory = target.parent
    temp = str(directory / f"{temp_prefix(target)}{secrets.token_hex(6)}{TEMP_SUFFIX}")
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
    return target


def _sync_directory(directory: Path) -> None:
    # Windows cannot open a directory; its rename is durable enough there.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
