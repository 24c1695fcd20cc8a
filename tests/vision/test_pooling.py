"""MaxPool2d, AvgPool2d, GlobalAvgPool2d: gradients, a loop reference, ties, PyTorch, errors."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from neuroflow.errors import ShapeError
from neuroflow.testing import OpTestCase, gradcheck
from neuroflow_ops_vision import AvgPool2d, GlobalAvgPool2d, MaxPool2d

from .reference import avg_pool2d, from_layout, max_pool2d, to_layout

HAS_TORCH = importlib.util.find_spec("torch") is not None

MAX_CONFIGS: list[dict[str, Any]] = [
    dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=3, stride=1),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=1, ceil_mode=True), dict(kernel_size=2, ceil_mode=True),
    dict(kernel_size=3, stride=2, dilation=2),
]
AVG_CONFIGS: list[dict[str, Any]] = [
    dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=1, ceil_mode=True), dict(kernel_size=3, stride=1),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("config", MAX_CONFIGS, ids=lambda c: repr(MaxPool2d(**c)))
def test_max_pool_gradcheck(config: dict[str, Any], layout: str, rng: np.random.Generator) -> None:
    gradcheck(MaxPool2d(**config, layout=layout), to_layout(rng.standard_normal((2, 3, 7, 8)), layout))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("config", AVG_CONFIGS, ids=lambda c: repr(AvgPool2d(**c)))
def test_avg_pool_gradcheck(config: dict[str, Any], layout: str, rng: np.random.Generator) -> None:
    gradcheck(AvgPool2d(**config, layout=layout), to_layout(rng.standard_normal((2, 3, 7, 8)), layout))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("keepdims", [False, True])
def test_global_avg_pool(layout: str, keepdims: bool, rng: np.random.Generator) -> None:
    op = GlobalAvgPool2d(keepdims=keepdims, layout=layout)
    x = rng.standard_normal((2, 3, 4, 5))
    y = op.forward(to_layout(x, layout))
    expected = x.mean(axis=(2, 3))
    np.testing.assert_allclose(y.reshape(2, 3), expected)
    assert y.shape == op.output_shape(to_layout(x, layout).shape)
    gradcheck(op, to_layout(x, layout))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 8), w=st.integers(1, 8), k=st.integers(1, 3),
       s=st.integers(1, 3), p=st.integers(0, 1), layout=st.sampled_from(["NCHW", "NHWC"]), seed=st.integers(0, 2**16),
       quantised=st.booleans())
def test_random_shapes_match_reference(n: int, c: int, h: int, w: int, k: int, s: int, p: int, layout: str, seed: int,
                                       quantised: bool) -> None:
    if 2 * p > k or h + 2 * p < k or w + 2 * p < k:
        return
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w))
    if quantised:  # many ties: the first maximum (row-major) must win, as in PyTorch
        x = np.round(x)
    y_ref, gx_ref = max_pool2d(x, k, s, p)
    op = MaxPool2d(k, s, p, layout=layout)
    np.testing.assert_array_equal(from_layout(op.forward(to_layout(x, layout)), layout), y_ref)
    np.testing.assert_array_equal(from_layout(op.backward(to_layout(np.ones(y_ref.shape), layout)), layout), gx_ref)
    avg = AvgPool2d(k, s, p, layout=layout)
    np.testing.assert_allclose(from_layout(avg.forward(to_layout(x, layout)), layout), avg_pool2d(x, k, s, p), atol=1e-12)


def test_first_maximum_wins_ties() -> None:
    pool = MaxPool2d(2)
    gx = (pool.forward(np.zeros((1, 1, 2, 4))), pool.backward(np.ones((1, 1, 1, 2))))[1]
    np.testing.assert_array_equal(gx[0, 0], [[1, 0, 1, 0], [0, 0, 0, 0]])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_a_nan_in_a_window_gives_nan_and_the_gradient_stays_on_the_maximum_before_it(layout: str) -> None:
    """Taps in row-major order: a later tap takes the gradient only where strictly larger than the maximum so far,
    and nothing is larger than a NaN. Windows: a NaN after three strict wins; a NaN first; a NaN second, then a
    larger value; no NaN (for contrast)."""
    nan = np.nan
    x = np.array([[0, 1, nan, 3, 2, nan, 1, 2],
                  [5, nan, 4, 5, 7, 1, 3, 0]], np.float32).reshape(1, 1, 2, 8)
    pool = MaxPool2d(2, layout=layout)
    y = from_layout(pool.forward(to_layout(x, layout)), layout)
    np.testing.assert_array_equal(y.reshape(-1), [nan, nan, nan, 3])
    gx = from_layout(pool.backward(to_layout(np.array([1, 2, 3, 4], np.float32).reshape(1, 1, 1, 4), layout)), layout)
    np.testing.assert_array_equal(gx[0, 0], [[0, 0, 2, 0, 3, 0, 0, 0],
                                             [1, 0, 0, 0, 0, 0, 4, 0]])


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("config", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1)], ids=str)
def test_max_pool_with_relu_equals_relu_then_pool(config: dict[str, Any], layout: str, rng: np.random.Generator) -> None:
    from neuroflow import ops

    x = to_layout(np.round(rng.standard_normal((2, 3, 6, 7)) * 2), layout)  # negative windows and ties
    relu, pool = ops.ReLU(), MaxPool2d(**config, layout=layout)
    fused = MaxPool2d(**config, layout=layout, activation="relu")
    expected = pool.forward(relu.forward(x))
    np.testing.assert_array_equal(fused.forward(x), expected)
    gy = rng.standard_normal(expected.shape)
    np.testing.assert_array_equal(fused.backward(gy), relu.backward(pool.backward(gy)))
    gradcheck(fused, rng.standard_normal(x.shape))


class TestMaxPoolOnEveryBackend(OpTestCase):
    input_shapes = [(2, 3, 6, 6)]

    def make_op(self) -> MaxPool2d:
        return MaxPool2d(3, 2, 1)


class TestAvgPoolOnEveryBackend(OpTestCase):
    input_shapes = [(2, 6, 6, 3)]

    def make_op(self) -> AvgPool2d:
        return AvgPool2d(2, layout="NHWC")


class TestGlobalAvgPoolOnEveryBackend(OpTestCase):
    input_shapes = [(2, 3, 4, 4)]

    def make_op(self) -> GlobalAvgPool2d:
        return GlobalAvgPool2d()


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("kind, config", [("max", c) for c in MAX_CONFIGS] + [("avg", c) for c in AVG_CONFIGS],
                         ids=lambda v: v if isinstance(v, str) else repr(v))
def test_matches_pytorch(kind: str, config: dict[str, Any], rng: np.random.Generator) -> None:
    import torch

    ours = (MaxPool2d if kind == "max" else AvgPool2d)(**config)
    reference = (torch.nn.MaxPool2d if kind == "max" else torch.nn.AvgPool2d)(**config)
    x = np.round(rng.standard_normal((2, 3, 9, 8)) * 2).astype(np.float32)  # with ties
    xt = torch.from_numpy(x).requires_grad_(True)
    yt = reference(xt)
    gy = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.from_numpy(gy))
    np.testing.assert_allclose(ours.forward(x), yt.detach().numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ours.backward(gy), xt.grad.numpy(), rtol=1e-6, atol=1e-6)


def test_errors() -> None:
    with pytest.raises(ShapeError, match=r"MaxPool2d\(k=2\) got input of shape \(2, 3, 4\); expected \(N, C, H, W\)"):
        MaxPool2d(2).forward(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ShapeError, match="the 2×2 map with padding 0×0 is smaller than the kernel's 3×3 reach"):
        AvgPool2d(3).forward(np.zeros((1, 1, 2, 2), np.float32))
    with pytest.raises(ValueError, match="padding .* must be at most half the kernel"):
        MaxPool2d(2, padding=2)
    with pytest.raises(ShapeError, match="dtype int32"):
        GlobalAvgPool2d().forward(np.zeros((1, 1, 2, 2), np.int32))
    pool = MaxPool2d(2)
    pool.forward(np.zeros((1, 1, 4, 4), np.float32))
    with pytest.raises(ShapeError, match=r"expected \(1, 1, 2, 2\)"):
        pool.backward(np.zeros((1, 1, 4, 4), np.float32))


@pytest.mark.parametrize("op", [MaxPool2d(3, 2, 1), MaxPool2d((2, 3), ceil_mode=True, layout="NHWC"),
                                MaxPool2d(2, activation="relu"),
                                AvgPool2d(2, count_include_pad=False), GlobalAvgPool2d(keepdims=True, layout="NHWC")],
                         ids=repr)
def test_get_config_rebuilds_the_op(op: Any) -> None:
    assert repr(type(op)(**op.get_config())) == repr(op)
