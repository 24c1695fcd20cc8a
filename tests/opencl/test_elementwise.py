"""Elementwise functions of the opencl namespace against numpy: every ufunc, promotion, broadcasting, out=."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from neuroflow_opencl.elementwise import FLOAT_FUNCTIONS, PREDICATES, UFUNCS

DTYPES = (np.float32, np.float64, np.int64, np.bool_)
NAMES = sorted(n for n in UFUNCS if n != "copy")  # copy is what assignment and astype run (tested below)
TOLERANCE = {np.float32: (2e-6, 1e-6), np.float64: (1e-13, 1e-13)}


def values(name: str, dtype: Any, shape: tuple[int, ...], position: int, rng: np.random.Generator) -> np.ndarray:
    """Operands in each function's domain, with exact zeros, ties and negatives."""
    if dtype == np.bool_ or (name == "where" and position == 0):
        return rng.integers(0, 2, shape).astype(bool)
    if np.dtype(dtype).kind == "i":
        if name == "power" and position == 1:
            return rng.integers(0, 4, shape).astype(dtype)  # numpy refuses negative integer powers
        if position == {"divide": 1, "true_divide": 1, "reciprocal": 0}.get(name):
            return rng.choice([-3, -2, -1, 1, 2, 5], shape).astype(dtype)  # no integer division by zero
        return rng.integers(-4, 5, shape).astype(dtype)
    return rng.choice([-2.5, -1.0, -0.3, 0.0, 0.3, 1.0, 1.7, 3.0], shape).astype(dtype) \
        + rng.uniform(-0.01, 0.01, shape).astype(dtype) * (rng.random(shape) < 0.5)


