"""Benchmark harness: thread-count pinning, fresh child processes, interleaved timing, medians, RSS.

Shared by the scripts in ``benchmarks/``. It imports neither numpy nor torch, so a child process
can be given its thread count before either library loads.

Two ways to time contenders against each other:

- **One process** (:func:`one_process_run`, :func:`run_interleaved`): every contender of a ratio in one
  process, started per thread count with the thread variables set, their blocks of steps interleaved in
  that process. This is what a user runs (one Python process with numpy and torch loaded), and it is the
  main view of ``cnn.py``, ``resnet18.py`` and ``mlp.py``.
- **One process per contender** (:class:`Worker`): each contender alone in its own process, timed on
  request, so each process's RSS is that contender's alone. Their second view (``--separate-processes``).
"""

from __future__ import annotations

import ctypes
import functools
import gc
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

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


#: Untimed steps at the start of every timed block of a training benchmark, after the idle pause before it.
#: A training run steps back to back; after 0.2 s idle this machine runs memory-bound work at about half speed
#: for a few ms (a 16 MB ``np.copyto`` on one thread: 2.5, 2.3, then 1.1 ms), so the first step pays for it, and
#: the more memory-bound step pays more. Measured on the 2-core Xeon (the small CNN of
#: ``cnn.py``, 2 threads, median over 15 blocks of each step's time by its place in the block): NeuroFlow 46.4,
#: 31.1, 29.8, then 29.4-30.0 ms; PyTorch 24.0, 20.9, then 20.0-21.4. After 0.002 s idle NeuroFlow's first
#: step took 29.8 ms; at one thread everywhere, after 0.2 s, 44.2 against 40.2 later. Benchmarks of latency
#: after idle (``detector.py``'s frames) time that case on purpose and do not use this.
SETTLE_STEPS = 1


