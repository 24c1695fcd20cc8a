"""gemm.py against numpy.matmul: every kernel, layout, edge size, batch broadcast, dtype and out= view."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from .conftest import forced_gemm

ODD = [(1, 1, 1), (1, 5, 17), (17, 3, 1), (3, 17, 5), (5, 1, 9), (2, 7, 3), (7, 2, 4),
       (9, 16, 16), (16, 9, 17), (17, 17, 17), (8, 13, 8), (4, 4, 15), (15, 6, 4)]
LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]  # (A transposed, B transposed)


def operand(xp: Any, rng: np.random.Generator, shape: tuple[int, ...], transposed: bool,
            dtype: Any = np.float32) -> tuple[np.ndarray, Any]:
    """A random host matrix and a device copy of it, stored transposed (a strided view) if asked."""
    host = rng.standard_normal(shape).astype(dtype)
    if not transposed:
        return host, xp.asarray(host)
    return host, xp.asarray(np.ascontiguousarray(np.swapaxes(host, -1, -2))).swapaxes(-1, -2) \
        if host.ndim > 2 else xp.asarray(np.ascontiguousarray(host.T)).T


def check(result: Any, expected: np.ndarray, dtype: Any = np.float32) -> None:
    got = result.get()
    assert got.shape == expected.shape and got.dtype == expected.dtype
    tolerance = 1e-5 if np.dtype(dtype) == np.float32 else 1e-12
    np.testing.assert_allclose(got, expected, rtol=tolerance, atol=tolerance * max(1.0, np.abs(expected).max(initial=0)))


@pytest.mark.parametrize("layout", LAYOUTS, ids=["nn", "tn", "nt", "tt"])
def test_odd_sizes_every_layout(xp: Any, variant: str | None, layout: tuple[bool, bool]) -> None:
    rng = np.random.default_rng(0)
    for m, k, n in ODD:
        a, da = operand(xp, rng, (m, k), layout[0])
        b, db = operand(xp, rng, (k, n), layout[1])
        check(xp.matmul(da, db), a @ b)


def test_larger_than_a_tile_with_ragged_edges(xp: Any, variant: str | None) -> None:
    rng = np.random.default_rng(1)
    for ta, tb in LAYOUTS:
        a, da = operand(xp, rng, (70, 33), ta)
        b, db = operand(xp, rng, (33, 131), tb)
        check(xp.matmul(da, db), a @ b)


@pytest.mark.parametrize("shape", [(0, 3, 4), (3, 0, 4), (3, 4, 0), (0, 0, 0)])
def test_empty_dimensions(xp: Any, shape: tuple[int, int, int]) -> None:
    m, k, n = shape
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    check(xp.matmul(xp.asarray(a), xp.asarray(b)), a @ b)  # k == 0 gives zeros, not garbage


def test_empty_k_overwrites_out(xp: Any, variant: str | None) -> None:
    out = xp.full((5, 6), 7.0, dtype=np.float32)
    xp.matmul(xp.zeros((5, 0)), xp.zeros((0, 6)), out=out)
    assert (out.get() == 0).all()


@pytest.mark.parametrize("shapes", [((2, 1, 5, 7), (3, 7, 6)), ((4, 9, 3), (3, 17)), ((5, 8), (2, 3, 8, 4)),
                                    ((2, 3, 4, 5), (2, 3, 5, 6)), ((3, 1, 4, 5), (1, 2, 5, 6))])
def test_batched_with_broadcasting(xp: Any, variant: str | None, shapes: Any) -> None:
    rng = np.random.default_rng(2)
    for ta, tb in LAYOUTS:
        a, da = operand(xp, rng, shapes[0], ta)
        b, db = operand(xp, rng, shapes[1], tb)
        check(xp.matmul(da, db), np.matmul(a, b))


@pytest.mark.parametrize("shapes", [((7,), (7, 5)), ((6, 7), (7,)), ((7,), (7,)), ((3, 6, 7), (7,)), ((7,), (2, 7, 5))])
def test_vectors(xp: Any, variant: str | None, shapes: Any) -> None:
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in shapes)
    check(xp.matmul(xp.asarray(a), xp.asarray(b)), np.matmul(a, b))


def test_float64_and_mixed_precision(xp: Any, variant: str | None) -> None:
    rng = np.random.default_rng(4)
    for ta, tb in LAYOUTS:
        for m, k, n in [(3, 5, 7), (17, 9, 16), (9, 20, 33)]:
            a, da = operand(xp, rng, (m, k), ta, np.float64)
            b, db = operand(xp, rng, (k, n), tb, np.float64)
            check(xp.matmul(da, db), a @ b, np.float64)
            b32, db32 = operand(xp, rng, (k, n), tb, np.float32)
            check(xp.matmul(da, db32), a @ b32, np.float64)


def test_out_into_strided_views(xp: Any, variant: str | None) -> None:
    rng = np.random.default_rng(5)
    for ta, tb in LAYOUTS:
        a, da = operand(xp, rng, (7, 11), ta)
        b, db = operand(xp, rng, (11, 6), tb)
        big = xp.zeros((9, 20), dtype=np.float32)
        out = big[1:8, 2:20:3]  # every third column: c_sn == 3
        assert xp.matmul(da, db, out=out) is out
        expected = np.zeros((9, 20), np.float32)
        expected[1:8, 2:20:3] = a @ b
        check(big, expected)
        tall = xp.zeros((6, 7), dtype=np.float32)
        xp.matmul(da, db, out=tall.T)  # a transposed output: c_sm == 1
        check(tall, (a @ b).T)


def test_one_layout_at_many_offsets(xp: Any, variant: str | None) -> None:
    """A layout is planned (and its kernel compiled) once; each call's offsets travel with its launch."""
    rng = np.random.default_rng(8)
    a_store = rng.standard_normal((40, 16), dtype=np.float32)
    b_store = rng.standard_normal((30, 33), dtype=np.float32)
    da, db = xp.asarray(a_store), xp.asarray(b_store)
    out = xp.zeros((12, 40), dtype=np.float32)
    for start in (0, 3, 17):
        xp.matmul(da[start:start + 9], db[start % 7:start % 7 + 16, 1:], out=out[start % 4:start % 4 + 9, 8:])
        expected = np.zeros((12, 40), np.float32)
        expected[start % 4:start % 4 + 9, 8:] = a_store[start:start + 9] @ b_store[start % 7:start % 7 + 16, 1:]
        check(out, expected)
        out.fill(0)


