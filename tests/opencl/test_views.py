"""views.py on plain tuples against numpy: the stride arithmetic every ClArray view relies on."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from neuroflow_opencl.views import (
    basic_index,
    broadcast_shapes,
    broadcast_strides,
    collapse,
    contiguous_strides,
    is_contiguous,
    normalize_shape,
    reshape_strides,
)

BASE = np.arange(4096, dtype=np.int64)  # every view below reads this buffer


def elements(offset: int, shape: tuple[int, ...], estrides: tuple[int, ...]) -> np.ndarray:
    """What a (offset, shape, strides-in-elements) view of BASE shows, computed index by index."""
    position = np.full(shape, offset, dtype=np.int64)
    for index, stride in zip(np.indices(shape), estrides):
        position += index * stride
    return BASE[position]


def describe(view: np.ndarray) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(offset, shape, strides in elements) of a numpy view of BASE."""
    offset = (view.__array_interface__["data"][0] - BASE.__array_interface__["data"][0]) // BASE.itemsize
    return offset, view.shape, tuple(s // BASE.itemsize for s in view.strides)


@st.composite
def numpy_views(draw: Any) -> np.ndarray:
    """A random view of BASE: a reshape, a transpose, then slices with steps (negative ones too)."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6))
    view = BASE[:math.prod(shape)].reshape(shape)
    view = view.transpose(draw(st.permutations(range(view.ndim))))
    key = tuple(draw(st.slices(n)) for n in view.shape)
    return view[key]


@st.composite
def factorizations(draw: Any, size: int) -> tuple[int, ...]:
    """A random shape with ``size`` elements (prime factors grouped at random, with 1s sprinkled in)."""
    if size == 0:
        return draw(st.sampled_from([(0,), (0, 3), (2, 0, 1), (1, 0)]))
    primes, n, p = [], size, 2
    while n > 1:
        while n % p == 0:
            primes.append(p)
            n //= p
        p += 1
    primes = list(draw(st.permutations(primes)))
    dims: list[int] = []
    for prime in primes:
        if dims and draw(st.booleans()):
            dims[-1] *= prime
        else:
            dims.append(prime)
    for _ in range(draw(st.integers(0, 2))):
        dims.insert(draw(st.integers(0, len(dims))), 1)
    return tuple(dims) or (1,) * draw(st.integers(0, 2))


def small_slices(n: int) -> Any:
    """Slices of an axis of size ``n`` with steps a real index uses (hypothesis' own reach 2**63, overflowing int64)."""
    bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    return st.builds(slice, bound, bound, st.one_of(st.none(), st.integers(-4, 4).filter(bool)))


@st.composite
def basic_keys(draw: Any, shape: tuple[int, ...]) -> Any:
    """A basic index for ``shape``: ints (negative too), slices, None, at most one Ellipsis."""
    parts: list[Any] = [draw(st.one_of(st.integers(-n, n - 1), small_slices(n))) if n else draw(small_slices(n))
                        for n in shape]
    if draw(st.booleans()):
        i = draw(st.integers(0, len(parts)))
        parts[i:draw(st.integers(i, len(parts)))] = [Ellipsis]
    else:
        del parts[draw(st.integers(0, len(parts))):]  # trailing dimensions are implied
    for _ in range(draw(st.integers(0, 2))):
        parts.insert(draw(st.integers(0, len(parts))), None)
    return parts[0] if len(parts) == 1 and draw(st.booleans()) else tuple(parts)


def test_elements_reads_numpy_views_back() -> None:
    view = BASE[:60].reshape(3, 4, 5).transpose(2, 0, 1)[::-2, 1:, ::3]
    np.testing.assert_array_equal(elements(*describe(view)), view)


@given(hnp.array_shapes(min_dims=0, max_dims=5, min_side=1, max_side=5))  # numpy gives empty arrays 0 strides
def test_contiguous_strides_match_numpy(shape: tuple[int, ...]) -> None:
    assert contiguous_strides(shape) == tuple(s // 8 for s in np.empty(shape, np.int64).strides)


@given(numpy_views())
def test_is_contiguous_matches_numpys_flag(view: np.ndarray) -> None:
    if view.size == 0:  # numpy calls every empty array contiguous; kernels never walk one
        return
    _, shape, strides = describe(view)
    assert is_contiguous(shape, strides) == view.flags.c_contiguous


@settings(max_examples=300)
@given(st.data())
def test_reshape_strides_is_none_exactly_when_numpy_must_copy(data: Any) -> None:
    view = data.draw(numpy_views())
    new_shape = data.draw(factorizations(view.size))
    offset, shape, strides = describe(view)
    got = reshape_strides(shape, strides, new_shape)
    try:
        np.reshape(view, new_shape, copy=False)
        numpy_copies = False
    except ValueError:
        numpy_copies = True
    assert (got is None) == numpy_copies, (shape, strides, new_shape, got)
    if got is not None:
        assert len(got) == len(new_shape)
        np.testing.assert_array_equal(elements(offset, new_shape, got), view.reshape(new_shape))


@pytest.mark.parametrize(("shape", "strides", "new_shape", "expected"), [
    ((4, 6), (6, 1), (2, 2, 3, 2), (12, 6, 2, 1)),  # dense: any split works
    ((6, 4), (1, 6), (24,), None),  # a transpose cannot be flattened in place
    ((6, 4), (1, 6), (6, 2, 2), (1, 12, 6)),  # but its last axis can be split
    ((3, 4), (8, 1), (3, 2, 2), (8, 2, 1)),  # a column slice splits within each row
    ((3, 4), (8, 1), (12,), None),  # but rows with a gap do not join
    ((1, 5, 1), (99, 2, 7), (5,), (2,)),  # size-1 axes carry no stride
])
def test_reshape_strides_examples(shape: Any, strides: Any, new_shape: Any, expected: Any) -> None:
    assert reshape_strides(shape, strides, new_shape) == expected


@settings(max_examples=300)
@given(st.data())
def test_basic_index_matches_numpy(data: Any) -> None:
    view = data.draw(numpy_views())
    key = data.draw(basic_keys(view.shape))
    offset, shape, strides = describe(view)
    delta, got_shape, got_strides = basic_index(shape, strides, key)
    expected = view[key]
    assert got_shape == expected.shape
    np.testing.assert_array_equal(elements(offset + delta, got_shape, got_strides), expected)
    if isinstance(expected, np.ndarray) and expected.size:  # integers alone give numpy scalars, not views
        assert offset + delta == describe(expected)[0]


@pytest.mark.parametrize(("key", "message"), [
    ((0, 0, 0), "too many indices: array is 2-dimensional, but 3 were indexed"),
    ((Ellipsis, 0, Ellipsis), "single ellipsis"),
    ((3,), "index 3 is out of bounds for axis 0 with size 3"),
    ((0, -5), "index -5 is out of bounds for axis 1 with size 4"),
])
def test_basic_index_errors_are_numpys(key: Any, message: str) -> None:
    with pytest.raises(IndexError):
        np.empty((3, 4))[key]
    with pytest.raises(IndexError, match=message.replace("(", r"\(").replace(")", r"\)")):
        basic_index((3, 4), (4, 1), key)


def test_basic_index_with_negative_steps_and_new_axes() -> None:
    delta, shape, strides = basic_index((3, 4), (4, 1), (None, slice(None, None, -1), Ellipsis, -1, None))
    assert (delta, shape, strides) == (11, (1, 3, 1), (0, -4, 0))
    np.testing.assert_array_equal(elements(delta, shape, strides), BASE[:12].reshape(3, 4)[None, ::-1, ..., -1, None])


@settings(max_examples=200)
@given(numpy_views(), st.data())
def test_collapse_walks_the_same_elements_in_the_same_order(view: np.ndarray, data: Any) -> None:
    _, shape, strides = describe(view)
    others = [contiguous_strides(shape), tuple(0 if data.draw(st.booleans()) else s for s in strides), strides]
    new_shape, new_sets = collapse(shape, others)
    assert math.prod(new_shape) == math.prod(shape) and 1 not in new_shape
    assert len(new_sets) == len(others) and all(len(s) == len(new_shape) for s in new_sets)
    for before, after in zip(others, new_sets):
        np.testing.assert_array_equal(elements(7, shape, before).ravel(), elements(7, new_shape, after).ravel())


def test_collapse_merges_dense_and_scalar_operands_into_one_dimension() -> None:
    assert collapse((64, 128), [(128, 1), (0, 0)]) == ((8192,), [(1,), (0,)])
    # a bias row (stride 0 along rows) keeps two dimensions; a transposed operand keeps them too
    assert collapse((64, 128), [(128, 1), (0, 1)]) == ((64, 128), [(128, 1), (0, 1)])
    assert collapse((4, 1, 5), [(5, 5, 1), (1, 7, 4)]) == ((4, 5), [(5, 1), (1, 4)])
    assert collapse((1, 1), [(1, 1)]) == ((), [()])


@given(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=4, max_side=4))
def test_broadcast_shapes_match_numpy(shapes: Any) -> None:
    assert broadcast_shapes(*shapes.input_shapes) == np.broadcast_shapes(*shapes.input_shapes) == shapes.result_shape


@given(numpy_views(), st.data())
def test_broadcast_strides_show_numpys_broadcast(view: np.ndarray, data: Any) -> None:
    offset, shape, strides = describe(view)
    lead = data.draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    target = (*lead, *(data.draw(st.integers(1, 3)) if n == 1 else n for n in shape))
    got = broadcast_strides(shape, strides, target)
    np.testing.assert_array_equal(elements(offset, target, got), np.broadcast_to(view, target))


@pytest.mark.parametrize(("shapes", "target"), [(((2, 3), (3, 2)), None), (((4,),), (3,)), (((2, 3),), (3,))])
def test_broadcast_errors(shapes: Any, target: Any) -> None:
    if target is None:
        with pytest.raises(ValueError, match=r"operands could not be broadcast together with shapes \(2, 3\) \(3, 2\)"):
            broadcast_shapes(*shapes)
    else:
        with pytest.raises(ValueError, match=f"cannot broadcast shape {re_escape(shapes[0])} to {re_escape(target)}"):
            broadcast_strides(shapes[0], contiguous_strides(shapes[0]), target)


def re_escape(shape: tuple[int, ...]) -> str:
    return str(shape).replace("(", r"\(").replace(")", r"\)")


@pytest.mark.parametrize(("shape", "size", "expected"), [
    (-1, 12, (12,)), ((3, -1), 12, (3, 4)), ((2, -1, 2), 12, (2, 3, 2)), (np.int64(5), None, (5,)), ((), 1, ()),
])
def test_normalize_shape_resolves_one_unknown_like_numpy(shape: Any, size: Any, expected: Any) -> None:
    assert normalize_shape(shape, size) == expected
    if size is not None:
        assert np.empty(size).reshape(shape).shape == expected


@pytest.mark.parametrize(("shape", "message"), [
    ((-1, -1), "can only specify one unknown dimension"),
    ((5, -1), "cannot reshape array of size 12 into shape"),
    ((0, -1), "cannot reshape array of size 12 into shape"),
    ((3, 5), r"cannot reshape array of size 12 into shape \(3, 5\)"),
    ((-2, -6), "negative dimensions are not allowed"),
])
def test_normalize_shape_errors(shape: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        normalize_shape(shape, 12)