# ---------------------------------------------------------------------------------------------- timing
class Worker:
    """A contender in its own fresh process, timing blocks of steps on request.

    The child prints one JSON line when set up (read into :attr:`info`), then serves
    :func:`serve_blocks`. Separate processes keep each contender's thread pools and memory apart, so
    each process's RSS is one contender's: the second view of the speed benchmarks, and their RSS.
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.process = subprocess.Popen(
            [sys.executable, *argv], env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.info: dict[str, Any] = json.loads(self._reply())

    def run(self, steps: int, settle: int = SETTLE_STEPS) -> float:
        """Seconds per step over a block of ``steps`` steps, timed inside the child after ``settle`` untimed ones
        (:data:`SETTLE_STEPS`)."""
        if self.process.stdin is None:  # pragma: no cover - always a pipe
            raise RuntimeError("worker has no stdin")
        self.process.stdin.write(f"{steps} {settle}\n")
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
    """The child side of :class:`Worker`: for each line "STEPS SETTLE" read from stdin, SETTLE untimed steps, then
    STEPS timed ones (:func:`time_block`)."""
    for line in sys.stdin:
        if not line.strip():
            break
        steps, settle = (int(word) for word in line.split())
        print(repr(time_block(step, steps, settle)), flush=True)


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


Sample = TypeVar("Sample")


def interleave(blocks: Mapping[str, Callable[[], Sample]], rounds: int,
               pause: float = 0.0) -> dict[str, list[Sample]]:
    """One sample per round from each block function (seconds per step of one timed block, or what it returns).

    Each round runs every contender's block in turn, so all of them see the same machine load; the
    starting contender rotates so none always follows the same other one. ``pause`` seconds between
    blocks let the previous contender's spinning threads go to sleep.
    """
    names = list(blocks)
    samples: dict[str, list[Sample]] = {name: [] for name in names}
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


# ---------------------------------------------------------------------------------------------- one process
_HELD_LIMITS: list[Any] = []  # threadpoolctl limits, kept for the life of the process
# After a call, OpenBLAS's threads spin for about 2**28 cycles (measured: ~0.1 s of CPU) before they sleep, and
# OpenMP's spin briefly too; a contender timed while the previous one's threads still spin loses a core to them.
SPIN_PAUSE_S = 0.2


def limit_threads(threads: int) -> dict[str, Any]:
    """Hold every thread pool of this process at ``threads`` and return what each library says it uses.

    How, in order: the process was started with every variable of :data:`THREAD_ENV_VARS` set to
    ``threads`` (:func:`thread_env`; OpenBLAS, MKL and OpenMP read them when they load, so this raises if
    they are not); ``torch.set_num_threads(threads)`` when torch is loaded; ``threadpoolctl``'s
    ``threadpool_limits(threads)`` on top when it is installed (every BLAS and OpenMP runtime it finds).
    Call it after the contenders are built (torch imported), before the first step.
    """
    wrong = {name: os.environ.get(name) for name in THREAD_ENV_VARS if os.environ.get(name) != str(threads)}
    if wrong:
        raise RuntimeError(f"expected every thread variable at {threads} from the start of the process, got {wrong}; "
                           "start it with harness.thread_env(threads)")
    how = [f"{'/'.join(THREAD_ENV_VARS)}={threads} set before numpy and torch load"]
    report: dict[str, Any] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
        how.append(f"torch.set_num_threads({threads})")
        report["torch"] = torch.get_num_threads()
    if importlib.util.find_spec("threadpoolctl") is not None:
        import threadpoolctl  # lazy: optional, and only once the libraries it limits are loaded

        _HELD_LIMITS.append(threadpoolctl.threadpool_limits(limits=threads))
        how.append(f"threadpoolctl.threadpool_limits({threads})")
        report["threadpoolctl"] = [{key: pool.get(key) for key in ("internal_api", "prefix", "num_threads")}
                                   for pool in threadpoolctl.threadpool_info()]
    else:
        how.append("threadpoolctl not installed")
    report["openblas"] = openblas_threads()
    from neuroflow.backends.cpu import CpuBackend  # lazy: once numpy loaded OpenBLAS, which chose its kernels then

    described = CpuBackend().describe()
    report["blas_core"] = described["blas_core"]  # AVX2 or AVX-512 GEMMs: 1.5-1.9x apart on Zen 5
    report["blas_idle_spin"] = described["blas_idle_spin"]  # what OpenBLAS read (neuroflow.blas_idle)
    report["how"] = "; ".join(how)
    return report


def describe_threads(report: dict[str, Any]) -> str:
    """One line: how the threads were set and what each library reports (from :func:`limit_threads`)."""
    says = [f"OpenBLAS (numpy) {report['openblas']}, kernels {report.get('blas_core', 'unknown')}, idle spin "
            f"{report.get('blas_idle_spin', 'unknown')}"]
    if "torch" in report:
        says.append(f"torch {report['torch']}")
    says += [f"{p['prefix']} ({p['internal_api']}) {p['num_threads']}" for p in report.get("threadpoolctl", [])]
    return f"{report['how']}; the libraries report: " + ", ".join(says)


def time_block(step: Callable[[], object], steps: int, settle: int) -> float:
    """Seconds per step over ``steps`` consecutive calls of ``step``, after ``settle`` untimed calls."""
    for _ in range(settle):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps


def warm_up(steppers: dict[str, Callable[[], float]], warmup: int,
            check: Callable[[dict[str, list[float]]], None]) -> dict[str, list[float]]:
    """Three steps of every contender, whose values ``check`` must accept (it raises when the contenders do not
    compute the same step), then ``warmup`` untimed steps each; returns the three values of each."""
    first = {name: [float(step()) for _ in range(3)] for name, step in steppers.items()}
    check(first)
    for step in steppers.values():
        for _ in range(warmup):
            step()
    gc.collect()
    return first


def run_interleaved(steppers: dict[str, Callable[[], float]], repeats: int, steps: int, warmup: int, pause: float,
                    check: Callable[[dict[str, list[float]]], None], settle: int = SETTLE_STEPS) -> dict[str, Any]:
    """Time every contender in this process: three steps each, whose losses ``check`` must accept (it raises when
    the contenders do not compute the same step), ``warmup`` untimed steps each, then ``repeats`` repetitions of
    one block of ``steps`` steps per contender in turn (:func:`interleave`), each after ``settle`` untimed steps.

    Returns the first three losses of each and the seconds per step of every block.
    """
    first_losses = warm_up(steppers, warmup, check)
    blocks = {name: functools.partial(time_block, step, steps, settle) for name, step in steppers.items()}
    return {"first_losses": first_losses, "pause_s": pause, "settle_steps": settle,
            "samples_s": interleave(blocks, repeats, pause)}


def first_values_agree(values: dict[str, list[float]], what: str = "first loss") -> None:
    """Raise unless every contender's first value (a loss, or an output's checksum) agrees with the first
    contender's to 1e-3 (relative, above 1): otherwise they do not compute the same thing."""
    reference_name, reference = next(iter(values.items()))
    for name, got in values.items():
        if abs(got[0] - reference[0]) > 1e-3 * max(1.0, abs(reference[0])):
            raise RuntimeError(f"{name} {what} {got[0]:.6f}, {reference_name} {reference[0]:.6f}: "
                               "the contenders do not compute the same thing")


