"""BatchNorm2d: train vs eval, running statistics as PyTorch keeps them, fused ReLU, gradients, errors."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neuroflow.errors import ShapeError
from neuroflow.testing import OpTestCase, gradcheck
from neuroflow_ops_vision import BatchNorm2d

from .reference import batch_norm_train, from_layout, to_layout

HAS_TORCH = importlib.util.find_spec("torch") is not None


def _randomise(bn: BatchNorm2d, rng: np.random.Generator) -> BatchNorm2d:
    c = bn.num_features
    bn.weight.data[...] = rng.uniform(0.5, 1.5, c)
    bn.bias.data[...] = rng.standard_normal(c)
    bn.running_mean.data[...] = rng.standard_normal(c)
    bn.running_var.data[...] = rng.uniform(0.5, 2.0, c)
    return bn


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_gradcheck(layout: str, training: bool, activation: str | None, numba_path: str,
                   rng: np.random.Generator) -> None:
    bn = _randomise(BatchNorm2d(3, activation=activation, layout=layout).astype(np.float64), rng)
    bn.train(training)
    gradcheck(bn, to_layout(rng.standard_normal((4, 3, 3, 2)) * 2 + 1, layout))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_training_normalises_with_batch_statistics(layout: str, numba_path: str, rng: np.random.Generator) -> None:
    bn = _randomise(BatchNorm2d(4, layout=layout).astype(np.float64), rng)
    x = rng.standard_normal((5, 4, 3, 6)) * 3 + 2
    y = from_layout(bn.forward(to_layout(x, layout)), layout)
    np.testing.assert_allclose(y, batch_norm_train(x, bn.weight.data, bn.bias.data, 1e-5), atol=1e-12)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_running_statistics_follow_pytorch(layout: str, numba_path: str, rng: np.random.Generator) -> None:
    """running = 0.9·running + 0.1·batch, with the unbiased batch variance in running_var."""
    bn = BatchNorm2d(3, layout=layout).astype(np.float64)
    mean, var = np.zeros(3), np.ones(3)
    for _ in range(3):
        x = rng.standard_normal((4, 3, 2, 5)) * 2 + 1
        bn.forward(to_layout(x, layout))
        mean = 0.9 * mean + 0.1 * x.mean(axis=(0, 2, 3))
        var = 0.9 * var + 0.1 * x.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(bn.running_mean.data, mean, atol=1e-12)
    np.testing.assert_allclose(bn.running_var.data, var, atol=1e-12)


def test_cumulative_average_when_momentum_is_none(rng: np.random.Generator) -> None:
    bn = BatchNorm2d(2, momentum=None).astype(np.float64)
    batches = [rng.standard_normal((3, 2, 4, 4)) + i for i in range(4)]
    for x in batches:
        bn.forward(x)
    np.testing.assert_allclose(bn.running_mean.data, np.mean([x.mean(axis=(0, 2, 3)) for x in batches], axis=0))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_eval_uses_running_statistics_and_leaves_them(layout: str, numba_path: str,
                                                     rng: np.random.Generator) -> None:
    bn = _randomise(BatchNorm2d(3, layout=layout).astype(np.float64), rng)
    bn.eval()
    before = bn.running_mean.data.copy(), bn.running_var.data.copy()
    x = rng.standard_normal((2, 3, 4, 4))
    y = from_layout(bn.forward(to_layout(x, layout)), layout)
    rm, rv = (v[:, None, None] for v in before)
    expected = (x - rm) / np.sqrt(rv + 1e-5) * bn.weight.data[:, None, None] + bn.bias.data[:, None, None]
    np.testing.assert_allclose(y, expected, atol=1e-12)
    np.testing.assert_array_equal(bn.running_mean.data, before[0])
    np.testing.assert_array_equal(bn.running_var.data, before[1])
    # One sample per channel is fine in eval (it is an error in training).
    bn.forward(to_layout(rng.standard_normal((1, 3, 1, 1)), layout))


def test_train_and_eval_differ_until_the_statistics_settle(rng: np.random.Generator) -> None:
    bn = BatchNorm2d(2).astype(np.float64)
    x = rng.standard_normal((8, 2, 4, 4)) * 4 + 3
    train_out = bn.forward(x).copy()
    bn.eval()
    assert not np.allclose(bn.forward(x), train_out, atol=1e-2)  # running stats saw one batch at momentum 0.1
    bn.train()
    bn.momentum = 1.0
    bn.forward(x)
    bn.eval()
    # With the batch's own (unbiased) statistics, eval matches training up to the variance's n/(n−1).
    n = x.size // 2
    np.testing.assert_allclose(bn.forward(x), train_out * np.sqrt((n - 1) / n), atol=1e-3)


def test_without_running_statistics_eval_uses_the_batch(rng: np.random.Generator) -> None:
    bn = BatchNorm2d(2, track_running_stats=False, affine=False).astype(np.float64)
    assert not list(bn.named_parameters()) and not list(bn.named_buffers())
    x = rng.standard_normal((3, 2, 2, 2))
    train_out = bn.forward(x).copy()
    bn.eval()
    np.testing.assert_allclose(bn.forward(x), train_out)
    gradcheck(bn, x)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_fused_relu_equals_relu_after(layout: str, numba_path: str, rng: np.random.Generator) -> None:
    plain = BatchNorm2d(3, layout=layout).astype(np.float64)
    fused = BatchNorm2d(3, activation="relu", layout=layout).astype(np.float64)
    x = to_layout(rng.standard_normal((2, 3, 4, 4)), layout)
    np.testing.assert_allclose(fused.forward(x), np.maximum(plain.forward(x), 0))
    gy = rng.standard_normal(x.shape)
    np.testing.assert_allclose(fused.backward(gy), plain.backward(gy * (fused.forward(x) > 0)), atol=1e-12)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(1, 4), c=st.integers(1, 5), h=st.integers(1, 5), w=st.integers(1, 5),
       layout=st.sampled_from(["NCHW", "NHWC"]), scale=st.floats(0.01, 100), shift=st.floats(-100, 100),
       seed=st.integers(0, 2**16))
# two values 88 ± 0.01: the float32 mean was two of its ulps (1.5e-5) off, 5e-3 of the normalised output
@example(n=1, c=1, h=1, w=2, layout="NCHW", scale=0.01, shift=88.0, seed=2)
def test_random_shapes_and_scales(n: int, c: int, h: int, w: int, layout: str, scale: float, shift: float,
                                  seed: int) -> None:
    if n * h * w < 2:
        return  # one value per channel: an error in training, tested below
    rng = np.random.default_rng(seed)
    bn = BatchNorm2d(c, layout=layout)
    x = (rng.standard_normal((n, c, h, w)) * scale + shift).astype(np.float32)
    y = from_layout(bn.forward(to_layout(x, layout)), layout)
    expected = batch_norm_train(x.astype(np.float64), np.ones(c), np.zeros(c), 1e-5)
    # float32, |mean| up to 100: the mean rounds to half an ulp of 100 (3.8e-6), over √eps (a spread below it) 1.2e-3
    np.testing.assert_allclose(y, expected, atol=2e-3)


class TestBatchNormOnEveryBackend(OpTestCase):
    input_shapes = [(4, 3, 3, 3)]

    def make_op(self) -> BatchNorm2d:
        return BatchNorm2d(3)


class TestBatchNormReluNHWCOnEveryBackend(OpTestCase):
    input_shapes = [(4, 3, 3, 5)]

    def make_op(self) -> BatchNorm2d:
        return BatchNorm2d(5, activation="relu", layout="NHWC")


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("training", [True, False])
def test_matches_pytorch(training: bool, rng: np.random.Generator) -> None:
    import torch

    bn = _randomise(BatchNorm2d(4), rng)
    reference = torch.nn.BatchNorm2d(4)
    reference.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in bn.state_dict().items()}, strict=False)
    bn.train(training)
    reference.train(training)
    x = (rng.standard_normal((6, 4, 5, 5)) * 2 + 1).astype(np.float32)
    xt = torch.from_numpy(x).requires_grad_(True)
    yt = reference(xt)
    gy = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.from_numpy(gy))
    np.testing.assert_allclose(bn.forward(x), yt.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.backward(gy), xt.grad.numpy(), rtol=1e-3, atol=1e-4)
    for name in ("weight", "bias"):
        np.testing.assert_allclose(getattr(bn, name).grad, getattr(reference, name).grad.numpy(), rtol=1e-4, atol=1e-4)
    for name in ("running_mean", "running_var"):
        np.testing.assert_allclose(getattr(bn, name).data, getattr(reference, name).numpy(), rtol=1e-5, atol=1e-6)


def test_parameters_and_buffers_have_pytorch_names() -> None:
    bn = BatchNorm2d(8)
    assert [(n, p.shape) for n, p in bn.named_parameters()] == [("weight", (8,)), ("bias", (8,))]
    assert [(n, b.shape) for n, b in bn.named_buffers()] == [("running_mean", (8,)), ("running_var", (8,))]
    assert np.all(bn.weight.data == 1) and np.all(bn.bias.data == 0) and np.all(bn.running_var.data == 1)


def test_errors() -> None:
    bn = BatchNorm2d(3)
    with pytest.raises(ShapeError, match=r"BatchNorm2d\(3\) got input of shape \(2, 4, 5, 5\); expected \(N, 3, H, W\)"):
        bn.forward(np.zeros((2, 4, 5, 5), np.float32))
    with pytest.raises(ShapeError, match="more than one value per channel"):
        bn.forward(np.zeros((1, 3, 1, 1), np.float32))
    with pytest.raises(ShapeError, match="dtype float64; its parameters are float32"):
        bn.forward(np.zeros((2, 3, 2, 2)))
    with pytest.raises(ValueError, match="activation must be None or 'relu'"):
        BatchNorm2d(3, activation="gelu")
    with pytest.raises(ValueError, match="momentum"):
        BatchNorm2d(3, momentum=2.0)


@pytest.mark.parametrize("op", [BatchNorm2d(4), BatchNorm2d(4, eps=1e-3, momentum=0.01, activation="relu", layout="NHWC"),
                                BatchNorm2d(2, affine=False, track_running_stats=False)], ids=repr)
def test_get_config_rebuilds_the_op(op: Any) -> None:
    assert repr(type(op)(**op.get_config())) == repr(op)
