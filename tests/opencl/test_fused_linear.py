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


# (batch, in, out): the MLP's layers (one launch each), a ragged row block, too few columns for the vector
# kernel, a deep product (computed transposed: product and reduction) and a single example
GRAD_SHAPES = [(64, 784, 128), (64, 128, 64), (64, 64, 10), (19, 33, 70), (7, 3, 5), (700, 50, 20), (1, 40, 24)]


@pytest.mark.parametrize("shape", GRAD_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_weight_grad_gives_the_host_product_and_bias_sums(backend: Any, variant: str | None,
                                                          shape: tuple[int, int, int]) -> None:
    n, d_in, d_out = shape
    rng = np.random.default_rng(2)
    g, x = rng.standard_normal((n, d_out), dtype=np.float32), rng.standard_normal((n, d_in), dtype=np.float32)
    xp = backend.xp
    gw, gb = xp.full((d_out, d_in), np.nan, np.float32), xp.full((d_out,), np.nan, np.float32)
    backend.kernel("linear_weight_grad")(xp.asarray(g), xp.asarray(x), gw, gb)
    np.testing.assert_allclose(gw.get(), g.T @ x, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(gb.get(), g.sum(axis=0), rtol=1e-4, atol=1e-4)


def test_weight_grad_into_offset_and_strided_views(backend: Any) -> None:
    """Offsets travel with each launch; a strided bias gradient or weight gradient still gets the right values."""
    rng = np.random.default_rng(3)
    g, x = rng.standard_normal((32, 48), dtype=np.float32), rng.standard_normal((32, 40), dtype=np.float32)
    xp = backend.xp
    for weight_view, bias_view in ((slice(1, None), slice(3, 51)), (slice(None, 48), slice(0, 96, 2))):
        store_w, store_b = xp.zeros((49, 40), np.float32), xp.zeros(96, np.float32)
        backend.kernel("linear_weight_grad")(xp.asarray(g), xp.asarray(x), store_w[weight_view], store_b[bias_view])
        expected_w, expected_b = np.zeros((49, 40), np.float32), np.zeros(96, np.float32)
        expected_w[weight_view], expected_b[bias_view] = g.T @ x, g.sum(axis=0)
        np.testing.assert_allclose(store_w.get(), expected_w, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(store_b.get(), expected_b, rtol=1e-4, atol=1e-4)


def test_weight_grad_refuses_mismatched_buffers(backend: Any) -> None:
    xp = backend.xp
    g, x = xp.zeros((8, 6), np.float32), xp.zeros((8, 5), np.float32)
    with pytest.raises(ValueError, match=r"gives \(6, 5\) and 6 row sums; got out \(5, 6\)"):
        backend.kernel("linear_weight_grad")(g, x, xp.zeros((5, 6), np.float32), xp.zeros(6, np.float32))
    with pytest.raises(TypeError, match="one float dtype"):
        backend.kernel("linear_weight_grad")(g, x, xp.zeros((6, 5), np.float32), xp.zeros(6, np.int32))


def test_the_linear_op_gradients_on_opencl_match_cpu(backend: Any) -> None:
    rng = np.random.default_rng(4)
    x, gy = rng.standard_normal((20, 30), dtype=np.float32), rng.standard_normal((20, 12), dtype=np.float32)
    layer = ops.Linear(30, 12)
    layer.forward(x)
    gx = layer.backward(gy)
    expected = {"gx": gx, "weight": layer.weight.grad.copy(), "bias": layer.bias.grad.copy()}
    layer.weight.grad = layer.bias.grad = None  # gradients accumulate: start the device pass from none
    layer.to(backend)
    assert layer.fused("linear_weight_grad", backend.xp.asarray(gy)) is not None
    layer.forward(backend.from_host(x))
    got = {"gx": backend.to_host(layer.backward(backend.from_host(gy))),
           "weight": backend.to_host(layer.weight.grad), "bias": backend.to_host(layer.bias.grad)}
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-4, err_msg=key)