def measure_in_child(groups: dict[str, dict[str, Callable[[], float]]], args: Any,
                     check: Callable[[dict[str, list[float]]], None],
                     step_multiples: dict[str, int] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """In the one-process child of :func:`one_process_run`: each group of contenders' steppers timed interleaved
    (:func:`run_interleaved`, with ``args``' repeats, steps, warmup and pause) at the child's thread count
    (``args.one_process_child``); a group in ``step_multiples`` takes that many times ``args.steps`` per block (a
    short step, so that its block, too, outlasts the wake-up after the pause). Returns the results by group and the
    thread report."""
    threads = limit_threads(args.one_process_child)
    pause = pause_for(args.one_process_child, args.pause)
    multiples = step_multiples or {}
    return {key: run_interleaved(steppers, args.repeats, args.steps * multiples.get(key, 1), args.warmup, pause, check,
                                 args.settle)
            for key, steppers in groups.items()}, threads


def print_child_line(payload: dict[str, Any], threads: dict[str, Any]) -> None:
    """The one-process child's last line, which :func:`one_process_run` reads: ``payload``, the thread report
    and the library versions, as JSON."""
    print(json.dumps({**payload, "thread_report": threads, **library_versions()}), flush=True)


def library_versions() -> dict[str, str | None]:
    """The numpy and torch versions of this process (None for one not loaded)."""
    return {name: (str(sys.modules[name].__version__) if name in sys.modules else None) for name in ("numpy", "torch")}


def worker_info(name: str, threads: int, torch_contender: bool, **extra: Any) -> dict[str, Any]:
    """What a one-contender worker reports about itself; for a PyTorch contender torch's intra-op threads are
    set to ``threads`` first (torch then loaded)."""
    info: dict[str, Any] = {"contender": name, "threads": threads, **extra}
    if torch_contender:
        import torch  # lazy: only a PyTorch worker loads it

        torch.set_num_threads(threads)
        info["torch_threads"] = torch.get_num_threads()
    return {**info, **library_versions()}


def add_settle_argument(parser: Any) -> None:
    """The ``--settle`` option of a training benchmark (untimed steps at the start of each block)."""
    def count(text: str) -> int:
        value = int(text)
        if value < 0:
            raise ValueError(text)
        return value

    count.__name__ = "count of steps (0 or more)"  # argparse's message: "invalid count of steps (0 or more) value"
    parser.add_argument("--settle", type=count, default=SETTLE_STEPS,
                        help=f"untimed steps at the start of each timed block, after the idle pause (default "
                             f"{SETTLE_STEPS}; 0 times the first step after idle too)")


def timing_argv(args: Any) -> list[str]:
    """The timing options of a training benchmark (``--repeats``, ``--steps``, ``--warmup``, ``--settle`` and
    ``--pause`` where given) as its one-process child takes them."""
    argv = ["--repeats", str(args.repeats), "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--settle", str(args.settle)]
    return argv + ([] if args.pause is None else ["--pause", str(args.pause)])


def pause_for(threads: int, pause: float | None) -> float:
    """The idle time before each block: ``pause`` if given, else :data:`SPIN_PAUSE_S` above one thread, 0 at one."""
    if pause is not None:
        return pause
    return SPIN_PAUSE_S if threads > 1 else 0.0


def one_process_run(script: str, threads: int, child_argv: Sequence[str]) -> dict[str, Any]:
    """Run ``script --one-process-child THREADS child_argv...`` in a fresh process started with
    :func:`thread_env` and return the JSON object it prints last, with ``threads`` added."""
    return {"threads": threads,
            **run_child([script, "--one-process-child", str(threads), *child_argv], env=thread_env(threads))}


def ratio_table(results: Sequence[dict[str, Any]], references: dict[str, str], keys: Sequence[str] = ("threads",)) -> str:
    """Contender, median ms per step, ratio of medians to its reference and median of per-repeat ratios.

    ``references`` maps a contender to the one it is compared with (absent: no ratio); ``keys`` are the
    result fields that lead each row (thread count, batch). *spread* is the contender's interquartile
    range over its median.
    """
    headers = [*keys, "contender", "median ms", "ratio to PyTorch", "per-repeat ratio", "spread"]
    rows = []
    for result in results:
        samples = result["samples_s"]
        for name, values in samples.items():
            stats = summarise(values)
            reference = references.get(name)
            row: list[object] = [*(result[k] for k in keys), name, f"{stats['median'] * 1e3:.3f}"]
            if reference in samples and reference != name:
                row += [f"{stats['median'] / statistics.median(samples[reference]):.2f}×",
                        f"{paired_ratio(values, samples[reference]):.2f}×"]
            else:
                row += ["—", "—"]
            rows.append([*row, f"{stats['spread'] * 100:.1f}%"])
    return markdown_table(headers, rows)


def summary(benchmark: str, results: Sequence[dict[str, Any]], references: dict[str, str],
            keys: Sequence[str] = ("threads",)) -> dict[str, Any]:
    """The results in short, for the JSON line: per contender the median ms, the ratio of medians to its
    reference and the median of per-repeat ratios."""
    out = []
    for result in results:
        samples = result["samples_s"]
        medians = {name: statistics.median(values) for name, values in samples.items()}
        compared = {name: ref for name, ref in references.items() if name in samples and ref in samples and ref != name}
        out.append({
            **{k: result[k] for k in keys},
            "median_ms": {name: round(m * 1e3, 4) for name, m in medians.items()},
            "ratio_to_pytorch": {name: round(medians[name] / medians[ref], 4) for name, ref in compared.items()},
            "per_repeat_ratio": {name: round(paired_ratio(samples[name], samples[ref]), 4)
                                 for name, ref in compared.items()},
        })
    return {"benchmark": benchmark, "results": out}


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
