"""How long numpy's OpenBLAS lets an idle worker thread spin: NeuroFlow's own programs shorten it before numpy loads.

numpy's wheels ship a pthreads OpenBLAS whose worker threads, after every
threaded call, busy-wait for 2^28 time-stamp-counter ticks (~0.1 s) so that
the next call finds them awake. A training step calls a GEMM every few
milliseconds, so a core is never free of a spinning worker, and the
elementwise passes :mod:`neuroflow.backends.cpu_parallel` splits between the
cores run at half speed on it. Measured on the small CNN of
``benchmarks/cnn.py`` (2 threads, 2-core EPYC): a step took 83–90 ms with
OpenBLAS's default and 76–77 ms with ``OPENBLAS_THREAD_TIMEOUT=18`` (2^18
ticks, ~0.1 ms), an epoch of ``make demo`` 109 s and 85 s; an MLP step at
2 threads moved within this machine's noise.

OpenBLAS reads the variable once, when numpy loads it, so a library cannot
set it: by the time ``neuroflow`` is imported, numpy usually is. The
``neuroflow`` command and ``make demo`` call :func:`prepare` first, which
sets it (unless the user did) for their process and its children (the ranks
``--nproc`` starts). A script sets it itself, before Python starts:
``OPENBLAS_THREAD_TIMEOUT=18 python train.py``. Running OpenBLAS's threads on
NeuroFlow's own through ``openblas_set_threads_callback_function`` was tried
and left: its jobs share per-thread state with OpenBLAS's own workers, and a
product computed on them in another thread came back wrong.
"""

from __future__ import annotations

import os
import sys

VARIABLE = "OPENBLAS_THREAD_TIMEOUT"
#: log2 of the ticks an idle worker spins: long enough to stay awake between the back-to-back products of an
#: MLP step, short enough to leave the core to elementwise work between a convolution's products.
TIMEOUT = 18


def prepare() -> bool:
    """Set ``OPENBLAS_THREAD_TIMEOUT`` to :data:`TIMEOUT` unless it is set; whether it takes effect in this
    process (numpy not loaded yet). Children started later see it either way."""
    os.environ.setdefault(VARIABLE, str(TIMEOUT))
    return "numpy" not in sys.modules