def call(xp: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    return getattr(xp, name)(*args, **kwargs)


def assert_matches(got: Any, expected: np.ndarray) -> None:
    host = got.get()
    assert host.shape == expected.shape and host.dtype == expected.dtype, (host.dtype, expected.dtype)
    rtol, atol = TOLERANCE.get(expected.dtype.type, (0, 0))
    np.testing.assert_allclose(host, expected, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("name", NAMES)
def test_every_ufunc_matches_numpy(xp: Any, name: str, dtype: Any) -> None:
    arity = UFUNCS[name][0]
    rng = np.random.default_rng(len(name))
    # a transposed (strided) first operand, broadcast against a row and a column
    first = values(name, dtype, (4, 3), 0, rng)
    hosts = [first.T, *(values(name, dtype, s, i + 1, rng) for i, s in enumerate([(4,), (3, 1)][:arity - 1]))]
    devices = [xp.asarray(first).T, *(xp.asarray(h) for h in hosts[1:])]
    if dtype == np.bool_ and name in FLOAT_FUNCTIONS - PREDICATES - {"power", "floor", "ceil"}:
        # numpy computes these in float16, which the device has no kernels for: a clear refusal
        with pytest.raises(TypeError, match="float16"):
            call(xp, name, *devices)
        return
    if np.dtype(dtype).kind != "f" and name == "power":
        with pytest.raises(TypeError, match="power on the opencl backend needs floating-point operands"):
            call(xp, name, *devices)
        return
    try:
        with np.errstate(all="ignore"):
            expected = np.asarray(call(np, name, *hosts))
    except TypeError:  # e.g. -bool: the device refuses what numpy refuses
        with pytest.raises(TypeError):
            call(xp, name, *devices)
        return
    assert_matches(call(xp, name, *devices), expected)


@settings(max_examples=25, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=4),
       seed=st.integers(0, 2**16))
def test_broadcasting_matches_numpy(xp: Any, shapes: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b, c = (rng.standard_normal(s).astype(np.float32) for s in shapes.input_shapes)
    assert_matches(xp.add(xp.asarray(a), xp.asarray(b)), np.add(a, b))
    assert_matches(xp.where(xp.asarray(a > 0), xp.asarray(b), xp.asarray(c)), np.where(a > 0, b, c))


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.uint8, np.bool_], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("scalar", [2, 2.5, True, np.float64(2.5), np.int64(3)], ids=repr)
def test_scalars_promote_like_numpy(xp: Any, dtype: Any, scalar: Any) -> None:
    host = values("add", dtype, (3, 4), 0, np.random.default_rng(0))
    device = xp.asarray(host)
    for name in ("add", "divide"):
        for args, dargs in (((host, scalar), (device, scalar)), ((scalar, host), (scalar, device))):
            with np.errstate(all="ignore"):
                expected = np.asarray(call(np, name, *args))
            assert_matches(call(xp, name, *dargs), expected)
    with pytest.raises(TypeError):  # numpy refuses bool - bool; so does the device
        xp.subtract(xp.asarray(host > 0), True)


def test_operators_and_python_scalars(xp: Any) -> None:
    host = np.array([[-1.5, 0.0, 2.0], [3.0, -0.25, 1.0]], np.float32)
    a = xp.asarray(host)
    ints = xp.asarray(np.array([1, 2, 3], np.int64))
    for got, expected in [
        (a + 1, host + 1), (1 - a, 1 - host), (a * 2.5, host * 2.5), (3 / (a + 4), 3 / (host + 4)),
        (a ** 2, host ** 2), (-a, -host), (a > 0, host > 0), (a <= 1.0, host <= 1.0), (a == 0, host == 0),
        (a != 2, host != 2), (a @ a.T, host @ host.T), (ints * 2.5, np.array([1, 2, 3]) * 2.5),
        (ints + np.int32(1), np.array([1, 2, 3]) + np.int32(1)), (a + np.float64(1), host + np.float64(1)),
        (host[0] + a, host[0] + host),  # a numpy array on the left defers to the device array
    ]:
        assert_matches(got, np.asarray(expected))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_maximum_and_minimum_propagate_nan_from_either_side(xp: Any, dtype: Any) -> None:
    a = np.array([np.nan, 1.0, np.nan, -2.0, 0.0], dtype)
    b = np.array([0.0, np.nan, np.nan, 3.0, -0.0], dtype)
    for name in ("maximum", "minimum"):
        assert_matches(call(xp, name, xp.asarray(a), xp.asarray(b)), call(np, name, a, b))
        assert_matches(call(xp, name, xp.asarray(a), 0.5), call(np, name, a, dtype(0.5)))
        assert_matches(call(xp, name, xp.asarray(b), np.nan), call(np, name, b, dtype(np.nan)))
    assert_matches(xp.sign(xp.asarray(a)), np.sign(a))


def test_out_writes_only_into_its_strided_view(xp: Any) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    base = xp.zeros((5, 4))
    result = xp.add(xp.asarray(a), xp.asarray(b), out=base.T)  # out walks the buffer column by column
    assert result.shape == (4, 5)
    np.testing.assert_allclose(base.get(), (a + b).T, rtol=1e-6)
    grid = xp.full((6, 7), -1.0, np.float32)
    xp.multiply(xp.asarray(a[:3, :3]), 2.0, out=grid[::2, 1::2][:, :3])
    expected = np.full((6, 7), -1.0, np.float32)
    expected[::2, 1::2][:, :3] = a[:3, :3] * 2
    np.testing.assert_array_equal(grid.get(), expected)
    view = grid[1::2]  # in-place operators on a view change only the view's elements
    view += 10
    expected[1::2] += 10
    np.testing.assert_array_equal(grid.get(), expected)
    column = xp.zeros((3, 1))
    xp.exp(xp.zeros((3, 1)), out=column)  # out of the broadcast shape itself
    np.testing.assert_array_equal(column.get(), np.ones((3, 1), np.float32))
    single = xp.zeros((2, 3), np.float32)
    xp.add(xp.asarray(np.ones((2, 3))), 1, out=single)  # float64 result into float32 out: same kind
    np.testing.assert_array_equal(single.get(), np.full((2, 3), 2, np.float32))


def test_out_that_overlaps_an_input_reads_the_input_before_writing(xp: Any) -> None:
    host = np.arange(9, dtype=np.float32).reshape(3, 3)
    x = xp.asarray(host)
    x += x.T
    np.testing.assert_array_equal(x.get(), host + host.T)
    shifted = xp.asarray(host)
    shifted[1:] = shifted[:-1]
    expected = host.copy()
    expected[1:] = expected[:-1]
    np.testing.assert_array_equal(shifted.get(), expected)
    same = xp.asarray(host)
    xp.multiply(same, same, out=same)  # the same view in and out is safe without a copy
    np.testing.assert_array_equal(same.get(), host * host)


def test_where_and_clip_broadcast_like_numpy(xp: Any) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 4)).astype(np.float32)
    lo, hi = rng.standard_normal(4).astype(np.float32), rng.standard_normal((3, 1)).astype(np.float32)
    # lo > hi at some positions: numpy's clip is minimum(maximum(a, lo), hi), so hi wins there
    assert (lo[None, :] > hi).any()
    assert_matches(xp.clip(xp.asarray(a), xp.asarray(lo), xp.asarray(hi)), np.clip(a, lo, hi))
    assert_matches(xp.clip(xp.asarray(a), -0.5, 0.5), np.clip(a, -0.5, 0.5))
    out = xp.zeros((3, 4))
    xp.clip(xp.asarray(a), 0, None if False else 1.0, out=out)
    np.testing.assert_array_equal(out.get(), np.clip(a, 0, 1.0))
    cond = a > 0
    assert_matches(xp.where(xp.asarray(cond), xp.asarray(a), 0.0), np.where(cond, a, np.float32(0.0)))
    assert_matches(xp.where(xp.asarray(cond[:, :1]), 1, xp.asarray(lo)), np.where(cond[:, :1], 1, lo))


