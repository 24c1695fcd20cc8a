"""Elementwise numpy work split over the cores: a persistent pool of worker threads for the cpu backend.

numpy's BLAS runs a GEMM on every core the user allowed, but its ufunc loops
run on the calling thread alone: at two threads a convolutional step spent
half its time in elementwise passes (depthwise taps, BatchNorm, ReLU,
pooling, the optimizer's update) on one core. numpy releases the GIL inside
those loops, so the same ufunc calls on disjoint contiguous chunks of an
array, with ``out=`` slices, run in parallel from threads. :func:`for_chunks`
splits a range (the batch axis, the rows of an (M, C) view, the elements of
a flat array) into a few contiguous chunks per thread, runs the caller's body
on each (the calling thread and the workers take them in turn) and returns
when all are done; an exception in any chunk is raised in the caller.

Results are bit for bit those of one call: a body must compute every output
element by the same operations whichever chunk holds it (elementwise
ufuncs; a reduction only along an axis that is not split).

How many threads: :func:`threads` — what numpy's OpenBLAS uses now (so
``OMP_NUM_THREADS``/``OPENBLAS_NUM_THREADS`` and ``threadpoolctl`` limits
hold), else those variables, else the CPUs this process may run on;
:func:`set_threads` overrides it (1: everything inline). The pool never runs
while a GEMM does (an op's work is sequential), so the two don't oversubscribe.
Work under :data:`MIN_PARALLEL` elements stays inline: a hand-off costs tens of
microseconds. A call from a pool worker (a body that itself splits) runs inline.
"""

from __future__ import annotations

import atexit
import itertools
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from neuroflow.backends.cpu import openblas_threads

#: Elements of work (summed over the arrays an op reads and writes) below which it runs on the calling thread.
#: Measured (``multiply`` of two float32 arrays, 2 threads): on a 2-core EPYC under load 8, split 45 µs vs 15 µs
#: inline at 128k elements, parity near 1M; on a quiet 2-core Xeon (AVX-512), split 122 µs vs 94 inline at 786k
#: elements of work, 209 vs 227 at 1.6M. A hand-off costs ~10-15 µs even at 32k. At 2^18 the detector's batch-1
#: prediction took 2.56-2.60 ms, at 2^20 2.21-2.25 (training steps of the detector and the small CNN unchanged):
#: the ops this serves split maps of millions of elements of work. Inside a model the worker has usually fallen
#: asleep since its last chunk, and waking it costs more than back to back: with small products on one BLAS
#: thread (:mod:`neuroflow.backends.blas_threads`), the detector's batch-1 forward took 1.92-2.03 ms at 2^20 and
#: 1.79-1.87 at 2^21 (its 48×48×32 depthwise pass, 1.3 M of work, 0.14 ms inline, 0.20 split); the detector's
#: batch-16 step and the small CNN's step measured the same within noise.
MIN_PARALLEL = 1 << 21
#: Chunks per thread: taken in turn, so a descheduled thread (on a loaded machine) delays one small chunk.
CHUNKS_PER_THREAD = 4
#: Bytes of output a body should touch per inner block so its passes stay in the core's L2 cache.
CACHE_BLOCK_BYTES = 1 << 18

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_override: int | None = None


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _variable_threads() -> int | None:
    for name in _THREAD_VARIABLES:
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None


def threads() -> int:
    """The threads elementwise work may use: :func:`set_threads`, else BLAS's count, else the variables, else CPUs."""
    if _override is not None:
        return _override
    blas = openblas_threads()
    chosen = blas if blas is not None else _variable_threads()
    return max(1, min(chosen if chosen is not None else _available_cpus(), _available_cpus()))


def set_threads(count: int | None) -> None:
    """Use ``count`` threads for elementwise work (1: all inline); None goes back to :func:`threads`' default."""
    global _override
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"set_threads: count must be a positive int or None; got {count!r}")
    _override = count


class _Call:
    """One split call: its chunks, taken in order by whichever thread is free (the caller too), so a thread the
    system has descheduled holds up at most one small chunk."""

    def __init__(self, body: Callable[[int, int], None], bounds: list[tuple[int, int]]) -> None:
        self.body: Callable[[int, int], None] | None = body
        self.bounds = bounds
        self.taken = itertools.count()
        self.done: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()

    def work(self, worker: bool) -> tuple[int, BaseException | None]:
        """Run chunks until none is left: (chunks run, the first error); a worker reports each on ``done``."""
        body, ran, error = self.body, 0, None
        while body is not None:
            index = next(self.taken)  # atomic under the GIL
            if index >= len(self.bounds):
                break
            try:
                body(*self.bounds[index])
                outcome = None
            except BaseException as raised:  # noqa: BLE001 - handed to the caller, which raises it
                outcome = raised
            if worker:
                self.done.put(outcome)
            else:
                ran += 1
                error = error or outcome
        return ran, error


