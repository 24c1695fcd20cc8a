"""How many of BLAS's threads a matrix product gets: one per :data:`GEMM_GRAIN` multiply-adds.

OpenBLAS splits every GEMM above 2^18 multiply-adds over all the threads it
may use. Its workers spin for ``OPENBLAS_THREAD_TIMEOUT`` ticks after a call
and then sleep (about 0.1 ms at the 2^18 ticks :mod:`neuroflow.blas_idle`
sets); between the products of a small model's step there is more than that
of other work (depthwise loops, normalisations, the elementwise pool of
:mod:`neuroflow.backends.cpu_parallel`), so each product wakes a sleeping
worker, and for a product of a few million multiply-adds the wake costs more
than the split saves. Timed back to back, where the workers never sleep,
two threads win even there; inside a model they lose.

Measured on a 2-core Xeon (AVX-512, numpy's OpenBLAS 0.3.31), the detector's
``yolo_lite`` at batch 1 (nine products of 0.8–7.1 M multiply-adds), forward
time in steady state / first prediction after 0.2 s idle: every product on
two threads 2.11 / 4.91 ms; on one thread below 3 M 2.01 / 3.49; below 8 M
1.87 / 3.26; below 30 M 1.89 / 3.13. Products of 30 M and more (most of a
batch-16 step's) still gain about 2× from two threads. ``benchmarks/detector.py``
at batch 1 went from 1.37× PyTorch's time to 1.01×, and one prediction every
1/30 s from 18.6 ms to about 3 (a sleeping worker is slower still to wake after
33 ms); the small CNN's and an MLP's steps (alone in a process) did not change.

Where products run back to back the workers never fall asleep and two
threads win even on small ones: a recurrent cell's products, one per time
step, call numpy directly (through this function the LSTM of
``benchmarks/recurrent.py`` at 32×32×16→64 took 4.3 ms instead of 3.5).

:func:`matmul` is ``numpy.matmul`` with that choice made: a product gets
``1 + work // GEMM_GRAIN`` threads, at most what OpenBLAS was given. The
limit is OpenBLAS's process-wide thread count, lowered for the call and put
back after it. Calls from several threads at once share one lowering
(counted under a lock): while any of them runs, every product in the process
runs on the lowered count, which changes timing only, never a result
(OpenBLAS's sums over k do not depend on its thread count). A count somebody
sets meanwhile (a ``threadpoolctl`` limit in another thread) stands. Another
BLAS, or another array namespace, is called as it is.
"""

from __future__ import annotations

import functools
import math
import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from neuroflow.backends.cpu import openblas_threads, set_openblas_threads

#: Multiply-adds per BLAS thread: a product of less runs on one thread (see the module docstring).
GEMM_GRAIN = 1 << 23
#: OpenBLAS runs a GEMM of at most this many multiply-adds on one thread by itself (SMP_THRESHOLD_MIN ×
#: GEMM_MULTITHREAD_THRESHOLD in its interface/gemm.c): nothing to lower.
OPENBLAS_SERIAL = 1 << 18

_lock = threading.Lock()
_holders = 0
_lowered_from = 0  # the thread count OpenBLAS had before the first holder lowered it
_lowered_to = 0  # the count the first holder set


def work(a: Any, b: Any) -> int:
    """Multiply-adds of ``a @ b`` (numpy's matmul shapes: stacks broadcast, a vector is one row or column)."""
    m = a.shape[-2] if a.ndim > 1 else 1
    k = a.shape[-1]
    n = b.shape[-1] if b.ndim > 1 else 1
    stack = max(math.prod(a.shape[:-2]), math.prod(b.shape[:-2]))
    return stack * m * k * n


def threads_for(multiply_adds: int) -> int:
    """The BLAS threads a product of ``multiply_adds`` pays for (at most what OpenBLAS was given runs)."""
    return 1 + multiply_adds // GEMM_GRAIN


def matmul(xp: Any, a: Any, b: Any, out: Any = None) -> Any:
    """``xp.matmul(a, b, out=out)``, on as many of OpenBLAS's threads as its size pays for (numpy arrays)."""
    if xp is not np:
        return xp.matmul(a, b, out=out)
    return _product(work(a, b))(a, b, out=out)


def matmul_call(a: Any, b: Any, out: Any) -> Callable[[], Any]:
    """:func:`matmul` of numpy arrays as a call to repeat on the same arrays (a replayed step's, see
    :mod:`neuroflow.replay`): the size and the thread count worked out once, not every step."""
    return functools.partial(_product(work(a, b)), a, b, out=out)


def _product(multiply_adds: int) -> Callable[..., Any]:
    """What runs a product of ``multiply_adds``: numpy's matmul as it is under OpenBLAS's own serial size, else
    on the threads it pays for."""
    if multiply_adds <= OPENBLAS_SERIAL:
        return np.matmul
    return functools.partial(_on_threads, threads_for(multiply_adds))


def _on_threads(count: int, a: Any, b: Any, out: Any = None) -> Any:
    """``np.matmul(a, b, out=out)`` with OpenBLAS held at no more than ``count`` threads."""
    if not _lower_to(count):
        return np.matmul(a, b, out=out)
    try:
        return np.matmul(a, b, out=out)
    finally:
        _put_back()


def _lower_to(count: int) -> bool:
    """Hold OpenBLAS at ``count`` threads (or at a lower count another holder set) until :func:`_put_back`; False
    (nothing held) where it has no more than ``count`` or is not OpenBLAS."""
    global _holders, _lowered_from, _lowered_to
    with _lock:
        if _holders == 0:
            current = openblas_threads()
            if current is None or current <= count or not set_openblas_threads(count):
                return False
            _lowered_from, _lowered_to = current, count
        _holders += 1
        return True


def _put_back() -> None:
    """Release one hold; the last gives OpenBLAS back the count it had, unless somebody set another meanwhile
    (a ``threadpoolctl`` limit entered in another thread): that one stands."""
    global _holders
    with _lock:
        _holders -= 1
        if _holders == 0 and openblas_threads() == _lowered_to:
            set_openblas_threads(_lowered_from)


def _after_fork_in_child() -> None:  # a child forked inside a block: no holder came along, the count goes back
    global _lock, _holders
    _lock = threading.Lock()
    if _holders:
        _holders = 0
        set_openblas_threads(_lowered_from)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
