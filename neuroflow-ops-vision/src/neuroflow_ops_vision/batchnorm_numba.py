"""BatchNorm2d kernels compiled by numba, for NHWC maps viewed as (M, C) rows: statistics, output, gradient.

numpy takes a BatchNorm2d step in many passes over memory: Σx and Σx² (two
reads), the output (three in-cache passes per block), and in backward the
ReLU mask, the masked gradient, Σg, Σg·x and the input gradient (each a pass,
two of them writing map-sized workspaces). These loops take the forward in
two passes (statistics, output) and the backward in two (statistics of the
masked gradient, input gradient), the mask read from the output as they go:
no workspace of the map's size.

Per-channel sums accumulate in float64, over fixed blocks of
:data:`ROWS_PER_BLOCK` rows whose partial sums are then added in order: a
float32 statistic keeps all its digits however many values it is over, and
the result does not depend on how many threads took the blocks. Row passes
write each row from one chunk only. Every kernel releases the GIL, so
:mod:`neuroflow.backends.cpu_parallel` splits blocks and rows between the
cores.

Importing this module imports numba; BatchNorm2d imports it at its first NHWC
call (see :mod:`neuroflow_ops_vision.compiled`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from neuroflow.backends.cpu_parallel import for_chunks
from neuroflow_ops_vision import compiled
from neuroflow_ops_vision.workspace import scratch

#: Rows per partial sum: the partial sums of a (16, 48, 48, 32) map take 74 KB, and a block's 8,192 values
#: (at 32 channels) are a few microseconds of work.
ROWS_PER_BLOCK = 256

#: where the sums take their workspace: a ``Workspace``'s call, ``ws(role, shape, dtype)``
Workspaces = Callable[[str, tuple[int, ...], Any], np.ndarray]
#: the kernels' 0 per dtype, as a one-element array (numba keeps the maps' dtype where a Python 0 would widen it)
_ZERO = {np.dtype(t): np.zeros(1, t) for t in (np.float32, np.float64)}

# Every kernel is compiled with nogil=True (cpu_parallel's threads run chunks at once) and cache=True (compiled
# once per machine, in __pycache__ or NUMBA_CACHE_DIR, not once per process).


@numba.njit(nogil=True, cache=True)
def block_sums(u: Any, v: Any, y: Any, masked: bool, rows: int, first: int, stop: int, sums: Any,
               dots: Any) -> None:  # pragma: no cover
    """Σu and Σu·v per channel of each block of ``rows`` rows of the (M, C) arrays, blocks [first, stop), block b's
    into row b of ``sums`` and ``dots`` (float64); with ``masked``, u counts only where ``y`` is positive (the
    fused ReLU's gradient). Σx and Σx² are ``block_sums(x, x, ...)``."""
    m, c = u.shape
    for b in range(first, stop):
        s, d = sums[b], dots[b]
        s[:] = 0.0
        d[:] = 0.0
        for r in range(b * rows, min((b + 1) * rows, m)):
            urow, vrow, yrow = u[r], v[r], y[r]
            for k in range(c):
                value = np.float64(urow[k]) if not masked or yrow[k] > 0 else 0.0
                s[k] += value
                d[k] += value * np.float64(vrow[k])


@numba.njit(nogil=True, cache=True)
def normalise_rows(x: Any, centre: Any, scale: Any, shift: Any, floor: Any, y: Any, lo: int,
                   hi: int) -> None:  # pragma: no cover
    """y = x·scale + shift (x − centre first where ``centre`` has C values) per channel, at least ``floor[0]`` where
    ``floor`` has a value (the fused ReLU's 0: NaN stays NaN, as numpy's maximum keeps it), for rows [lo, hi)."""
    c = x.shape[1]
    centred, clamp = centre.shape[0] > 0, floor.shape[0] > 0
    for r in range(lo, hi):
        src, dst = x[r], y[r]
        if centred:
            for k in range(c):
                dst[k] = (src[k] - centre[k]) * scale[k] + shift[k]
        else:
            for k in range(c):
                dst[k] = src[k] * scale[k] + shift[k]
        if clamp:
            zero = floor[0]
            for k in range(c):
                v = dst[k]
                dst[k] = zero if v < zero else v


@numba.njit(nogil=True, cache=True)
def gradient_rows(g: Any, y: Any, x: Any, masked: bool, a: Any, b: Any, c: Any, floor: Any, gx: Any, lo: int,
                  hi: int) -> None:  # pragma: no cover
    """gx = (x·b + c) + g·a per channel for rows [lo, hi), g taken as ``floor[0]`` (0) where ``masked`` and the
    output ``y`` is not positive: the input gradient of a batch-statistics BatchNorm (see BatchNorm2d.backward)."""
    channels = x.shape[1]
    zero = floor[0]
    for r in range(lo, hi):
        grow, xrow, yrow, out = g[r], x[r], y[r], gx[r]
        for k in range(channels):
            gk = grow[k] if not masked or yrow[k] > 0 else zero
            out[k] = (xrow[k] * b[k] + c[k]) + gk * a[k]


def _sums(u: np.ndarray, v: np.ndarray, y: np.ndarray | None, ws: Workspaces) -> tuple[np.ndarray, np.ndarray]:
    """Σu and Σu·v per channel (float64) of (M, C) arrays, u masked by ``y`` where given: :func:`block_sums` into a
    workspace of ``ws`` (two sums per channel per block of rows) over the blocks split between the threads, then the
    blocks' sums added in order."""
    m, c = u.shape
    partial = ws("batchnorm.partial", (2, -(-m // ROWS_PER_BLOCK), c), np.float64)
    masked, y = y is not None, u if y is None else y

    def run(lo: int, hi: int) -> None:
        block_sums(u, v, y, masked, ROWS_PER_BLOCK, lo, hi, partial[0], partial[1])

    for_chunks(partial.shape[1], run, (3 if masked else 2) * u.size)
    return partial[0].sum(axis=0), partial[1].sum(axis=0)


def statistics(x: np.ndarray, ws: Workspaces) -> tuple[np.ndarray, np.ndarray]:
    """Σx and Σx² per channel of ``x`` (M, C), C-contiguous, as float64 vectors (their blocks' sums in ``ws``)."""
    return _sums(x, x, None, ws)


def normalise(x: np.ndarray, centre: np.ndarray | None, scale: np.ndarray, shift: np.ndarray, relu: bool,
              y: np.ndarray) -> None:
    """``y`` = the BatchNorm output of ``x`` (both (M, C), C-contiguous) with per-channel ``scale`` and ``shift``
    of their dtype, from ``x − centre`` where ``centre`` is given, through the fused ReLU with ``relu``."""
    empty = scale[:0]
    floor = _ZERO[y.dtype] if relu else empty
    centre = empty if centre is None else centre
    for_chunks(x.shape[0], lambda lo, hi: normalise_rows(x, centre, scale, shift, floor, y, lo, hi), 2 * x.size)


def gradient_statistics(g: np.ndarray, y: np.ndarray | None, x: np.ndarray,
                        ws: Workspaces) -> tuple[np.ndarray, np.ndarray]:
    """Σg and Σg·x per channel (float64), g masked by the fused ReLU's output ``y`` where given."""
    return _sums(g, x, y, ws)


def input_gradient(g: np.ndarray, y: np.ndarray | None, x: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray,
                   gx: np.ndarray) -> None:
    """``gx`` = a·g + b·x + c per channel (``a``, ``b``, ``c`` of the maps' dtype), g masked by ``y`` where given."""
    masked, y = y is not None, x if y is None else y
    floor = _ZERO[gx.dtype]
    for_chunks(x.shape[0], lambda lo, hi: gradient_rows(g, y, x, masked, a, b, c, floor, gx, lo, hi), 4 * x.size)


def ready(dtype: Any) -> None:
    """Compile or load the kernels for C-contiguous ``dtype`` arrays now, by running each once on a tiny map (an
    unreadable cache is rebuilt: :func:`neuroflow_ops_vision.compiled.heal_cache`)."""
    compiled.heal_cache(__name__.rsplit(".", 1)[-1], block_sums, lambda: _run_each(np.dtype(dtype)))


def _run_each(dtype: np.dtype) -> None:
    x = np.ones((3, 2), dtype)
    vector, out = np.ones(2, dtype), np.empty((3, 2), dtype)

    def ws(role: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return scratch(np, role, shape, dtype)

    statistics(x, ws)
    normalise(x, None, vector, vector, True, out)
    normalise(x, vector, vector, vector, False, out)
    gradient_statistics(x, x, x, ws)
    gradient_statistics(x, None, x, ws)
    input_gradient(x, x, x, vector, vector, vector, out)
