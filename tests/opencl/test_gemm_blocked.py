"""The k-blocked ``rows`` GEMM (products deeper than K_BLOCK, a work-group barrier per k-slice) against numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow_opencl import gemm
from neuroflow_opencl.gemm import K_BLOCK, _blocked_sizes


@pytest.fixture(autouse=True)
def blocked_at_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """k-slices for every product deeper than K_BLOCK, however small B is (plans made afresh)."""
    monkeypatch.setattr(gemm, "K_BLOCK_ABOVE_BYTES", 0)
    monkeypatch.setattr(gemm, "_PLANS", {})


def check(xp: Any, a: np.ndarray, b: np.ndarray, rtol: float = 1e-5) -> None:
    got = xp.matmul(xp.asarray(a), xp.asarray(b)).get()
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=rtol * np.abs(expected).max())


@pytest.mark.parametrize("k", [K_BLOCK + 1, 3 * K_BLOCK, 5 * K_BLOCK + 7])
@pytest.mark.parametrize("mn", [(1, 5), (9, 33), (64, 288), (70, 17), (33, 64)])
def test_deep_products_match_numpy(xp: Any, k: int, mn: tuple[int, int]) -> None:
    m, n = mn
    rng = np.random.default_rng(k + m)
    check(xp, rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weight_gradient_layout_and_float64(xp: Any, dtype: Any) -> None:
    """gᵀ @ cols, as a convolution's weight gradient calls it: A is a transposed view."""
    rng = np.random.default_rng(1)
    g, cols = rng.standard_normal((1000, 24)).astype(dtype), rng.standard_normal((1000, 45)).astype(dtype)
    got = xp.matmul(xp.asarray(g).T, xp.asarray(cols)).get()
    np.testing.assert_allclose(got, g.T @ cols, rtol=1e-4 if dtype == np.float32 else 1e-12, atol=1e-3)


def test_batched_deep_products_into_a_strided_out(xp: Any) -> None:
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((3, 20, 300), dtype=np.float32), rng.standard_normal((3, 300, 40), dtype=np.float32)
    out = xp.zeros((3, 20, 80), np.float32)
    xp.matmul(xp.asarray(a), xp.asarray(b), out=out[:, :, ::2])
    host = out.get()
    np.testing.assert_allclose(host[:, :, ::2], a @ b, rtol=1e-4, atol=1e-3)
    assert not host[:, :, 1::2].any()


@pytest.mark.parametrize("gx, gy, nb", [(1, 1, 1), (2, 4, 1), (9, 8, 1), (1, 100, 1), (3, 3, 5)])
def test_blocked_sizes_cover_the_grid_in_whole_groups(gx: int, gy: int, nb: int) -> None:
    (sx, sy, sb), (lx, ly, lb) = _blocked_sizes(gx, gy, nb, units=2)
    assert sx >= gx and sy >= gy and sb == nb and lb == 1
    assert sx % lx == 0 and sy % ly == 0
    groups = sx // lx * sy // ly * nb
    assert groups >= min(4, gx * gy * nb)  # enough groups for both cores whenever there are enough work items


@pytest.mark.parametrize("transposed_out", [False, True])
def test_weight_gradient_into_strided_or_transposed_out(xp: Any, transposed_out: bool) -> None:
    """Both operands allow either orientation; C's rows strided either way goes through a dense product."""
    rng = np.random.default_rng(3)
    g, cols = rng.standard_normal((700, 20), dtype=np.float32), rng.standard_normal((700, 50), dtype=np.float32)
    store = xp.zeros((50, 20) if transposed_out else (20, 100), np.float32)
    out = store.T if transposed_out else store[:, ::2]
    xp.matmul(xp.asarray(g).T, xp.asarray(cols), out=out)
    np.testing.assert_allclose(out.get(), g.T @ cols, rtol=1e-4, atol=1e-3)
    if not transposed_out:
        assert not store.get()[:, 1::2].any()


def test_orientation_prefers_whole_column_blocks_then_the_narrower_product() -> None:
    from neuroflow_opencl.gemm import _transpose

    deep, dense = 5632, (288, 1)
    assert _transpose(64, 288, deep, True, True, dense, 16)  # 288×64 is narrower
    assert _transpose(32, 27, deep, True, True, (27, 1), 16)  # 27 columns need two overlapping 16-wide blocks
    assert not _transpose(512, 512, deep, True, True, (512, 1), 16)
    assert _transpose(64, 288, deep, True, False, dense, 16) and not _transpose(64, 288, deep, False, True, dense, 16)


def test_a_shallow_product_keeps_the_orientation_that_writes_its_rows_dense() -> None:
    """Transposing would need a copy of C afterwards, which costs more than it gains when k is small."""
    from neuroflow_opencl.gemm import _transpose

    assert not _transpose(128, 784, 64, True, True, (784, 1), 16)  # the MLP's first weight gradient
    assert _transpose(128, 784, 64, True, True, (1, 128), 16)  # into a transposed C, transposing writes it dense
