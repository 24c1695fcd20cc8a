"""Faults: a rank that fails, dies or hangs ends the whole run within a bounded time, and the lost rank is named.

Without this, MPI leaves the other ranks waiting in a collective for ever
when one rank raises, or stops answering. :func:`install` (called by the
``mpi`` communicator when there are several ranks) sets up one
:class:`FaultMonitor` per process:

- **an exception** nothing catches calls MPI's abort after the traceback is
  printed (``sys.excepthook``), and a failure ``neuroflow train`` reports calls
  it through the communicator's ``abort``: every rank ends at once, the
  launcher exits non-zero and names the rank and its error;
- **a rank that dies** (killed, out of memory) is seen by ``mpiexec``, which
  stops the others; the launcher names it from the run directory;
- **a rank that hangs** (stopped, stuck) leaves the others waiting: every wait
  for a collective (:func:`wait`) has a deadline, ``NEUROFLOW_COLLECTIVE_TIMEOUT``
  seconds (default 300), after which the waiting rank names the ranks that are
  not answering, from their heartbeats (a thread of each rank writes one about
  once a second into the run directory, :mod:`neuroflow_distributed.records`),
  and aborts the run;
- **a rank that leaves early** without an error anyone saw waits at exit, as
  long, for the others to finish (:meth:`FaultMonitor.at_exit`), then aborts.

Checkpoints are not touched: rank 0 writes them atomically, so the last one is
intact whatever happens, and ``--resume`` continues from it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
from types import TracebackType
from typing import Any

from neuroflow_distributed.communicator import CommunicatorError
from neuroflow_distributed.records import RUN_DIR_VARIABLE, RankRecord, RunDirectory

#: Seconds a rank waits for the others in one collective before it declares them lost and aborts.
TIMEOUT_VARIABLE = "NEUROFLOW_COLLECTIVE_TIMEOUT"
DEFAULT_TIMEOUT_S = 300.0
#: How often each rank's heartbeat is written, and how old one may be before its rank counts as not answering.
HEARTBEAT_S = 1.0
STALE_S = 3.0
#: The exit status of a run a rank aborted because another was lost (EX_SOFTWARE; the launcher forwards it).
EXIT_LOST = 70
#: Spin on ``Test()`` this long before sleeping between tests, so a short wait costs no latency.
_SPIN_S = 0.002
_NAP_S = 0.0002

#: what a rank that has finished waits in, in its heartbeat
_AT_EXIT = "the end of the run"

_monitor: FaultMonitor | None = None


class LostRankError(CommunicatorError):
    """Raised (on a single rank that cannot abort) when a collective's deadline passed."""


def collective_timeout() -> float:
    """``NEUROFLOW_COLLECTIVE_TIMEOUT`` in seconds (default 300); a bad value is named."""
    value = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not value:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise CommunicatorError(f"{TIMEOUT_VARIABLE} must be a positive number of seconds; got {value!r}")
    return seconds


