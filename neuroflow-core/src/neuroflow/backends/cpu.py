"""The cpu backend: numpy, with the BLAS numpy was built with."""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from neuroflow.backends.base import Backend

_CORENAME_SYMBOLS = ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                     "openblas_get_corename")
_THREADS_SYMBOLS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
                    "openblas_get_num_threads")
_SET_THREADS_SYMBOLS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                        "openblas_set_num_threads64_", "openblas_set_num_threads")
_TIMEOUT_SYMBOLS = ("openblas_thread_timeout",)


@functools.lru_cache(maxsize=1)
def _openblas() -> ctypes.CDLL | None:
    """numpy's OpenBLAS (the handle numpy loaded already), or None for another BLAS."""
    folder = Path(np.__file__).resolve().parent.parent / "numpy.libs"
    for path in sorted(folder.glob("*openblas*")) if folder.is_dir() else ():
        try:
            return ctypes.CDLL(str(path))
        except OSError:
            continue
    return None


@functools.cache
def _function(symbols: tuple[str, ...], restype: Any) -> Callable[..., Any] | None:
    """The first of ``symbols`` numpy's OpenBLAS exports, returning ``restype``; None for another BLAS."""
    library = _openblas()
    for symbol in symbols if library is not None else ():
        function = getattr(library, symbol, None)
        if function is not None:
            function.restype = restype
            return function  # type: ignore[no-any-return]
    return None


def openblas_threads() -> int | None:
    """The threads numpy's OpenBLAS uses now (its variables, ``threadpoolctl`` limits), or None for another BLAS."""
    function = _function(_THREADS_SYMBOLS, ctypes.c_int)
    return None if function is None else int(function())


def set_openblas_threads(count: int) -> bool:
    """Make numpy's OpenBLAS use ``count`` threads from its next call on (process-wide, as ``threadpoolctl`` does);
    False for another BLAS, which is left alone."""
    function = _function(_SET_THREADS_SYMBOLS, None)
    if function is None:
        return False
    function(ctypes.c_int(count))
    return True


@functools.lru_cache(maxsize=1)
def openblas_thread_timeout() -> int | None:
    """The ``OPENBLAS_THREAD_TIMEOUT`` numpy's OpenBLAS read when it loaded (0: unset, its default 2^28 ticks of
    spinning), or None for another BLAS or an OpenBLAS without the query (see :mod:`neuroflow.blas_idle`)."""
    function = _function(_TIMEOUT_SYMBOLS, ctypes.c_int)
    return None if function is None else int(function())


@functools.lru_cache(maxsize=1)
def blas_core() -> str | None:
    """The kernels numpy's OpenBLAS chose for this CPU ("SkylakeX", "Haswell", ...), or None for another BLAS.

    It decides GEMM speed: on an AMD Zen 5 the AVX-512 kernels ("SkylakeX", what OpenBLAS 0.3.31 picks there
    by itself) ran a ResNet-18 step in 0.65× the time of the AVX2 ones ("Haswell", which the environment
    variable ``OPENBLAS_CORETYPE=Haswell`` forces). The variable is read when numpy loads OpenBLAS.
    """
    function = _function(_CORENAME_SYMBOLS, ctypes.c_char_p)
    name = None if function is None else function()
    return name.decode() if name else None


class CpuBackend(Backend):
    """Runs everything with numpy on the host; copies to and from the host are free."""

    name: ClassVar[str] = "cpu"
    xp = np
    needs_qualification: ClassVar[bool] = False  # numpy itself: the reference every other backend is checked against

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def to_host(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def fused(self, name: str, like: Any) -> Callable[..., Any] | None:
        # What Backend.fused gives, asked in the other order: numpy has no fused kernels, so the common answer
        # (None) comes from one lookup, without working out ``like``'s namespace (ops ask ~10 times a step).
        if type(self).kernel is Backend.kernel:  # no subclass added kernels: the answer needs no call
            return None
        kernel = self.kernel(name)
        return None if kernel is None else super().fused(name, like)

    def describe(self) -> dict[str, str]:
        return {
            "backend": "cpu",
            "device": "host",
            "numpy": np.__version__,
            "cpu_count": str(os.cpu_count()),
            "blas_core": _described_core(),
            "blas_idle_spin": _described_spin(),
        }


def _described_spin() -> str:
    """How long an idle OpenBLAS worker spins, as OpenBLAS read it when numpy loaded (see neuroflow.blas_idle)."""
    exponent = openblas_thread_timeout()
    if exponent is None:
        return "unknown"
    if exponent == 0:
        return "2^28 ticks (OpenBLAS's default)"
    return f"2^{min(max(exponent, 4), 30)} ticks (OPENBLAS_THREAD_TIMEOUT={exponent})"


def _described_core() -> str:
    core = blas_core() or "unknown"
    forced = os.environ.get("OPENBLAS_CORETYPE")
    return f"{core} (OPENBLAS_CORETYPE={forced})" if forced else core
