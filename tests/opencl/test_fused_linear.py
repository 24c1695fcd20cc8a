"""The opencl ``linear`` kernel (GEMM with the bias added before the store) against x @ W.T + b on the host."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow import ops

# (batch, in, out): the MLP's layers, a row block with a ragged tail, too few outputs for the vector kernel
# (a separate bias add), a single row, and fewer rows than columns (computed transposed, the bias per row)
SHAPES = [(64, 784, 128), (64, 128, 64), (64, 64, 10), (19, 33, 70), (7, 5, 3), (1, 40, 24), (5, 300, 200)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_linear_matches_the_host_product_plus_bias(backend: Any, variant: str | None, shape: tuple[int, int, int]) -> None:
    n, d_in, d_out = shape
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((n, d_in), dtype=np.float32), rng.standard_normal((d_out, d_in), dtype=np.float32)
    b = rng.standard_normal(d_out, dtype=np.float32)
    xp = backend.xp
    out = xp.empty((n, d_out), np.float32)
    got = backend.kernel("linear")(xp.asarray(x), xp.asarray(w), xp.asarray(b), out)
    assert got is out
    np.testing.assert_allclose(out.get(), x @ w.T + b, rtol=1e-4, atol=1e-4)


def test_a_strided_bias_and_an_offset_output(backend: Any) -> None:
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((16, 40), dtype=np.float32), rng.standard_normal((48, 40), dtype=np.float32)
    b = rng.standard_normal(96, dtype=np.float32)
    xp = backend.xp
    store = xp.zeros((17, 48), np.float32)
    backend.kernel("linear")(xp.asarray(x), xp.asarray(w), xp.asarray(b)[::2], store[1:])
    got = store.get()
    np.testing.assert_allclose(got[1:], x @ w.T + b[::2], rtol=1e-4, atol=1e-4)
    assert not got[0].any()


def test_the_linear_op_on_opencl_gives_the_cpu_output(backend: Any) -> None:
    layer = ops.Linear(30, 20)
    x = np.random.default_rng(2).standard_normal((9, 30), dtype=np.float32)
    expected = layer.forward(x)
    layer.to(backend)
    assert layer.fused("linear", backend.xp.asarray(x)) is not None
    np.testing.assert_allclose(backend.to_host(layer.forward(backend.from_host(x))), expected, rtol=1e-5, atol=1e-5)


def test_a_bias_of_the_wrong_length_is_refused(backend: Any) -> None:
    xp = backend.xp
    x, w = xp.zeros((4, 6), np.float32), xp.zeros((5, 6), np.float32)
    with pytest.raises(ValueError, match=r"bias must be a \(5,\) float32 vector; got \(4,\) float32"):
        backend.kernel("linear")(x, w, xp.zeros(4, np.float32), xp.empty((4, 5), np.float32))


def test_a_column_major_input_computes_the_transpose_with_the_bias_per_row(backend: Any) -> None:
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((24, 50), dtype=np.float32), rng.standard_normal((36, 50), dtype=np.float32)
    b = rng.standard_normal(36, dtype=np.float32)
    xp = backend.xp
    x_view = xp.asarray(np.ascontiguousarray(x.T)).T  # A's columns contiguous: the product runs as Cᵀ = W xᵀ
    out = backend.kernel("linear")(x_view, xp.asarray(w), xp.asarray(b), xp.empty((24, 36), np.float32))
    np.testing.assert_allclose(out.get(), x @ w.T + b, rtol=1e-4, atol=1e-4)