@pytest.mark.parametrize(("source", "target"), [
    (np.float32, np.int64), (np.float32, np.bool_), (np.int64, np.float32), (np.bool_, np.float32),
    (np.float64, np.float32), (np.int64, np.uint8), (np.float32, np.int32),
])
def test_astype_converts_like_numpy(xp: Any, source: Any, target: Any) -> None:
    host = np.array([[-2.7, -1.0, -0.5, 0.0], [0.4, 1.0, 2.5, 7.9]]).astype(source)
    device = xp.asarray(host)
    assert_matches(device.astype(target), host.astype(target))
    assert_matches(device.T.astype(target), host.T.astype(target))  # from a strided view
    assert_matches(xp.asarray(host, dtype=target), host.astype(target))


def test_astype_copy_semantics(xp: Any) -> None:
    a = xp.asarray(np.arange(4, dtype=np.float32))
    assert a.astype(np.float32, copy=False) is a
    b = a.astype(np.float32)
    b += 1
    np.testing.assert_array_equal(a.get(), np.arange(4))


def test_fill_and_conversions_to_python_scalars(xp: Any) -> None:
    a = xp.empty((2, 3), np.float32)
    a.fill(1.25)
    np.testing.assert_array_equal(a.get(), np.full((2, 3), 1.25, np.float32))
    a[1].fill(-3)
    np.testing.assert_array_equal(a.get(), [[1.25] * 3, [-3] * 3])
    assert float(a[0, 1]) == 1.25 and int(a[1, 2]) == -3 and a[0, 0].item() == 1.25
    assert isinstance(a[1:, :1].item(), float) and a[1:, :1].item() == -3.0
    assert int(xp.asarray(np.array([7], np.int64))) == 7 and bool(a[0, 0] > 1)
    assert float(a.sum()) == pytest.approx(1.25 * 3 - 9)
    with pytest.raises(ValueError, match="can only convert an array of size 1 to a Python scalar"):
        float(a)
    with pytest.raises(TypeError, match="only integer arrays can be used as an index"):
        [0, 1][a[0, 0]]
    assert a.tolist() == [[1.25] * 3, [-3.0] * 3] and len(a) == 2
    flags = xp.zeros((3,), np.bool_)
    flags.fill(True)
    assert flags.get().tolist() == [True] * 3 and xp.ones((2,), np.int64).get().tolist() == [1, 1]
    assert_matches(xp.full((2, 2), 7), np.full((2, 2), 7))
    assert_matches(xp.arange(2, 11, 3), np.arange(2, 11, 3))
    assert_matches(xp.arange(0.5, 2.0, 0.5, dtype=np.float32), np.arange(0.5, 2.0, 0.5, dtype=np.float32))
