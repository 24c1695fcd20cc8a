"""numba's compiled kernels for the vision ops: whether they run, loading them on first use, readiness per dtype.

A kernel module (``conv_depthwise_numba``, ``batchnorm_numba``, ``pooling_numba``)
imports numba and defines ``ready(dtype)``, which compiles or loads its kernels for C-contiguous
arrays of that dtype (with :func:`heal_cache`). The ops ask :func:`kernels`
at each call; the answer is worked out once per module and dtype:

- numba missing, turned off (``NEUROFLOW_NUMBA=0`` or :func:`use_numba`), an
  array of another backend or dtype: None, and the op runs its numpy code,
  which stays the reference;
- a module that fails to import (a numba that refuses this numpy, no writable
  cache in a read-only install) or kernels that fail to compile: one warning
  naming the error, then None from then on.

numba is imported by the first call that wants it, never by ``import neuroflow``.
Loading it costs about 118 MB of RSS once (measured: ``import numba`` 64 MB, LLVM
set up for the first cached kernels 53), which the depthwise convolutions and
batch normalisations repay; a max pool's kernels alone do not (the small CNN of
``benchmarks/cnn.py``: 13 % of its step against an RSS rise of 146 MB instead
of 34), so :data:`RIDERS` run only where numba is already in the process.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

_wanted = os.environ.get("NEUROFLOW_NUMBA", "1").strip().lower() not in ("0", "false", "no", "off")
#: what each kernel module computes, for the warnings: "<what> run on numpy alone: ..."
_WHAT = {"conv_depthwise_numba": "depthwise convolutions", "batchnorm_numba": "batch normalisations",
         "pooling_numba": "max poolings"}


#: kernel modules that never load numba themselves: they run once something else has imported it
RIDERS = frozenset({"pooling_numba"})


def use_numba(flag: bool) -> None:
    """Run the ops that have compiled kernels with them (where numba is installed) or with numpy alone."""
    global _wanted
    _wanted = bool(flag)


def wanted() -> bool:
    """Whether compiled kernels are to run where they can (:func:`use_numba`, ``NEUROFLOW_NUMBA``)."""
    return _wanted


@functools.cache
def load(module: str) -> ModuleType | None:
    """The kernel module ``neuroflow_ops_vision.<module>``, imported (and numba with it) on first use; None without
    a working numba."""
    if importlib.util.find_spec("numba") is None:
        return None
    try:
        # lazy: numba is an optional dependency, and importing it costs half a second and 55 MB
        return importlib.import_module(f"neuroflow_ops_vision.{module}")
    except Exception as error:  # a numba that refuses this numpy (ImportError), no writable cache (RuntimeError), ...
        warnings.warn(f"{_WHAT[module]} run on numpy alone: numba's kernels could not be loaded "
                      f"({type(error).__name__}: {error}); NEUROFLOW_NUMBA=0 silences this", RuntimeWarning,
                      stacklevel=4)
        return None


@functools.cache
def _ready(module: str, dtype: str) -> ModuleType | None:
    """The kernels of ``module``, compiled or loaded for ``dtype``; None where that fails."""
    kernels = load(module)
    if kernels is None:
        return None
    try:
        kernels.ready(np.dtype(dtype))
    except Exception as error:
        warnings.warn(f"{_WHAT[module]} run on numpy alone: numba's {dtype} kernels could not be compiled "
                      f"({type(error).__name__}: {error}); NEUROFLOW_NUMBA=0 silences this", RuntimeWarning,
                      stacklevel=4)
        return None
    return kernels


def kernels(module: str, xp: Any, dtype: Any) -> ModuleType | None:
    """The kernels of ``module`` when they run arrays of ``dtype`` on ``xp``: numpy, float32 or float64, numba
    installed and wanted (and, for :data:`RIDERS`, already imported); else None."""
    if not _wanted or xp is not np or np.dtype(dtype) not in (np.float32, np.float64):
        return None
    if module in RIDERS and "numba" not in sys.modules:
        return None
    return _ready(module, np.dtype(dtype).str)


def forget() -> None:
    """Look numba and every kernel module up again at the next call (after numba was installed or removed)."""
    load.cache_clear()
    _ready.cache_clear()


def heal_cache(module: str, kernel: Any, run_each: Callable[[], None]) -> None:
    """``run_each()`` (each kernel of ``module`` once, on tiny arrays); where that raises, delete ``module``'s files
    from numba's cache (the directory of ``kernel``, one of its compiled functions) and run it again.

    A cache numba cannot read (a file cut short by a crash mid-write, a disk error, a hostile file) makes numba
    raise on every later run; compiled again, the kernels work. Raises what the second attempt raises.
    """
    try:
        run_each()
    except Exception:
        directory = kernel.stats.cache_path
        if directory is None or not os.path.isdir(directory):
            raise
        prefix = module + "."  # the module's files: <module>.<kernel>-<line>.py311.nbi, ....nbc
        for name in os.listdir(directory):
            if name.startswith(prefix) and name.endswith((".nbi", ".nbc")):
                os.remove(os.path.join(directory, name))
        run_each()