def test_batched_out_view(xp: Any, variant: str | None) -> None:
    rng = np.random.default_rng(6)
    a, da = operand(xp, rng, (3, 5, 4), True)
    b, db = operand(xp, rng, (4, 9), False)
    big = xp.zeros((3, 9, 6), dtype=np.float32)
    xp.matmul(da, db, out=big[:, :, 1:].swapaxes(1, 2))
    expected = np.zeros((3, 9, 6), np.float32)
    expected[:, :, 1:] = np.swapaxes(a @ b, 1, 2)
    check(big, expected)


def test_errors_say_what_is_wrong(backend: Any, xp: Any) -> None:
    a, b = xp.zeros((3, 4)), xp.zeros((5, 6))
    with pytest.raises(ValueError, match="mismatch in core dimension"):
        xp.matmul(a, b)
    with pytest.raises(ValueError, match="expected"):
        xp.matmul(a, xp.zeros((4, 6)), out=xp.zeros((3, 5)))
    with pytest.raises(TypeError, match="floating-point"):
        xp.matmul(xp.zeros((3, 4), dtype=np.int32), xp.zeros((4, 2), dtype=np.int32))
    with forced_gemm(backend, "fastest"), pytest.raises(ValueError, match="tiled, rows, dots, scalar"):
        xp.matmul(a, xp.zeros((4, 6)))
