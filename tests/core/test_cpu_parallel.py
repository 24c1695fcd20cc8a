"""neuroflow.backends.cpu_parallel: chunked elementwise work equals one call bit for bit, and the pool behaves."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from neuroflow.backends import cpu_parallel
from neuroflow.backends.cpu import openblas_threads


@pytest.fixture
def two_threads():
    cpu_parallel.set_threads(2)
    yield
    cpu_parallel.set_threads(None)


def test_chunks_cover_the_range_contiguously():
    for n in (1, 2, 7, 64):
        for parts in (1, 2, 3, 8, 100):
            bounds = cpu_parallel.chunks(n, parts)
            assert bounds[0][0] == 0 and bounds[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
            assert all(stop > start for start, stop in bounds)
            sizes = [stop - start for start, stop in bounds]
            assert max(sizes) - min(sizes) <= 1 and len(bounds) == min(parts, n)


def test_for_chunks_runs_every_chunk_once_on_several_threads(two_threads):
    seen: list[tuple[int, int, str]] = []
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=30)  # each chunk waits for a second thread: the worker must take one

    def body(start: int, stop: int) -> None:
        with lock:
            seen.append((start, stop, threading.current_thread().name))
        both.wait()

    cpu_parallel.for_chunks(2, body, work=cpu_parallel.MIN_PARALLEL)
    assert sorted(s[:2] for s in seen) == [(0, 1), (1, 2)]
    assert len({s[2] for s in seen}) == 2  # the caller and one worker
    covered: list[int] = []
    cpu_parallel.for_chunks(1000, lambda a, b: covered.extend(range(a, b)), work=cpu_parallel.MIN_PARALLEL)
    assert sorted(covered) == list(range(1000))


def test_small_work_and_one_thread_stay_inline(two_threads):
    names: list[str] = []
    cpu_parallel.for_chunks(10, lambda a, b: names.append(threading.current_thread().name), work=10)
    cpu_parallel.set_threads(1)
    cpu_parallel.for_chunks(10, lambda a, b: names.append(threading.current_thread().name),
                            work=cpu_parallel.MIN_PARALLEL)
    assert names == [threading.current_thread().name] * 2


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_ufunc_and_copy_equal_one_call_bit_for_bit(two_threads, dtype):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 64, 65)).astype(dtype)
    b = rng.standard_normal((65,)).astype(dtype)
    c = rng.standard_normal((1, 64, 65)).astype(dtype)
    for fn, args in ((np.multiply, (a, b)), (np.add, (a, c)), (np.maximum, (a, 0.0)), (np.divide, (a, b)),
                     (np.subtract, (c, a))):
        want = fn(*args)
        got = cpu_parallel.ufunc(fn, *args, out=np.empty_like(want))
        assert got.tobytes() == want.tobytes()
    view = a[:, ::2, 1:]
    dst = np.empty(view.shape, dtype)
    cpu_parallel.copyto(dst, view)
    assert np.array_equal(dst, view)


def test_ufunc_shape_errors_are_numpys(two_threads):
    a = np.zeros((4, 300_000), np.float32)
    with pytest.raises(ValueError):
        cpu_parallel.ufunc(np.add, a, np.zeros((3, 300_000), np.float32), out=a)


def test_an_exception_in_a_worker_reaches_the_caller_after_every_chunk(two_threads):
    finished: list[int] = []

    def body(start: int, stop: int) -> None:
        if start > 0:
            raise KeyError(f"chunk {start}")
        finished.append(start)

    with pytest.raises(KeyError, match="chunk"):
        cpu_parallel.for_chunks(4, body, work=cpu_parallel.MIN_PARALLEL)
    assert finished == [0]
    # the pool still works afterwards
    out = np.empty(4 * cpu_parallel.MIN_PARALLEL, np.float32)
    cpu_parallel.ufunc(np.multiply, np.ones_like(out), 2.0, out=out)
    assert np.all(out == 2)


def test_calls_from_two_threads_at_once_and_nested_calls(two_threads):
    n = cpu_parallel.MIN_PARALLEL
    results: dict[int, bool] = {}

    def caller(seed: int) -> None:
        x = np.random.default_rng(seed).standard_normal((8, n // 8 + 1)).astype(np.float32)
        ok = True
        for _ in range(50):
            got = cpu_parallel.ufunc(np.multiply, x, 3.0, out=np.empty_like(x))
            ok &= got.tobytes() == (x * 3.0).tobytes()
        results[seed] = ok

    threads = [threading.Thread(target=caller, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {0: True, 1: True, 2: True}

    inner: list[str] = []  # a body that splits again runs its inner split inline in a worker, not waiting on the pool
    both = threading.Barrier(2, timeout=30)  # the worker takes one outer chunk while the caller runs the other

    def outer(start: int, stop: int) -> None:
        cpu_parallel.for_chunks(4, lambda a, b: inner.append(f"{a}-{b}"), work=n)
        both.wait()

    cpu_parallel.for_chunks(2, outer, work=n)
    assert inner.count("0-4") == 1 and sorted(inner.remove("0-4") or inner) == ["0-1", "1-2", "2-3", "3-4"]


def test_thread_count_follows_blas_and_set_threads():
    blas = openblas_threads()
    expected = blas if blas is not None else None
    if expected is not None:
        assert cpu_parallel.threads() == max(1, min(expected, len(os.sched_getaffinity(0))))
    cpu_parallel.set_threads(3)
    assert cpu_parallel.threads() == 3
    cpu_parallel.set_threads(None)
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="positive int"):
            cpu_parallel.set_threads(bad)  # type: ignore[arg-type]


_CHILD = """
import os, numpy as np
from neuroflow.backends import cpu_parallel
print(cpu_parallel.threads())
cpu_parallel.set_threads(2)
x = np.ones(1 << 20, np.float32)
cpu_parallel.ufunc(np.multiply, x, 2.0, out=x)          # starts the pool in the parent
pid = os.fork()
if pid == 0:                                             # the child has no workers: the pool starts anew
    y = np.ones(1 << 20, np.float32)
    cpu_parallel.ufunc(np.multiply, y, 3.0, out=y)
    os._exit(0 if float(y.sum()) == 3 * (1 << 20) else 1)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), float(x.sum()))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_env_thread_count_fork_safety_and_clean_exit():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split("\n")
    assert lines[0] == "1"  # the user's thread count holds
    assert lines[1] == f"child 0 {2.0 * (1 << 20)}"  # forked child computed, parent exited without hanging


def test_the_pool_keeps_no_reference_to_a_finished_call(two_threads):
    import gc
    import weakref

    x = np.ones(4 * cpu_parallel.MIN_PARALLEL, np.float32)
    ref = weakref.ref(x)
    gc.disable()
    try:
        cpu_parallel.ufunc(np.multiply, x, 2.0, out=x)
        del x
        assert ref() is None  # a worker waiting for its next task holds nothing of the last one
    finally:
        gc.enable()
