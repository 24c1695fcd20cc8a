"""Transposing copies (transpose.py, the tiled kernel elementwise copies take) against numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

DTYPES = [np.float32, np.float64, np.int32, np.int64]
# whole tiles, ragged edges on either side, one tile exactly, and the MLP's first weight
SHAPES = [(32, 48), (17, 33), (16, 16), (100, 37), (128, 784)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_copy_of_a_transposed_view(xp: Any, dtype: Any, shape: tuple[int, int]) -> None:
    host = (np.random.default_rng(0).standard_normal(shape) * 100).astype(dtype)
    np.testing.assert_array_equal(xp.asarray(host).T.copy().get(), host.T)


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
def test_between_views_at_offsets_leaves_the_rest(xp: Any, dtype: Any) -> None:
    rng = np.random.default_rng(1)
    source = rng.standard_normal((40, 70)).astype(dtype)
    target = rng.standard_normal((80, 50)).astype(dtype)
    device_target = xp.asarray(target)
    device_target[3:68, 5:40] = xp.asarray(source)[2:37, 1:66].T  # offsets that no vector is aligned to
    target[3:68, 5:40] = source[2:37, 1:66].T
    np.testing.assert_array_equal(device_target.get(), target)


def test_product_of_a_transposed_weight(xp: Any) -> None:
    """``x @ W.T`` (Linear's forward) copies W transposed on CPUs before the product; at many offsets."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((64, 784), dtype=np.float32), rng.standard_normal((140, 784), dtype=np.float32)
    dx, dw = xp.asarray(x), xp.asarray(w)
    for rows in (slice(0, 128), slice(3, 131), slice(12, 140)):
        got = xp.matmul(dx, dw[rows].T).get()
        np.testing.assert_allclose(got, x @ w[rows].T, rtol=1e-4, atol=1e-3)
