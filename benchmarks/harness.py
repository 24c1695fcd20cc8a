"""Benchmark harness: thread-count pinning, fresh child processes, interleaved timing, medians, RSS.

Shared by the scripts in ``benchmarks/``. It imports neither numpy nor torch, so a child process
can be given its thread count before either library loads.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

# Every thread-count variable a BLAS or OpenMP runtime on this machine might read. They only take
# effect when set before the library is loaded, hence a fresh process per thread count.
THREAD_ENV_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def thread_env(threads: int) -> dict[str, str]:
    """A copy of this process's environment with every BLAS/OpenMP thread count set to ``threads``."""
    env = dict(os.environ)
    env.update({name: str(threads) for name in THREAD_ENV_VARS})
    return env


def openblas_threads() -> int | None:
    """The thread count the OpenBLAS loaded into this process will use, or None when none is loaded.

    Reads it from the library itself (numpy's wheels bundle a symbol-prefixed OpenBLAS), to prove the
    environment variables took effect rather than trusting them.
    """
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and line.rstrip().endswith(".so")}
    for path in sorted(paths):
        library = ctypes.CDLL(path)
        for symbol in ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"):
            getter = getattr(library, symbol, None)
            if getter is not None:
                getter.restype = ctypes.c_int
                return int(getter())
    return None


def run_child(argv: Sequence[str], env: dict[str, str] | None = None, timeout: float = 900) -> dict[str, Any]:
    """Run ``python argv...`` in a fresh process and return the JSON object it prints last on stdout."""
    done = subprocess.run(
        [sys.executable, *argv], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"benchmark child {' '.join(argv)} failed with exit code {done.returncode}:\n{done.stderr}")
    lines = done.stdout.strip().splitlines()
    if not lines:
        raise RuntimeError(f"benchmark child {' '.join(argv)} printed nothing; stderr:\n{done.stderr}")
    return json.loads(lines[-1])


# ---------------------------------------------------------------------------------------------- timing
class Worker:
    """A contender in its own fresh process, timing blocks of steps on request.

    The child prints one JSON line when set up (read into :attr:`info`), then serves
    :func:`serve_blocks`. Separate processes keep each contender's thread pools apart: numpy's
    OpenBLAS workers and torch's OpenMP workers spin-wait after each call, and in one process on two
    cores they starve each other (measured here: 40-100× slower steps at 2 threads).
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.process = subprocess.Popen(
            [sys.executable, *argv], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.info: dict[str, Any] = json.loads(self._reply())

    def run(self, steps: int) -> float:
        """Seconds per step over a block of ``steps`` steps, timed inside the child."""
        if self.process.stdin is None:  # pragma: no cover - always a pipe
            raise RuntimeError("worker has no stdin")
        self.process.stdin.write(f"{steps}\n")
        self.process.stdin.flush()
        return float(self._reply())

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        self.process.wait(timeout=60)

    def _reply(self) -> str:
        line = self.process.stdout.readline() if self.process.stdout is not None else ""
        if not line:
            code = self.process.wait(timeout=60)
            raise RuntimeError(f"benchmark worker {' '.join(self.argv)} exited with code {code} (its stderr is above)")
        return line


def serve_blocks(step: Callable[[], object]) -> None:
    """The child side of :class:`Worker`: for each step count read from stdin, run and time that many steps."""
    for line in sys.stdin:
        if not line.strip():
            break
        steps = int(line)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        print(repr((time.perf_counter() - start) / steps), flush=True)


def start_worker(step: Callable[[], float], warmup: int, info: dict[str, Any]) -> None:
    """A worker's common start: RSS around the first step and the later ones (``peak_rise_kb``: the highest RSS
    over setup through both), the first three losses (the
    parent checks that contenders agree), ``warmup`` untimed steps; then report ``info`` and serve blocks."""
    gc.collect()
    setup = rss_kb()
    resettable = reset_peak_rss()
    losses = [step()]
    first_peak = peak_rss_kb()
    after_first = rss_kb()
    reset_peak_rss()
    losses += [step() for _ in range(2)]
    for _ in range(warmup):
        step()
    info.update({
        "first_losses": losses, "peak_resettable": resettable,
        "rss_setup_kb": setup, "rss_after_first_step_kb": after_first,
        "first_step_rise_kb": first_peak - setup if resettable else None,
        "later_step_rise_kb": max(peak_rss_kb() - after_first, 0),
        # the step's true high-water mark over setup: the first step's, or a later one's if that is higher
        "peak_rise_kb": max(first_peak, peak_rss_kb()) - setup if resettable else None,
        "openblas_threads": openblas_threads(),  # after the first GEMM, so the pool is live
    })
    gc.collect()
    print(json.dumps(info), flush=True)
    serve_blocks(step)


def interleave(blocks: dict[str, Callable[[], float]], rounds: int, pause: float = 0.0) -> dict[str, list[float]]:
    """One sample per round from each block function (seconds per step of one timed block).

    Each round runs every contender's block in turn, so all of them see the same machine load; the
    starting contender rotates so none always follows the same other one. ``pause`` seconds between
    blocks let the previous contender's spinning threads go to sleep.
    """
    names = list(blocks)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            time.sleep(pause)
            samples[name].append(blocks[name]())
    return samples


def summarise(samples: Sequence[float]) -> dict[str, float]:
    """Median, quartiles and spread (interquartile range over the median) of timing samples."""
    ordered = sorted(samples)
    median = statistics.median(ordered)
    if len(ordered) >= 4:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1, q3 = ordered[0], ordered[-1]
    return {"median": median, "q1": q1, "q3": q3, "spread": (q3 - q1) / median if median else 0.0}


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """Median over rounds of the per-round ratio: blocks of one round ran seconds apart, so load drift cancels."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


# ---------------------------------------------------------------------------------------------- memory
def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field} line")


def rss_kb() -> int:
    """Resident set size of this process now, in KiB."""
    return _status_kb("VmRSS")


def reset_peak_rss() -> bool:
    """Restart the peak-RSS high-water mark at the current RSS (Linux ≥ 4.0); False when not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return True


def peak_rss_kb() -> int:
    """Peak RSS since the last :func:`reset_peak_rss` (or since start), in KiB."""
    try:
        return _status_kb("VmHWM")
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# ---------------------------------------------------------------------------------------------- report
def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table; numbers right-aligned."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    numeric = [bool(cells) and all(_is_number(r[i]) for r in cells) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        padded = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "| " + " | ".join(padded) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if num else ("-" * (w + 2)) for w, num in zip(widths, numeric, strict=True)) + "|"
    return "\n".join([line(headers), rule, *(line(r) for r in cells)])


def _is_number(text: str) -> bool:
    try:
        float(text.rstrip("×%"))
    except ValueError:
        return text in ("—", "-")
    return True


def source_version(path: str) -> str:
    """``git describe --always --dirty`` of the checkout holding ``path``: which code was measured."""
    done = subprocess.run(
        ["git", "-C", path, "describe", "--always", "--dirty"], capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


def machine_load() -> str:
    """The 1/5/15-minute load averages, to show how busy the machine was while measuring."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def fill_defaults(args: Any, defaults: dict[str, tuple[Any, Any]]) -> None:
    """Set each option left unset to its (quick, full) default, by whether ``--quick`` was given."""
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)


def emit(report: dict[str, Any], print_report: Callable[[dict[str, Any]], None], json_path: str | None) -> int:
    """Print a benchmark's report and, with ``--json FILE``, write it there; the exit code of a finished run."""
    print_report(report)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    return 0
