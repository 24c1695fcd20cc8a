"""How long numpy's OpenBLAS lets an idle worker thread spin: NeuroFlow shortens it when imported before numpy.

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

OpenBLAS reads the variable once, when numpy loads it. ``import neuroflow``
does not load numpy, so :func:`prepare` runs there: a script that imports
NeuroFlow first, as the spec's snippet does, gets the setting (unless the
user set the variable), and so do the processes it starts, which inherit it.
A script that imports numpy first keeps OpenBLAS's default: start it as
``OPENBLAS_THREAD_TIMEOUT=18 python train.py``; ``neuroflow doctor`` (the cpu
backend's ``blas_idle_spin``) says what OpenBLAS read. The setting only
changes how soon an idle worker sleeps: a product issued after it slept waits
for the worker to wake. ``OPENBLAS_THREAD_TIMEOUT=28`` keeps OpenBLAS's
default. Running OpenBLAS's threads on NeuroFlow's own through
``openblas_set_threads_callback_function`` was tried and left: its jobs share
per-thread state with OpenBLAS's own workers, and a product computed on them
in another thread came back wrong.
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
