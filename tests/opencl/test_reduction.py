"""Reductions, arg-reductions and contractions (einsum, dot) on the opencl namespace against numpy."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

KINDS = ("sum", "mean", "max", "min", "any", "all")
AXES = [None, (), *(c for r in (1, 2, 3) for c in itertools.combinations(range(3), r)), -1, (-1, 0)]


def samples(dtype: Any, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-4, 5, shape).astype(dtype)
    # magnitudes below 1 too: any/all must test the value, not its integer part
    return rng.uniform(-2, 2, shape).astype(dtype)


def assert_same(got: Any, expected: Any, rtol: float = 1e-5) -> None:
    host = got.get()
    expected = np.asarray(expected)
    assert host.shape == expected.shape and host.dtype == expected.dtype, (host.dtype, expected.dtype)
    np.testing.assert_allclose(host, expected, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
@pytest.mark.parametrize("kind", KINDS)
def test_every_axis_combination_with_and_without_keepdims(xp: Any, kind: str, dtype: Any) -> None:
    rng = np.random.default_rng(0)
    host = samples(dtype, (3, 4, 5), rng)
    strided = host.transpose(2, 0, 1)[::-1, :, 1:]  # a view that walks memory backwards and with gaps
    device = xp.asarray(host).transpose(2, 0, 1)[::-1, :, 1:]
    for axis, keepdims in itertools.product(AXES, (False, True)):
        expected = getattr(np, kind)(strided, axis=axis, keepdims=keepdims)
        assert_same(getattr(xp, kind)(device, axis=axis, keepdims=keepdims), expected)
        assert_same(getattr(device, kind)(axis=axis, keepdims=keepdims), expected)


@pytest.mark.parametrize("kind", KINDS)
def test_out_receives_the_result_in_a_strided_view(xp: Any, kind: str) -> None:
    host = samples(np.float32, (4, 6), np.random.default_rng(1))
    dtype = np.bool_ if kind in ("any", "all") else np.float32
    out = xp.zeros((6, 3), dtype)
    result = getattr(xp, kind)(xp.asarray(host), axis=0, out=out[:, 1])
    assert result.shape == (6,)
    expected = np.zeros((6, 3), dtype)
    expected[:, 1] = getattr(np, kind)(host, axis=0)
    np.testing.assert_allclose(out.get(), expected, rtol=1e-6)
    keep = xp.zeros((1, 6), dtype)
    getattr(xp, kind)(xp.asarray(host), axis=0, keepdims=True, out=keep)
    np.testing.assert_allclose(keep.get(), getattr(np, kind)(host, axis=0, keepdims=True), rtol=1e-6)


def test_large_reductions_take_the_two_stage_path_and_stay_accurate(xp: Any) -> None:
    from neuroflow_opencl import reduction

    host = np.random.default_rng(2).standard_normal((65536, 8)).astype(np.float32)
    device = xp.asarray(host)
    assert reduction._parts(8, 65536, device.device) > 1  # the split this test is about
    exact = host.astype(np.float64)
    np.testing.assert_allclose(xp.sum(device, axis=0).get(), exact.sum(axis=0), rtol=1e-6, atol=1e-4)
    np.testing.assert_allclose(xp.mean(device, axis=0).get(), exact.mean(axis=0), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(xp.max(device, axis=0).get(), host.max(axis=0))
    np.testing.assert_array_equal(xp.min(device, axis=0).get(), host.min(axis=0))
    assert float(device.sum()) == pytest.approx(exact.sum(), rel=1e-6, abs=1e-3)
    positive = xp.asarray(np.abs(host) + 0.25)
    assert bool(positive.all()) and not bool((positive < 0).any())
    out = xp.zeros((8, 2)).T  # a strided destination for the second stage
    xp.sum(device, axis=0, out=out[1])
    np.testing.assert_allclose(out.get(), np.stack([np.zeros(8), exact.sum(axis=0)]), rtol=1e-6, atol=1e-4)


def test_argmax_and_argmin_return_the_first_extreme(xp: Any) -> None:
    ties = np.array([[1, 3, 3, 0], [2, 2, 1, 2], [0, 0, 0, 0]], np.float32)
    device = xp.asarray(ties)
    for name, axis, keepdims in itertools.product(("argmax", "argmin"), (None, 0, 1, -1), (False, True)):
        got = getattr(xp, name)(device, axis=axis, keepdims=keepdims)
        expected = getattr(np, name)(ties, axis=axis, keepdims=keepdims)
        assert got.dtype == np.int64
        np.testing.assert_array_equal(got.get(), expected)
    assert int(xp.argmax(device)) == 1 and int(device.T.argmax()) == 3  # flattened in C order of the view
    nan = xp.asarray(np.array([1, np.nan, 5, np.nan], np.float32))
    assert int(nan.argmax()) == int(nan.argmin()) == 1  # numpy: the first NaN wins
    assert np.isnan(float(nan.max())) and np.isnan(float(nan.min()))
    out = xp.zeros((4,), np.int64)
    xp.argmax(device, axis=0, out=out)
    np.testing.assert_array_equal(out.get(), [1, 0, 0, 1])


@given(hnp.arrays(np.int64, hnp.array_shapes(min_dims=1, max_dims=3, max_side=5), elements=st.integers(-3, 3)),
       st.data())
@settings(max_examples=40, deadline=None)
def test_arg_reductions_of_integers_match_numpy(xp: Any, host: np.ndarray, data: Any) -> None:
    axis = data.draw(st.integers(-host.ndim, host.ndim - 1))
    device = xp.asarray(host)
    for name in ("argmax", "argmin"):
        np.testing.assert_array_equal(getattr(device, name)(axis=axis).get(), getattr(host, name)(axis=axis))


def test_mean_of_integers_is_float64_and_sum_of_bools_counts(xp: Any) -> None:
    ints = np.arange(10, dtype=np.int64).reshape(2, 5)
    assert_same(xp.mean(xp.asarray(ints), axis=1), ints.mean(axis=1))
    assert_same(xp.asarray(ints.astype(np.int32)).mean(), ints.mean())
    flags = ints % 3 == 0
    assert_same(xp.sum(xp.asarray(flags)), flags.sum())
    assert_same(xp.asarray(ints.astype(np.uint8)).sum(axis=0), ints.astype(np.uint8).sum(axis=0))


def test_empty_reductions_behave_like_numpy(xp: Any) -> None:
    empty = xp.zeros((0, 3))
    assert_same(empty.sum(axis=0), np.zeros(3, np.float32))
    assert_same(xp.zeros((3, 0)).any(axis=1), np.zeros(3, bool))
    with pytest.raises(ValueError, match="zero-size array to reduction operation max which has no identity"):
        empty.max(axis=0)
    with pytest.raises(ValueError, match="attempt to get argmax of an empty sequence"):
        empty.argmax()


@pytest.mark.parametrize(("spec", "shapes"), [
    ("mc,mc->c", [(37, 6), (37, 6)]),
    ("ncs,ncs->c", [(3, 4, 25), (3, 4, 25)]),
    ("nhwc,nhwcm->cm", [(2, 3, 3, 4), (2, 3, 3, 4, 2)]),
    ("nhwcm,cm->nhwc", [(2, 3, 3, 4, 2), (4, 2)]),
    ("i,i->", [(17,), (17,)]),
    ("ij,jk->ik", [(5, 3), (3, 4)]),
])
def test_einsum_specs_used_by_the_ops(xp: Any, spec: str, shapes: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(3)
    hosts = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    expected = np.einsum(spec, *hosts)
    assert_same(xp.einsum(spec, *(xp.asarray(h) for h in hosts)), expected)
    # on strided operands (reversed views) and into a strided out=
    flipped = [h[::-1] for h in hosts]
    out = xp.zeros((*expected.shape, 2), np.float32)[..., 1]
    xp.einsum(spec, *(xp.asarray(h)[::-1] for h in hosts), out=out)
    np.testing.assert_allclose(out.get(), np.einsum(spec, *flipped), rtol=1e-5, atol=1e-5)


def test_einsum_broadcasts_size_one_axes(xp: Any) -> None:
    a = np.arange(6, dtype=np.float32).reshape(1, 6)
    b = np.arange(18, dtype=np.float32).reshape(3, 6)
    assert_same(xp.einsum("mc,mc->c", xp.asarray(a), xp.asarray(b)), np.einsum("mc,mc->c", a, b))


def test_dot_of_vectors_and_matrices(xp: Any) -> None:
    rng = np.random.default_rng(4)
    u, v, m = (rng.standard_normal(s).astype(np.float32) for s in ((9,), (9,), (9, 4)))
    assert_same(xp.dot(xp.asarray(u), xp.asarray(v)), np.dot(u, v))
    assert_same(xp.dot(xp.asarray(u), xp.asarray(m)), np.dot(u, m))
    out = xp.zeros(())
    xp.dot(xp.asarray(u), xp.asarray(v), out=out)
    assert float(out) == pytest.approx(float(np.dot(u, v)), rel=1e-5)