class FaultMonitor:
    """The fault handling of one rank of ``communicator`` (its ``rank``, ``size``, ``abort(code, message)``).

    ``exit_barrier`` starts a barrier that completes once every rank has
    started it (an mpi4py ``Ibarrier`` on a communicator of its own), for
    :meth:`at_exit`; ``run_dir`` is where the records go (None: nowhere).
    """

    def __init__(self, communicator: Any, run_dir: RunDirectory | None, timeout_s: float,
                 exit_barrier: Any = None) -> None:
        self.communicator = communicator
        self.rank, self.size = int(communicator.rank), int(communicator.size)
        self.run_dir = run_dir
        self.timeout_s = timeout_s
        self.exit_barrier = exit_barrier
        #: (what, since) while this rank waits in a collective, else None; read by the heartbeat thread
        self.waiting: tuple[str, float] | None = None
        self.collectives = 0
        self.ended = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous_hook = sys.excepthook

    # ------------------------------------------------------------------ lifetime
    def start(self) -> FaultMonitor:
        if self.run_dir is not None:
            self.run_dir.write_start(self.rank, self.size)
            self._beat()
            self._thread = threading.Thread(target=self._heartbeats, name="neuroflow-heartbeat", daemon=True)
            self._thread.start()
        sys.excepthook = self._excepthook
        atexit.register(self.at_exit)  # after mpi4py's own handler, so it runs before MPI is finalised
        return self

    def _heartbeats(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._beat()
            except OSError:  # a full disk must not kill training; the record just ages
                pass

    def _beat(self) -> None:
        if self.run_dir is None:
            return
        waiting = self.waiting
        state = {"waiting": None if waiting is None else waiting[0],
                 "since": None if waiting is None else waiting[1] + _wall_offset(),
                 "collectives": self.collectives}
        self.run_dir.write_beat(self.rank, state)

    def at_exit(self) -> None:
        """At interpreter exit: wait (as long as a collective may) for every rank to get here too, else abort."""
        if self.ended or self.exit_barrier is None:
            self.ended = True
            self._stop.set()
            return
        self.ended = True
        try:  # the heartbeats go on meanwhile: a rank that waits for the others here is alive, and says where it is
            self.wait(self.exit_barrier(), f"{_AT_EXIT} (waiting for every rank to finish)")
        except LostRankError:
            return
        finally:
            self._stop.set()
        if self.run_dir is not None:
            self.run_dir.write_exit(self.rank, 0, "finished")

    # ------------------------------------------------------------------ collectives
    def wait(self, request: Any, what: str) -> None:
        """Wait for the mpi4py ``request`` of collective ``what``; past the deadline, name the lost ranks and abort."""
        if request.Test():
            self.collectives += 1
            return
        start = time.monotonic()
        deadline, spin_until = start + self.timeout_s, start + _SPIN_S
        look = start + STALE_S  # when to look whether every other rank has finished (never joining this one)
        self.waiting = (what, start)
        try:
            while not request.Test():
                now = time.monotonic()
                if now > deadline:
                    self.lost(what, now - start)
                if now > look and not what.startswith(_AT_EXIT):
                    look = now + HEARTBEAT_S
                    if self.others_finished():
                        self.end(EXIT_LOST, f"rank {self.rank} is in {what}, which no other rank will join: every "
                                            f"other rank has finished and waits at the end of the run (a collective "
                                            f"only this rank called, such as Trainer.evaluate on one rank alone)")
                        raise LostRankError(what)  # only reached where abort returns (a test's fake communicator)
                if now > spin_until:
                    time.sleep(_NAP_S)
        finally:
            self.waiting = None
        self.collectives += 1

    def lost(self, what: str, waited: float) -> None:
        """The other ranks did not join collective ``what`` in ``waited`` seconds: name them and end the run."""
        lost, details = self.diagnose()
        message = (f"rank {self.rank} waited {waited:.0f} s ({TIMEOUT_VARIABLE}={self.timeout_s:g}) in {what}: "
                   f"{details}")
        self.end(EXIT_LOST, message, lost)
        raise LostRankError(message)  # only reached where abort returns (a test's fake communicator)

    def others_finished(self) -> bool:
        """Whether every other rank's heartbeat says it waits at the end of the run (from the run directory)."""
        if self.run_dir is None or self.size == 1:
            return False
        others = [r for r in self.run_dir.read_all(self.size) if r.rank != self.rank]
        return all(r.beat is not None and str(r.beat.get("waiting") or "").startswith(_AT_EXIT) for r in others)

    def diagnose(self) -> tuple[list[int], str]:
        """The ranks that are not answering, and a sentence saying so (from the run directory's heartbeats)."""
        if self.run_dir is None:
            return [], (f"another of the {self.size} ranks is lost or hung (set {RUN_DIR_VARIABLE} to a shared "
                        f"directory, as neuroflow train --nproc does, to have it named)")
        records = [r for r in self.run_dir.read_all(self.size) if r.rank != self.rank]
        now = time.time()
        verdicts = {r.rank: verdict for r in records if (verdict := _verdict(r, now)) is not None}
        if not verdicts:
            elsewhere = "; ".join(f"rank {r.rank} in {r.beat['waiting']}" for r in records
                                  if r.beat is not None and r.beat.get("waiting"))
            return [], ("every other rank is waiting in a collective too: the ranks called different collectives"
                        + (f" ({elsewhere})" if elsewhere else ""))
        lost = sorted(verdicts)
        return lost, "; ".join(f"rank {rank} {text}" for rank, text in verdicts.items())

    # ------------------------------------------------------------------ failures
    def end(self, code: int, message: str, lost: list[int] | None = None) -> None:
        """Record how this rank ends the run and abort every rank (prints ``message``)."""
        self.ended = True
        self._stop.set()
        if self.run_dir is not None:
            try:
                self.run_dir.write_exit(self.rank, code, message, lost)
            except OSError:
                pass
        self.communicator.abort(code, message)

    def record_abort(self, code: int, message: str) -> None:
        """Note, before the communicator aborts, why (for the launcher), unless :meth:`end` has already."""
        if self.ended:
            return
        self.ended = True
        self._stop.set()
        if self.run_dir is not None:
            try:
                self.run_dir.write_exit(self.rank, code, message)
            except OSError:
                pass

    def _excepthook(self, kind: type[BaseException], error: BaseException, tb: TracebackType | None) -> None:
        self._previous_hook(kind, error, tb)
        sys.stderr.flush()
        text = "".join(traceback.format_exception_only(kind, error)).strip()
        self.end(1, f"unhandled {text}")


def _verdict(record: RankRecord, now: float) -> str | None:
    """Why ``record``'s rank is lost, or None when it is waiting in a collective as it should."""
    if record.start is None:
        return (f"left no record in the run directory (it never started, or runs on another host: give the hosts a "
                f"shared {RUN_DIR_VARIABLE})")
    if record.exit is not None:
        return f"has ended ({record.exit.get('reason', 'no reason given')})"
    beat = record.beat
    if beat is None or now - float(beat["time"]) > STALE_S:
        age = "never" if beat is None else f"{now - float(beat['time']):.0f} s ago"
        return f"({record.where}) is not answering: its last heartbeat was {age} (stopped, or dead)"
    if beat.get("waiting") is None:
        return (f"({record.where}) is alive but not in a collective: it is stuck in its own work "
                f"after {beat.get('collectives', 0)} collectives")
    return None


def _wall_offset() -> float:
    """Seconds to add to ``time.monotonic()`` for wall-clock time (heartbeats are compared across processes)."""
    return time.time() - time.monotonic()


def install(communicator: Any, exit_barrier: Any = None) -> FaultMonitor:
    """The process's :class:`FaultMonitor` for ``communicator``, started on first call (one per process)."""
    global _monitor
    if _monitor is None:
        _monitor = FaultMonitor(communicator, RunDirectory.from_environment(), collective_timeout(),
                                exit_barrier).start()
    return _monitor


def monitor() -> FaultMonitor | None:
    """The installed monitor, or None (one process, or none installed)."""
    return _monitor


def wait(request: Any, what: str) -> None:
    """Wait for mpi4py ``request`` (collective ``what``): with the monitor's deadline when one is installed."""
    if _monitor is None:
        request.Wait()
    else:
        _monitor.wait(request, what)
