"""A training run as its checkpoints know it: an id, the checkpoint directories it holds, its loss watch."""

from __future__ import annotations

import os
import secrets
import warnings
from pathlib import Path

from neuroflow.checkpoint.atomic import remove_stale_temps
from neuroflow.checkpoint.directory import others_note
from neuroflow.checkpoint.divergence import LossWatch
from neuroflow.checkpoint.lock import DirectoryLock


class TrainingRun:
    """One run of training: ``id`` names its checkpoints; it holds the directories it writes or resumed from.

    A fresh Trainer starts a new run. Resuming a run's newest checkpoint
    continues that run (:meth:`adopt` takes its id, so the run's older
    checkpoints are pruned as its own); resuming an older one starts a new
    run from it. ``losses`` judges each checkpoint good or bad
    (:mod:`neuroflow.checkpoint.divergence`). The directories are released
    when the run is garbage-collected (with its Trainer) or the process exits.
    """

    def __init__(self) -> None:
        self.id = secrets.token_hex(6)
        self.losses = LossWatch()
        self._locks: dict[str, DirectoryLock] = {}

    def claim(self, directory: str | os.PathLike[str], *, resuming: bool = False) -> bool:
        """Hold ``directory`` for this run (True when taken now, False when already held).

        Raises :class:`~neuroflow.checkpoint.lock.DirectoryLockedError` when
        another live run holds it, or when another Trainer of this process
        took it over from this one. Taking it removes the temporary files
        that dead writers left there; to write (not ``resuming``), it warns
        when the directory holds other runs' checkpoints.
        """
        key = os.path.realpath(directory)
        lock = self._locks.get(key)
        if lock is not None:
            lock.check()
            return False
        self._locks[key] = DirectoryLock.acquire(directory, self.id)
        remove_stale_temps(Path(directory), exclusive=True, prefix=".ckpt-")
        note = None if resuming else others_note(Path(directory), self.id)
        if note is not None:
            warnings.warn(note, RuntimeWarning, stacklevel=3)
        return True

    def adopt(self, run: str) -> None:
        """Carry on run ``run`` (a resumed checkpoint's): its checkpoints become this run's."""
        self.id = run
        for lock in self._locks.values():
            if lock.holds():
                lock.rename(run)
