"""neuroflow.backends.reductions: blocked float32 sums equal float64 sums to pairwise summation's bound, on every
backend, for every shape they are handed (short axes, left-over blocks, strided rows, stacks).

The bound: pairwise summation of n terms errs by at most ⌈log₂ n⌉·u·Σ|xᵢ| (u = eps/2, to first order). The
tests allow ``log2(n)·eps`` relative to the float64 sum of values with |mean| = std, twice that worst case; a
sequential float32 sum of n = 131,072 such values (numpy's sum over a non-contiguous axis, a GEMV against
ones) errs by ~√n·u ≈ 1e-5, the blocked sums by ~1e-7.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from neuroflow.backends import reductions

EPS32 = float(np.finfo(np.float32).eps)


def _error(got: Any, want: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(got, np.float64) - want) / np.abs(want)))


def _values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) + 1.0).astype(np.float32)


@pytest.mark.parametrize("rows", [7, 128, 129, 1000, 4099, 131_072, 131_071])
def test_sum_rows_and_dot_rows_meet_the_pairwise_bound(rows: int, nf_backend: Any) -> None:
    """Short axes (one stage), blocks that divide the rows, and a left-over block (131,071 is prime)."""
    a = _values(np.random.default_rng(rows), (rows, 6))
    b = _values(np.random.default_rng(rows + 1), (rows, 6))
    xp, device_a, device_b = nf_backend.xp, nf_backend.from_host(a), nf_backend.from_host(b)
    bound = max(math.log2(rows), 1.0) * EPS32
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    assert _error(nf_backend.to_host(reductions.sum_rows(xp, device_a)), a64.sum(0)) <= bound
    assert _error(nf_backend.to_host(reductions.dot_rows(xp, device_a, device_b)), (a64 * b64).sum(0)) <= bound


@pytest.mark.parametrize("length", [5, 512, 513, 4096, 65_536, 100_003])
def test_sum_last_sum_channels_and_dot_channels_meet_the_pairwise_bound(length: int, nf_backend: Any) -> None:
    """(N, C, S) maps: the contiguous axis in one stage up to 512, in blocks beyond, with a left-over block
    for a prime S."""
    a = _values(np.random.default_rng(length), (2, 3, length))
    b = _values(np.random.default_rng(length + 1), (2, 3, length))
    xp, device_a, device_b = nf_backend.xp, nf_backend.from_host(a), nf_backend.from_host(b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = math.log2(2 * length) * EPS32
    assert _error(nf_backend.to_host(reductions.sum_last(xp, device_a)), a64.sum(2)) <= bound
    assert _error(nf_backend.to_host(reductions.sum_channels(xp, device_a)), a64.sum((0, 2))) <= bound
    assert _error(nf_backend.to_host(reductions.dot_channels(xp, device_a, device_b)), (a64 * b64).sum((0, 2))) <= bound


def test_sum_rows_of_strided_rows_and_of_a_stack(nf_backend: Any) -> None:
    """Rows that are a slice of wider ones (a GRU's first two gates) and a stack of (M, C) matrices (a global
    average pool's samples), each into ``out``."""
    rng = np.random.default_rng(0)
    wide = _values(rng, (20_000, 12))
    stack = _values(rng, (3, 20_000, 4))
    xp = nf_backend.xp
    sliced = nf_backend.from_host(wide)[:, 2:10]
    out = nf_backend.from_host(np.zeros(8, np.float32))
    assert reductions.sum_rows(xp, sliced, out=out) is out
    bound = math.log2(20_000) * EPS32
    assert _error(nf_backend.to_host(out), wide[:, 2:10].astype(np.float64).sum(0)) <= bound
    out = nf_backend.from_host(np.zeros((3, 4), np.float32))
    reductions.sum_rows(xp, nf_backend.from_host(stack), out=out)
    assert _error(nf_backend.to_host(out), stack.astype(np.float64).sum(1)) <= bound


def test_a_sequential_sum_misses_the_bound_the_blocked_one_meets() -> None:
    """The reason for the blocks: numpy's sum over rows, one row after another, errs ~5× past the bound
    (a GEMV against ones, as the ops summed before, ~2×)."""
    a = _values(np.random.default_rng(0), (131_072, 64))
    want = a.astype(np.float64).sum(0)
    bound = math.log2(131_072) * EPS32
    assert _error(a.sum(axis=0), want) > 3 * bound
    assert _error(reductions.sum_rows(np, a), want) < bound / 3


def test_blocks_divide_the_axis_when_they_can() -> None:
    assert reductions.blocks(131_072, 362) == (512, 256)
    assert reductions.blocks(784, 512) == (2, 392)
    assert reductions.blocks(131_071, 362) == (362, 362)  # prime: 131,071 − 362² = 7 left over
