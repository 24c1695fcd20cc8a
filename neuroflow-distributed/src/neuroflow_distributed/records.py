"""The run directory: small files through which the ranks of a run and its launcher tell each other what happened.

``neuroflow train --nproc N`` makes one (or takes ``NEUROFLOW_RUN_DIR``) and
every rank writes into it: ``rank-R.json`` when it starts (pid, host),
``rank-R.beat`` about once a second (what it is doing: computing, or waiting
in a collective since when) and ``rank-R.exit`` when it ends on its own
(how, and the lost ranks it found). A rank that timed out in a collective
reads the others' heartbeats to name the one that is lost; the launcher reads
everything to name the lost rank once ``mpiexec`` has returned. Every write
is atomic (temporary file + rename), so a reader never sees half a record.
Under a plain ``mpiexec`` without the variable there is no directory and the
ranks name what they can from inside MPI.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Where the ranks of a run write their records; set by the launcher for its workers.
RUN_DIR_VARIABLE = "NEUROFLOW_RUN_DIR"


@dataclass(frozen=True)
class RankRecord:
    """What one rank left in the run directory: its start, last heartbeat and exit (None where missing)."""

    rank: int
    start: dict[str, Any] | None
    beat: dict[str, Any] | None
    exit: dict[str, Any] | None

    @property
    def pid(self) -> int | None:
        return None if self.start is None else int(self.start["pid"])

    @property
    def where(self) -> str:
        """``pid P on HOST`` (or ``never started``)."""
        if self.start is None:
            return "never started"
        return f"pid {self.start['pid']} on {self.start['host']}"


class RunDirectory:
    """The records of one run under ``path``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def from_environment(cls) -> RunDirectory | None:
        """The directory ``NEUROFLOW_RUN_DIR`` names, or None when it is not set."""
        value = os.environ.get(RUN_DIR_VARIABLE, "").strip()
        return cls(value) if value else None

    def clear(self) -> None:
        """Remove the records of an earlier run in the directory (a reused ``NEUROFLOW_RUN_DIR``)."""
        for kind in ("json", "beat", "exit"):
            for old in self.path.glob(f"rank-*.{kind}"):
                old.unlink(missing_ok=True)

    def write_start(self, rank: int, size: int) -> None:
        self._write(rank, "json", {"rank": rank, "size": size, "pid": os.getpid(), "host": socket.gethostname(),
                                   "time": time.time()})

    def write_beat(self, rank: int, beat: dict[str, Any]) -> None:
        self._write(rank, "beat", {**beat, "time": time.time()})

    def write_exit(self, rank: int, code: int, reason: str, lost: list[int] | None = None) -> None:
        self._write(rank, "exit", {"code": code, "reason": reason, "lost": lost or [], "time": time.time()})

    def read(self, rank: int) -> RankRecord:
        return RankRecord(rank, self._read(rank, "json"), self._read(rank, "beat"), self._read(rank, "exit"))

    def read_all(self, size: int) -> list[RankRecord]:
        return [self.read(rank) for rank in range(size)]

    def _write(self, rank: int, kind: str, record: dict[str, Any]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        target = self.path / f"rank-{rank}.{kind}"
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(record), encoding="utf-8")
        os.replace(temporary, target)

    def _read(self, rank: int, kind: str) -> dict[str, Any] | None:
        try:
            record = json.loads((self.path / f"rank-{rank}.{kind}").read_text(encoding="utf-8"))
        except (OSError, ValueError):  # not written (yet), or a directory that is not a run's
            return None
        return record if isinstance(record, dict) else None
