"""neuroflow.backends.blas_threads: OpenBLAS's parallel jobs on NeuroFlow's threads give OpenBLAS's results bit for
bit, from several threads at once, across fork, Ctrl-C and exit; the pool's start turns it on, the variable off."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from neuroflow.backends import blas_threads
from neuroflow.backends.cpu import openblas_threads

needs_callback = pytest.mark.skipif(not blas_threads.available(), reason="numpy's BLAS takes no threads callback")


def run_child(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with OpenBLAS on 2 threads (a hang fails the test, not the suite)."""
    variables = {**os.environ, "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=variables, capture_output=True,
                          text=True, timeout=240)


def operands(rng: np.random.Generator) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """GEMMs OpenBLAS splits between threads (level 3 and level 2), strided and transposed operands included."""
    out = []
    for dtype in (np.float32, np.float64, np.complex64):
        a = rng.standard_normal((700, 600)).astype(dtype)
        b = rng.standard_normal((600, 500)).astype(dtype)
        out += [(f"gemm {np.dtype(dtype).name}", a, b), (f"gemm transposed {np.dtype(dtype).name}", b.T, a.T)]
    a = rng.standard_normal((4096, 2048)).astype(np.float32)
    out += [("gemv", a, rng.standard_normal(2048).astype(np.float32)), ("strided", a[::2, ::4], a[:512:, :512].T)]
    out.append(("conv-shaped", rng.standard_normal((16384, 288)).astype(np.float32),
                rng.standard_normal((288, 64)).astype(np.float32)))
    return out


@needs_callback
@pytest.mark.skipif((openblas_threads() or 1) < 2, reason="OpenBLAS runs on one thread here: no parallel region")
def test_products_equal_openblas_own_threads_bit_for_bit_and_run_on_the_crew():
    was_shared = blas_threads.shared()
    cases = operands(np.random.default_rng(0))
    try:
        blas_threads.unshare()
        expected = [a @ b for _, a, b in cases]
        assert blas_threads.share() and blas_threads.shared()
        before = blas_threads.regions()
        for (name, a, b), want in zip(cases, expected):
            assert np.array_equal(a @ b, want), name
        assert blas_threads.regions() >= before + len(cases) - 1  # each product was a region on NeuroFlow's threads
    finally:
        if not was_shared:
            blas_threads.unshare()


@needs_callback
def test_the_pool_starting_shares_and_the_variable_keeps_openblas_own_threads():
    code = """
        import numpy as np
        from neuroflow.backends import blas_threads, cpu_parallel
        print(blas_threads.shared())
        cpu_parallel.set_threads(2)
        x = np.ones(1 << 21, np.float32)
        cpu_parallel.ufunc(np.multiply, x, 2.0, out=x)  # large enough to split: the pool starts its worker
        a = np.ones((512, 512), np.float32)
        product = a @ a
        print(blas_threads.shared(), blas_threads.regions() > 0 if blas_threads.shared() else None, product[0, 0])
    """
    on = run_child(code)
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == ["False", "True", "True", "512.0"]
    off = run_child(code, NEUROFLOW_SHARE_BLAS_THREADS="0")
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["False", "False", "None", "512.0"]


@needs_callback
def test_products_from_several_threads_at_once_beside_the_elementwise_pool():
    code = """
        import threading
        import numpy as np
        from neuroflow.backends import blas_threads, cpu_parallel
        rng = np.random.default_rng(1)
        pairs = [(rng.standard_normal((n, 300)).astype(np.float32), rng.standard_normal((300, m)).astype(np.float32))
                 for n, m in ((900, 400), (64, 128), (2000, 64), (300, 1))]
        expected = [a @ b for a, b in pairs]  # OpenBLAS's own threads
        assert blas_threads.share()
        wrong, errors = [], []

        def work(seed):
            try:
                local = np.random.default_rng(seed)
                for step in range(40):
                    k = int(local.integers(len(pairs)))
                    if not np.array_equal(pairs[k][0] @ pairs[k][1], expected[k]):
                        wrong.append((seed, step, k))
                    x = np.full(1 << 20, float(seed), np.float32)
                    cpu_parallel.ufunc(np.add, x, 1.0, out=x)
                    if float(x[-1]) != seed + 1.0:
                        wrong.append((seed, step, "ufunc"))
            except BaseException as raised:
                errors.append(raised)

        threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        print(len(wrong), len(errors), blas_threads.regions() > 0)
    """
    done = run_child(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "0", "True"]


@needs_callback
def test_ctrl_c_during_products_is_raised_after_them_and_nothing_is_lost():
    code = """
        import os, signal, threading, time
        import numpy as np
        from neuroflow.backends import blas_threads
        rng = np.random.default_rng(2)
        a = rng.standard_normal((1500, 1500)).astype(np.float32)
        want = a @ a
        assert blas_threads.share()
        stop = threading.Event()

        def interrupt():  # a few Ctrl-C presses at random moments, not a storm
            pause = np.random.default_rng(3)
            for _ in range(10):
                if stop.wait(float(pause.uniform(0.1, 0.5))):
                    return
                os.kill(os.getpid(), signal.SIGINT)

        sender = threading.Thread(target=interrupt, daemon=True)
        sender.start()
        interrupted = bad = 0
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                got = a @ a
                bad += not np.array_equal(got, want)
            except KeyboardInterrupt:
                interrupted += 1
        stop.set()
        sender.join()
        time.sleep(0.1)
        try:
            final = a @ a
        except KeyboardInterrupt:
            final = a @ a
        print(interrupted > 0, bad, np.array_equal(final, want))
    """
    done = run_child(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "0", "True"]
    assert "callback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr


@needs_callback
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_gets_its_own_crew_and_exit_is_clean():
    code = """
        import atexit, os
        import numpy as np
        from neuroflow.backends import blas_threads
        a = np.arange(600 * 600, dtype=np.float64).reshape(600, 600) % 7
        want = a @ a
        assert blas_threads.share()
        assert np.array_equal(a @ a, want)
        pid = os.fork()
        if pid == 0:  # the parent's crew did not come along: the child's first region starts its own
            ok = np.array_equal(a @ a, want) and blas_threads.regions() == 1
            os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        atexit.register(lambda: print("at exit", np.array_equal(a @ a, want)))  # runs before sharing ends
        print("child", os.waitstatus_to_exitcode(status))
    """
    done = run_child(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["child 0", "at exit True"]


@needs_callback
def test_an_exception_before_the_jobs_ran_ends_the_process_rather_than_return_a_wrong_product():
    code = """
        import sys, types
        import numpy as np
        from neuroflow.backends import blas_threads
        assert blas_threads.share()
        sys.unraisablehook(types.SimpleNamespace(object=blas_threads._callback, exc_value=KeyboardInterrupt(),
                                                 exc_type=KeyboardInterrupt, exc_traceback=None, err_msg=None))
        print("went on")
    """
    done = run_child(code)
    assert done.returncode == 130 and "went on" not in done.stdout
    assert "before its jobs ran" in done.stderr and "wrong result" in done.stderr
