"""SqueezeExcite, Upsample and ChannelConcat: gradients, references, PyTorch, errors."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

from neuroflow.errors import ShapeError
from neuroflow.testing import OpTestCase, gradcheck
from neuroflow_ops_vision import ChannelConcat, Conv2d, SqueezeExcite, Upsample
from neuroflow_ops_vision.upsample import interpolation_matrix

from .reference import conv2d, from_layout, to_layout

HAS_TORCH = importlib.util.find_spec("torch") is not None


# ---------------------------------------------------------------------------------------------- SE
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_squeeze_excite(layout: str, rng: np.random.Generator) -> None:
    op = SqueezeExcite(8, reduction=4, layout=layout).astype(np.float64)
    assert [(n, p.shape) for n, p in op.named_parameters()] == [
        ("fc1.weight", (2, 8, 1, 1)), ("fc1.bias", (2,)), ("fc2.weight", (8, 2, 1, 1)), ("fc2.bias", (8,))]
    x = rng.standard_normal((3, 8, 4, 5))
    gradcheck(op, to_layout(x, layout))
    w1, b1 = op.fc1.weight.data[:, :, 0, 0], op.fc1.bias.data
    w2, b2 = op.fc2.weight.data[:, :, 0, 0], op.fc2.bias.data
    hidden = np.maximum(x.mean(axis=(2, 3)) @ w1.T + b1, 0)
    gate = 1 / (1 + np.exp(-(hidden @ w2.T + b2)))
    expected = x * gate[:, :, None, None]
    np.testing.assert_allclose(from_layout(op.forward(to_layout(x, layout)), layout), expected, atol=1e-12)


def test_squeeze_excite_width_and_errors() -> None:
    assert SqueezeExcite(64).squeeze_channels == 16
    assert SqueezeExcite(64, squeeze_channels=8).squeeze_channels == 8
    assert SqueezeExcite(3, reduction=16).squeeze_channels == 1
    with pytest.raises(ShapeError, match=r"SqueezeExcite\(8→2→8\) got input of shape \(1, 4, 2, 2\); expected \(N, 8, H, W\)"):
        SqueezeExcite(8).forward(np.zeros((1, 4, 2, 2), np.float32))
    with pytest.raises(ValueError, match="reduction"):
        SqueezeExcite(8, reduction=0)


class TestSqueezeExciteOnEveryBackend(OpTestCase):
    input_shapes = [(2, 3, 3, 8)]

    def make_op(self) -> SqueezeExcite:
        return SqueezeExcite(8, layout="NHWC")


# ---------------------------------------------------------------------------------------------- Upsample
UPSAMPLES: list[dict[str, Any]] = [
    dict(scale_factor=2), dict(scale_factor=3), dict(size=(7, 9)), dict(scale_factor=1.5),
    dict(scale_factor=2, mode="bilinear"), dict(size=(7, 9), mode="bilinear", align_corners=True),
    dict(scale_factor=2.5, mode="bilinear"), dict(size=(3, 2), mode="bilinear"),
]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("config", UPSAMPLES, ids=lambda c: repr(Upsample(**c)))
def test_upsample_gradcheck(config: dict[str, Any], layout: str, rng: np.random.Generator) -> None:
    op = Upsample(**config, layout=layout)
    x = to_layout(rng.standard_normal((2, 3, 4, 5)), layout)
    assert op.forward(x).shape == op.output_shape(x.shape)
    gradcheck(op, x)


def test_nearest_integer_upsampling_repeats_pixels() -> None:
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    y = Upsample(2).forward(x)
    np.testing.assert_array_equal(y[0, 0], np.repeat(np.repeat(x[0, 0], 2, axis=0), 2, axis=1))


def test_interpolation_matrix_rows_sum_to_one() -> None:
    for mode in ("nearest", "bilinear"):
        for size_in, size_out in ((4, 9), (9, 4), (1, 5), (5, 5)):
            matrix = interpolation_matrix(size_in, size_out, mode, False, None)
            np.testing.assert_allclose(matrix.sum(axis=1), 1.0)


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("config", UPSAMPLES, ids=lambda c: repr(Upsample(**c)))
def test_upsample_matches_pytorch(config: dict[str, Any], rng: np.random.Generator) -> None:
    import torch

    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    xt = torch.from_numpy(x).requires_grad_(True)
    yt = torch.nn.Upsample(**config)(xt)
    gy = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.from_numpy(gy))
    op = Upsample(**config)
    np.testing.assert_allclose(op.forward(x), yt.detach().numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(op.backward(gy), xt.grad.numpy(), rtol=1e-5, atol=1e-5)


def test_upsample_errors() -> None:
    with pytest.raises(ValueError, match="exactly one of scale_factor and size"):
        Upsample()
    with pytest.raises(ValueError, match="unknown mode 'cubic'"):
        Upsample(2, mode="cubic")
    with pytest.raises(ValueError, match="align_corners applies to mode='bilinear' only"):
        Upsample(2, align_corners=True)
    with pytest.raises(ShapeError, match=r"Upsample\(.*\) got input of shape \(2, 3\)"):
        Upsample(2).forward(np.zeros((2, 3), np.float32))


# ---------------------------------------------------------------------------------------------- ChannelConcat
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_channel_concat(layout: str, rng: np.random.Generator) -> None:
    op = ChannelConcat(Conv2d(3, 2, 1, layout=layout), Conv2d(3, 4, 3, padding=1, layout=layout), layout=layout)
    x = rng.standard_normal((2, 3, 5, 5))
    gradcheck(op, to_layout(x, layout))
    op.astype(np.float64)
    y = from_layout(op.forward(to_layout(x, layout)), layout)
    a, b = op.branches
    np.testing.assert_allclose(y[:, :2], conv2d(x, a.weight.data, a.bias.data, (1, 1), (0, 0), (1, 1), 1), atol=1e-12)
    np.testing.assert_allclose(y[:, 2:], conv2d(x, b.weight.data, b.bias.data, (1, 1), (1, 1), (1, 1), 1), atol=1e-12)
    assert op.output_shape(to_layout(x, layout).shape) == to_layout(y, layout).shape


def test_channel_concat_names_the_branch_that_does_not_fit() -> None:
    op = ChannelConcat(Conv2d(3, 2, 1), Conv2d(3, 4, 3))
    with pytest.raises(ShapeError, match=r"branch 1 \(Conv2d\(3→4, k=3\)\) gives \(1, 4, 3, 3\)"):
        op.memory_declaration((1, 3, 5, 5))
    with pytest.raises(ShapeError, match="differ outside axis 1"):
        op.forward(np.zeros((1, 3, 5, 5), np.float32))


@pytest.mark.parametrize("op", [SqueezeExcite(16, reduction=8, layout="NHWC"), Upsample(2, mode="bilinear"),
                                Upsample(size=(4, 6), layout="NHWC")], ids=repr)
def test_get_config_rebuilds_the_op(op: Any) -> None:
    assert repr(type(op)(**op.get_config())) == repr(op)
