"""Strided elementwise kernels, which walk runs of the last dimension: run splits, windows, offsets, float64."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow_opencl.elementwise import RUN


@pytest.mark.parametrize("last", [1, 3, RUN - 1, RUN, RUN + 1, 2 * RUN + 5, 1000])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_strided_add_matches_numpy_for_every_run_split(xp: Any, last: int, dtype: Any) -> None:
    rng = np.random.default_rng(last)
    a = rng.standard_normal((5, 3, 2 * last)).astype(dtype)
    b = rng.standard_normal((3, 1)).astype(dtype)  # broadcast along the last axis: a zero stride
    got = xp.add(xp.asarray(a)[1:, :, ::2], xp.asarray(b))
    np.testing.assert_array_equal(got.get(), a[1:, :, ::2] + b)


def test_strided_store_into_a_view_leaves_the_rest_alone(xp: Any) -> None:
    host = np.arange(6 * 7 * 130, dtype=np.float32).reshape(6, 7, 130)
    dev = xp.asarray(host)
    src = np.full((3, 7, 65), -1.0, np.float32)
    dev[::2, :, 1::2] += xp.asarray(src)
    host[::2, :, 1::2] += src
    np.testing.assert_array_equal(dev.get(), host)


@pytest.mark.parametrize("channels", [1, 3, 32])
def test_window_copy_matches_numpy(xp: Any, channels: int) -> None:
    """The 7-d (N, Ho, Wo, G, kh, kw, C) window view of a padded map, copied dense: im2col."""
    x = np.random.default_rng(channels).standard_normal((2, 9, 11, channels)).astype(np.float32)
    shape = (2, 4, 5, 1, 3, 3, channels)
    sn, sh, sw, sc = (s // 4 for s in x.strides)
    strides = tuple(4 * s for s in (sn, 2 * sh, 2 * sw, channels * sc, sh, sw, sc))
    expected = np.lib.stride_tricks.as_strided(x, shape, strides)
    view = xp.lib.stride_tricks.as_strided(xp.asarray(x), shape=shape, strides=strides)
    col = xp.empty(shape, np.float32)
    xp.copyto(col, view)
    np.testing.assert_array_equal(col.get(), expected)


def test_gid_counts_elements_in_order_through_a_strided_output(xp: Any) -> None:
    from neuroflow_opencl import elementwise

    out = xp.zeros((4, 150), np.float64)
    elementwise.run(out[:, ::2], "a0 + gid * a1", (1.0, 0.5), np.float64)
    expected = np.zeros((4, 150))
    expected[:, ::2] = 1.0 + 0.5 * np.arange(300.0).reshape(4, 75)
    np.testing.assert_array_equal(out.get(), expected)


def test_empty_strided_operands_are_a_no_op(xp: Any) -> None:
    a = xp.zeros((4, 5), np.float32)
    got = xp.add(a[::2, 2:2], a[1::2, 2:2])
    assert got.get().shape == (2, 0)
    b = xp.zeros((0, 4), np.float32)
    assert xp.multiply(b[:, ::2], 2.0).get().shape == (0, 2)
