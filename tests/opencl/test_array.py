"""ClArray views, copies and integer-array indexing against numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided


def test_gather_and_scatter_with_row_and_column_indices(xp: Any) -> None:
    host = np.arange(20, dtype=np.float32).reshape(4, 5)
    rows, cols = np.array([3, 0, -1, 2]), np.array([1, 4, 0, -5])
    a = xp.asarray(host)
    np.testing.assert_array_equal(a[rows, cols].get(), host[rows, cols])
    np.testing.assert_array_equal(a[xp.asarray(rows), xp.asarray(cols)].get(), host[rows, cols])
    np.testing.assert_array_equal(a[[2, 0]].get(), host[[2, 0]])  # whole rows: the trailing axis is copied
    np.testing.assert_array_equal(a.T[np.array([4, 1])].get(), host.T[[4, 1]])  # rows of a strided view
    a[rows, cols] -= np.array([1, 2, 3, 4], np.float32)
    host[rows, cols] -= np.array([1, 2, 3, 4], np.float32)
    np.testing.assert_array_equal(a.get(), host)
    a[np.array([0, 0, 1]), np.array([2, 2, 3])] = xp.asarray(np.array([7, 8, 9], np.float32))
    host[[0, 0, 1], [2, 2, 3]] = [7, 8, 9]  # with a repeated index the last write wins
    np.testing.assert_array_equal(a.get(), host)
    a[[1, 3]] = 0.5
    host[[1, 3]] = 0.5
    np.testing.assert_array_equal(a.get(), host)


def test_gather_broadcasts_index_arrays(xp: Any) -> None:
    host = np.arange(12, dtype=np.int64).reshape(3, 4)
    rows, cols = np.array([[0], [2]]), np.array([1, 3, 0])
    np.testing.assert_array_equal(xp.asarray(host)[rows, cols].get(), host[rows, cols])


def test_take_along_axis_matches_numpy(xp: Any) -> None:
    rng = np.random.default_rng(0)
    host = rng.standard_normal((4, 6)).astype(np.float32)
    labels = rng.integers(0, 6, (4, 1))
    np.testing.assert_array_equal(xp.take_along_axis(xp.asarray(host), xp.asarray(labels), axis=1).get(),
                                  np.take_along_axis(host, labels, axis=1))
    order = np.argsort(host, axis=0)
    np.testing.assert_array_equal(xp.take_along_axis(xp.asarray(host), xp.asarray(order), axis=0).get(),
                                  np.take_along_axis(host, order, axis=0))
    with pytest.raises(ValueError, match="same number of dimensions"):
        xp.take_along_axis(xp.asarray(host), xp.asarray(labels[:, 0]), axis=1)


def test_concatenate_with_and_without_out(xp: Any) -> None:
    parts = [np.full((2, k, 3), k, np.float32) for k in (1, 2, 3)]
    expected = np.concatenate(parts, axis=1)
    np.testing.assert_array_equal(xp.concatenate([xp.asarray(p) for p in parts], axis=1).get(), expected)
    out = xp.zeros((2, 6, 3))
    assert xp.concatenate([xp.asarray(p) for p in parts], axis=-2, out=out) is out
    np.testing.assert_array_equal(out.get(), expected)
    mixed = xp.concatenate([xp.asarray(np.ones(2, np.int64)), xp.asarray(np.zeros(1, np.float32))])
    assert mixed.dtype == np.float64 and mixed.get().tolist() == [1, 1, 0]
    with pytest.raises(ValueError, match=r"output has shape \(2, 5, 3\); expected \(2, 6, 3\)"):
        xp.concatenate([xp.asarray(p) for p in parts], axis=1, out=xp.zeros((2, 5, 3)))
    with pytest.raises(ValueError, match="dimensions except for the concatenation axis must match"):
        xp.concatenate([xp.zeros((2, 3)), xp.zeros((3, 3))], axis=1)


def test_copyto_from_strided_views(xp: Any) -> None:
    host = np.arange(24, dtype=np.float32).reshape(4, 6)
    dst = xp.zeros((3, 4))
    xp.copyto(dst, xp.asarray(host)[::-1, ::2].T[::-1])
    np.testing.assert_array_equal(dst.get(), host[::-1, ::2].T[::-1])
    xp.copyto(dst[:, 1], xp.asarray(np.array([9.0, 8.0, 7.0], np.float32)))
    assert dst.get()[:, 1].tolist() == [9, 8, 7]
    xp.copyto(dst, xp.asarray(np.arange(4, dtype=np.int64)))  # broadcast and cast
    np.testing.assert_array_equal(dst.get(), np.tile(np.arange(4, dtype=np.float32), (3, 1)))


def test_as_strided_windows_match_numpys_im2col(xp: Any) -> None:
    rng = np.random.default_rng(1)
    n, h, w, c, k = 2, 6, 7, 3, 3
    host = rng.standard_normal((n, h, w, c)).astype(np.float32)
    s0, s1, s2, s3 = host.strides
    shape, strides = (n, h - k + 1, w - k + 1, k, k, c), (s0, s1, s2, s1, s2, s3)
    windows = as_strided(host, shape, strides)
    device = xp.asarray(host)
    assert device.strides == host.strides
    got = xp.lib.stride_tricks.as_strided(device, shape=shape, strides=strides)
    np.testing.assert_array_equal(got.get(), windows)
    weights = rng.standard_normal((k * k * c, 4)).astype(np.float32)
    columns = got.reshape(-1, k * k * c)  # overlapping windows: the reshape must copy
    np.testing.assert_allclose((columns @ xp.asarray(weights)).get(), windows.reshape(-1, k * k * c) @ weights,
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="not multiples of the item size 4"):
        device.as_strided((2,), (6,))


def test_reshape_copies_non_contiguous_views_and_views_the_rest(xp: Any) -> None:
    host = np.arange(12, dtype=np.float32).reshape(3, 4)
    a = xp.asarray(host)
    flat_t = a.T.reshape(-1)
    np.testing.assert_array_equal(flat_t.get(), host.T.reshape(-1))
    flat_t += 100  # a copy: the original is unchanged, as with numpy
    np.testing.assert_array_equal(a.get(), host)
    split = a.T.reshape(2, 2, 3)  # splitting the transposed array's leading axis needs no copy
    assert split.buffer is a.buffer
    split[0] -= 1
    expected = host.copy()
    expected.T.reshape(2, 2, 3)[0] -= 1
    np.testing.assert_array_equal(a.get(), expected)
    dense = a[1:].reshape(4, 2)
    dense[0, 0] = -5
    assert a.get()[1, 0] == -5 and a.ravel().shape == (12,) and a.reshape((6, -1)).shape == (6, 2)
    assert a.T.flags.c_contiguous is False and a.flags.c_contiguous and a[:1].T.is_contiguous


def test_view_of_a_byte_block_as_typed_arrays(xp: Any) -> None:
    block = xp.zeros((64,), np.uint8)
    floats = block[16:48].view(np.float32)
    assert floats.shape == (8,) and floats.offset == 4
    floats[...] = xp.asarray(np.linspace(-1, 1, 8, dtype=np.float32))
    host = block.get()
    np.testing.assert_array_equal(host[16:48].view(np.float32), np.linspace(-1, 1, 8, dtype=np.float32))
    assert not host[:16].any() and not host[48:].any()
    ints = block[:16].view(np.int64)
    assert ints.get().tolist() == [0, 0]
    with pytest.raises(ValueError, match="byte offset 2 of 8 bytes cannot be read as float32"):
        block[2:10].view(np.float32)
    with pytest.raises(ValueError, match="only a dense array"):
        block[::2].view(np.float32)


def test_basic_indexing_and_transposes_are_views(xp: Any) -> None:
    host = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    a = xp.asarray(host)
    for key in [(1,), (slice(None, None, -1), 2), (Ellipsis, 3), (None, 0, slice(1, 4, 2)), (-1, -2, -3)]:
        np.testing.assert_array_equal(a[key].get(), host[key])
    np.testing.assert_array_equal(a.transpose(1, 2, 0).get(), host.transpose(1, 2, 0))
    np.testing.assert_array_equal(a.swapaxes(0, 2).get(), host.swapaxes(0, 2))
    a[1, ::2] = 0
    host[1, ::2] = 0
    np.testing.assert_array_equal(a.get(), host)
    assert a[0, 1].data.ptr - a.data.ptr == 5 * 4  # virtual addresses move with the view's offset
