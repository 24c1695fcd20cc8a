"""Blocked float sums on any array namespace: per-channel and per-row reductions that keep float32's digits.

A float32 sum taken one element after another (numpy's reduction over a
non-contiguous axis, a GEMV against a vector of ones, an OpenCL GEMM's
k-loop) errs by up to n·u for n terms (u = 2⁻²⁴) and, for values with a
mean, by about √n·u in practice: 1e-5 relative for a BatchNorm statistic
over N·H·W = 131,072 values, where pairwise summation (⌈log₂ n⌉·u at worst)
gives 1e-7. These sums split a long axis into b blocks of k elements and add
in two stages, each one product against ones (``einsum`` for a sum of
products): no term passes through more than about b + k additions (2√n for
rows, k ≈ √n), and the errors measured are pairwise summation's. Rows up to
:data:`SEQUENTIAL_LIMIT` and contiguous axes up to :data:`CONTIGUOUS_BLOCK`
are summed in one product.

Why blocks rather than a float64 accumulator: on numpy (OpenBLAS, one and
two threads) the blocked sums take what a one-stage GEMV or ``einsum`` takes,
±5 %; ``sum(dtype=float64)`` and ``einsum(dtype=float64)`` took 4–10×
as long. Every name used exists on numpy, CuPy and NeuroFlow's OpenCL
namespace (``matmul`` with a vector, ``einsum`` with an explicit spec,
``ones``, ``copyto``), so one code path serves every backend; the OpenCL
namespace's own ``sum``/``mean``/``einsum`` walk each output's elements in one
work item (split into partial sums when outputs are few) and accumulate in
double where the device has it, but its GEMM, which served the one-stage
sums, accumulates in float.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

#: Rows up to this many are summed in one stage (one product against ones), as numpy's pairwise sum adds
#: blocks of 128 in sequence.
SEQUENTIAL_LIMIT = 128
#: Elements per block along a contiguous axis, summed by vectorised kernels with several accumulators (numpy's
#: einsum, OpenBLAS's GEMV): longer blocks there cost less (0.45 ms instead of 0.55 for 128 per block on
#: a (32, 32, 4096) map, one thread) for the same error.
CONTIGUOUS_BLOCK = 512

_ones: dict[tuple[int, str], Any] = {}


def ones(xp: Any, n: int, dtype: Any) -> Any:
    """A read-only-by-convention vector of ``n`` ones, shared and grown as needed."""
    key = (id(xp), np.dtype(dtype).str)
    held = _ones.get(key)
    if held is None or held.shape[0] < n:
        held = xp.ones(max(n, 1), dtype=dtype)
        _ones[key] = held
    return held[:n]


@functools.lru_cache(maxsize=512)
def blocks(n: int, longest: int) -> tuple[int, int]:
    """(b, k): b blocks of k ≤ ``longest`` elements for an axis of ``n``.

    k is the largest divisor of n up to ``longest`` when one lies within a
    factor 4 of it (then no element is left over and the blocks are a view);
    otherwise k = ``longest`` and the n − b·k elements left over are summed
    as one more, shorter block.
    """
    for k in range(longest, max(longest // 4, 1) - 1, -1):
        if n % k == 0:
            return n // k, k
    return n // longest, longest


def _rows_block(m: int) -> int:
    """Rows per block for a sum over rows: about √m, so both stages add about √m terms in sequence."""
    return max(math.isqrt(m), 1)


def _last_block(s: int) -> int:
    """Elements per block along a contiguous last axis: long blocks (vectorised inner products) up to √s."""
    return max(CONTIGUOUS_BLOCK, math.isqrt(s))


def sum_rows_call(xp: Any, a: Any, out: Any) -> Callable[[], Any]:
    """``sum_rows(xp, a, out=out)`` as a call to repeat on the same arrays (a replayed step's, see
    :mod:`neuroflow.replay`): the one-stage product itself when ``a`` has few rows."""
    if a.shape[-2] <= SEQUENTIAL_LIMIT:
        return functools.partial(xp.matmul, ones(xp, a.shape[-2], a.dtype), a, out=out)
    return functools.partial(sum_rows, xp, a, out=out)


def sum_rows(xp: Any, a: Any, out: Any = None) -> Any:
    """Σ over axis −2 of ``a`` (…, M, C): per column, for a stack of (M, C) matrices; shape (…, C)."""
    m, c = a.shape[-2], a.shape[-1]
    if m <= SEQUENTIAL_LIMIT:
        return xp.matmul(ones(xp, m, a.dtype), a, out=out)
    b, k = blocks(m, _rows_block(m))
    lead = a.shape[:-2]
    head = a[..., : b * k, :]
    if a.strides[-2] == c * a.strides[-1]:
        # Dense rows: stage 1 adds row j of every block (rows j, j + k, …) in one GEMV over the blocks
        # viewed as rows of k·C, stage 2 the k sums.
        per_row = xp.matmul(ones(xp, b, a.dtype), head.reshape(*lead, b, k * c)).reshape(*lead, k, c)
        total = xp.matmul(ones(xp, k, a.dtype), per_row, out=out)
    else:  # rows that are a slice of wider ones: one GEMV per block, then one over the blocks' sums
        per_block = xp.matmul(ones(xp, k, a.dtype), head.reshape(*lead, b, k, c))
        total = xp.matmul(ones(xp, b, a.dtype), per_block, out=out)
    if b * k < m:
        total += xp.matmul(ones(xp, m - b * k, a.dtype), a[..., b * k:, :])
    return total


def sum_last(xp: Any, a: Any, out: Any = None) -> Any:
    """Σ over the last axis of ``a``: shape ``a.shape[:-1]``."""
    s = a.shape[-1]
    if s <= CONTIGUOUS_BLOCK:
        return xp.matmul(a, ones(xp, s, a.dtype), out=out)
    b, k = blocks(s, _last_block(s))
    lead = a.shape[:-1]
    # One GEMV per stage over all rows (a copy first where a left-over block breaks the view of the blocks).
    per_block = xp.matmul(a[..., : b * k].reshape(-1, k), ones(xp, k, a.dtype))
    total = xp.matmul(per_block.reshape(-1, b), ones(xp, b, a.dtype)).reshape(lead)
    if b * k < s:
        total += xp.matmul(a[..., b * k:], ones(xp, s - b * k, a.dtype))
    if out is None:
        return total
    xp.copyto(out, total)
    return out


def sum_channels(xp: Any, a: Any, out: Any = None) -> Any:
    """Σ over axes 0 and 2 of an (N, C, S) array (NCHW maps viewed with S = H·W): a (C,) vector."""
    return sum_rows(xp, sum_last(xp, a), out=out)


def dot_rows(xp: Any, a: Any, b: Any, out: Any = None) -> Any:
    """Σ over axis 0 of ``a·b`` for two (M, C) arrays, without a temporary of their size: a (C,) vector."""
    m, c = a.shape
    if m <= SEQUENTIAL_LIMIT:
        return xp.einsum("mc,mc->c", a, b, out=out)
    nb, k = blocks(m, _rows_block(m))
    # Stage 1: row j of every block, as for sum_rows, in one einsum; stage 2: the k rows of those sums.
    per_row = xp.einsum("bkc,bkc->kc", a[: nb * k].reshape(nb, k, c), b[: nb * k].reshape(nb, k, c))
    total = sum_rows(xp, per_row, out=out)
    if nb * k < m:
        total += xp.einsum("mc,mc->c", a[nb * k:], b[nb * k:])
    return total


def dot_channels(xp: Any, a: Any, b: Any, out: Any = None) -> Any:
    """Σ over axes 0 and 2 of ``a·b`` for two (N, C, S) arrays: a (C,) vector."""
    s = a.shape[2]
    if s <= CONTIGUOUS_BLOCK:
        return sum_rows(xp, xp.einsum("ncs,ncs->nc", a, b), out=out)
    nb, k = blocks(s, _last_block(s))
    n, c = a.shape[:2]
    # Each sample's S = nb·k products: k at a time in one einsum, their nb sums in a second stage.
    per_block = xp.einsum("ncbk,ncbk->ncb", a[..., : nb * k].reshape(n, c, nb, k), b[..., : nb * k].reshape(n, c, nb, k))
    per_sample = sum_last(xp, per_block)
    if nb * k < s:
        per_sample += xp.einsum("ncs,ncs->nc", a[..., nb * k:], b[..., nb * k:])
    return sum_rows(xp, per_sample, out=out)