class _Pool:
    """Worker threads waiting on one task queue; each task carries the queue its result goes back on."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.workers: list[threading.Thread] = []
        self.lock = threading.Lock()

    def ensure(self, count: int) -> None:
        with self.lock:
            while len(self.workers) < count:
                worker = threading.Thread(target=self._serve, name=f"neuroflow-cpu-{len(self.workers)}", daemon=True)
                worker.start()
                self.workers.append(worker)

    def _serve(self) -> None:
        _local.in_worker = True
        while True:
            call = self.tasks.get()
            if call is None:
                return
            call.work(worker=True)
            del call  # while waiting for the next, hold nothing of this one (its arrays belong to the caller)

    def stop(self) -> None:
        with self.lock:
            for _ in self.workers:
                self.tasks.put(None)
            self.workers = []


_local = threading.local()
_pool: _Pool | None = None
_pool_lock = threading.Lock()


def _the_pool() -> _Pool:
    global _pool
    pool = _pool
    if pool is None or pool.pid != os.getpid():
        with _pool_lock:
            if _pool is None or _pool.pid != os.getpid():
                _pool = _Pool()
            pool = _pool
    return pool


def _forget_pool() -> None:  # in a forked child: the parent's workers did not come along
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


def _shutdown() -> None:
    if _pool is not None and _pool.pid == os.getpid():
        _pool.stop()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)
atexit.register(_shutdown)


def chunks(n: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous (start, stop) ranges covering range(n), sizes differing by at most one (none empty)."""
    parts = max(1, min(parts, n))
    size, extra = divmod(n, parts)
    bounds, start = [], 0
    for k in range(parts):
        stop = start + size + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def for_chunks(n: int, body: Callable[[int, int], None], work: int, count: int | None = None) -> None:
    """Run ``body(start, stop)`` over contiguous chunks covering range(``n``) on ``count`` threads (default
    :func:`threads`), :data:`CHUNKS_PER_THREAD` chunks each, and wait for all.

    ``work`` (elements read and written in all) under :data:`MIN_PARALLEL`,
    one thread, or a call from a pool worker: ``body(0, n)`` inline. The
    first exception a chunk raised is raised here, after every chunk ended.
    """
    # small work first: it is most calls, and asking how many threads costs two system calls
    parts = 1 if work < MIN_PARALLEL or n <= 1 else min(threads() if count is None else count, n)
    if parts <= 1 or getattr(_local, "in_worker", False):
        if n > 0:
            body(0, n)
        return
    pool = _the_pool()
    pool.ensure(parts - 1)
    call = _Call(body, chunks(n, min(n, parts * CHUNKS_PER_THREAD)))
    for _ in range(parts - 1):
        pool.tasks.put(call)
    ran, error = call.work(worker=False)
    for _ in range(len(call.bounds) - ran):  # wait for the chunks the workers took
        outcome = call.done.get()
        error = error or outcome
    call.body = None  # a worker that wakes only now finds nothing to run and drops the call
    if error is not None:
        raise error


def blocks(start: int, stop: int, item_bytes: int) -> Iterator[tuple[int, int]]:
    """Sub-ranges of [start, stop) of about :data:`CACHE_BLOCK_BYTES` each, for items of ``item_bytes``."""
    step = max(1, CACHE_BLOCK_BYTES // max(item_bytes, 1))
    for lo in range(start, stop, step):
        yield lo, min(lo + step, stop)


def _chunk_of(a: Any, n: int, start: int, stop: int) -> Any:
    if isinstance(a, np.ndarray) and a.ndim > 0 and a.shape[0] == n and n > 1:
        return a[start:stop]
    return a  # a scalar, or an array that broadcasts along the split axis


def ufunc(fn: Any, *args: Any, out: Any) -> Any:
    """``fn(*args, out=out)`` for a numpy ufunc, split over ``out``'s first axis; arguments broadcast as in numpy.

    An argument with ``out``'s first dimension is split with it; one without
    (a per-channel vector, a scalar) goes whole to every chunk. Equal, bit for
    bit, to the single call for the exact IEEE operations (add, subtract,
    multiply, divide, maximum, minimum, comparisons, sqrt).
    """
    if not isinstance(out, np.ndarray) or out.ndim == 0 or out.size * (1 + len(args)) < MIN_PARALLEL:
        return fn(*args, out=out)  # a scalar, or work too small to split: one call
    n = out.shape[0]
    if any(isinstance(a, np.ndarray) and a.ndim == out.ndim and a.shape[0] not in (1, n) for a in args):
        return fn(*args, out=out)  # a shape numpy will refuse: let it say so

    def body(start: int, stop: int) -> None:
        fn(*(_chunk_of(a, n, start, stop) for a in args), out=out[start:stop])

    for_chunks(n, body, out.size * (1 + len(args)))
    return out


def copyto(dst: Any, src: Any) -> None:
    """``np.copyto(dst, src)`` split over ``dst``'s first axis (``src`` of ``dst``'s shape or broadcasting to it)."""
    if not isinstance(dst, np.ndarray) or dst.ndim == 0:
        np.copyto(dst, src)
        return
    n = dst.shape[0]

    def body(start: int, stop: int) -> None:
        np.copyto(dst[start:stop], _chunk_of(src, n, start, stop))

    for_chunks(n, body, 2 * dst.size)


def over_batch(xp: Any, n: int, run: Callable[[int, int], None], work: int, sample_bytes: int = 0) -> None:
    """``run(lo, hi)`` over range(``n``): on numpy split between the threads (in blocks of about
    :data:`CACHE_BLOCK_BYTES` when ``sample_bytes`` is given), inline on any other namespace."""
    if xp is not np:
        run(0, n)
        return
    if not sample_bytes:
        for_chunks(n, run, work)
        return

    def chunk(start: int, stop: int) -> None:
        for lo, hi in blocks(start, stop, sample_bytes):
            run(lo, hi)

    for_chunks(n, chunk, work)
