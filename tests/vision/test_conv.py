"""Conv2d, DepthwiseConv2d, SeparableConv2d: gradients, a direct-loop reference, PyTorch, chunking, errors."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from neuroflow import ops
from neuroflow.errors import ShapeError
from neuroflow.testing import OpTestCase, gradcheck
from neuroflow_ops_vision import Conv2d, DepthwiseConv2d, SeparableConv2d

from .reference import conv2d, conv2d_grads, from_layout, to_layout

HAS_TORCH = importlib.util.find_spec("torch") is not None

CONFIGS: list[dict[str, Any]] = [
    dict(in_channels=3, out_channels=4, kernel_size=3),
    dict(in_channels=3, out_channels=4, kernel_size=3, padding=1),
    dict(in_channels=2, out_channels=3, kernel_size=3, stride=2, padding=1),
    dict(in_channels=3, out_channels=2, kernel_size=(2, 3), stride=(2, 1), padding=(1, 2), dilation=(2, 1)),
    dict(in_channels=2, out_channels=2, kernel_size=3, padding=2, dilation=2, bias=False),
    dict(in_channels=4, out_channels=6, kernel_size=3, padding=1, groups=2),
    dict(in_channels=4, out_channels=8, kernel_size=3, padding=1, groups=4),  # depthwise, multiplier 2
    # depthwise with one filter per channel from 32 channels: one einsum over the strided windows (numpy) for
    # forward and weight gradient, at stride 1 also over the padded gradient's windows for the input gradient
    dict(in_channels=32, out_channels=32, kernel_size=3, padding=1, groups=32, bias=False),
    dict(in_channels=64, out_channels=64, kernel_size=(3, 2), padding=(1, 0), dilation=(2, 1), groups=64),
    dict(in_channels=64, out_channels=64, kernel_size=3, stride=2, padding=2, dilation=2, groups=64),
    dict(in_channels=4, out_channels=5, kernel_size=1),
    dict(in_channels=4, out_channels=5, kernel_size=1, stride=2, bias=False),
]


def make(config: dict[str, Any], layout: str) -> Conv2d:
    return Conv2d(**config, layout=layout)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: repr(Conv2d(**c)))
def test_gradcheck(config: dict[str, Any], layout: str, rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, config["in_channels"], 6, 5))
    gradcheck(make(config, layout), to_layout(x, layout))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: repr(Conv2d(**c)))
def test_matches_direct_loop_reference(config: dict[str, Any], layout: str, rng: np.random.Generator) -> None:
    conv = make(config, layout).astype(np.float64)
    x = rng.standard_normal((2, config["in_channels"], 6, 5))
    y = from_layout(conv.forward(to_layout(x, layout)), layout)
    b = conv.bias.data if conv.has_bias else None
    args = (conv.stride, conv.padding, conv.dilation, conv.groups)
    np.testing.assert_allclose(y, conv2d(x, conv.weight.data, b, *args), atol=1e-12)
    gy = rng.standard_normal(y.shape)
    gx = from_layout(conv.backward(to_layout(gy, layout)), layout)
    ref_gx, ref_gw = conv2d_grads(x, conv.weight.data, gy, *args)
    np.testing.assert_allclose(gx, ref_gx, atol=1e-12)
    np.testing.assert_allclose(conv.weight.grad, ref_gw, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 3), c=st.integers(1, 4), h=st.integers(1, 7), w=st.integers(1, 7), out_per_group=st.integers(1, 3),
    k=st.integers(1, 3), stride=st.integers(1, 3), padding=st.integers(0, 2), dilation=st.integers(1, 2),
    grouped=st.booleans(), layout=st.sampled_from(["NCHW", "NHWC"]), seed=st.integers(0, 2**16),
)
# a depthwise 1×1 map: numpy may give a window's W axis of one any stride (it was refused as not W·C-contiguous)
@example(n=1, c=2, h=1, w=1, out_per_group=1, k=1, stride=1, padding=0, dilation=1, grouped=True, layout="NHWC", seed=0)
def test_random_shapes_match_reference(n: int, c: int, h: int, w: int, out_per_group: int, k: int, stride: int,
                                       padding: int, dilation: int, grouped: bool, layout: str, seed: int) -> None:
    groups = c if grouped else 1
    if h + 2 * padding < dilation * (k - 1) + 1 or w + 2 * padding < dilation * (k - 1) + 1:
        return  # the kernel does not fit: covered by test_kernel_larger_than_the_map
    conv = Conv2d(c, groups * out_per_group, k, stride, padding, dilation, groups, layout=layout).astype(np.float64)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, c, h, w))
    y = from_layout(conv.forward(to_layout(x, layout)), layout)
    args = (conv.stride, conv.padding, conv.dilation, groups)
    np.testing.assert_allclose(y, conv2d(x, conv.weight.data, conv.bias.data, *args), atol=1e-10)
    gy = rng.standard_normal(y.shape)
    gx = from_layout(conv.backward(to_layout(gy, layout)), layout)
    ref_gx, ref_gw = conv2d_grads(x, conv.weight.data, gy, *args)
    np.testing.assert_allclose(gx, ref_gx, atol=1e-10)
    np.testing.assert_allclose(conv.weight.grad, ref_gw, atol=1e-10)
    np.testing.assert_allclose(conv.bias.grad, gy.sum(axis=(0, 2, 3)), atol=1e-10)


# strided (weight gradient from the input's columns, input gradient per tap), and stride 1 (both gradients from
# the output gradient's columns), plain and grouped with dilation
CHUNKED_GEOMETRIES = [dict(in_channels=4, out_channels=4, kernel_size=3, padding=1, stride=2),
                      dict(in_channels=4, out_channels=6, kernel_size=3, padding=1),
                      dict(in_channels=4, out_channels=6, kernel_size=3, padding=2, dilation=2, groups=2)]


@pytest.mark.parametrize("geometry", CHUNKED_GEOMETRIES, ids=str)
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("budget", [None, 1, 4000])
def test_chunked_workspace_gives_the_same_result(budget: int | None, keep: bool, geometry: dict[str, Any],
                                                 rng: np.random.Generator) -> None:
    """Chunks of one sample (budget 1) or a few, columns kept or rebuilt: the same numbers as one chunk,
    and as the reference convolution."""
    reference = Conv2d(**geometry, max_workspace_bytes=None).astype(np.float64)
    chunked = Conv2d(**geometry, max_workspace_bytes=budget).astype(np.float64)
    chunked.load_state_dict(reference.state_dict())
    chunked.keep_columns = keep
    x = rng.standard_normal((5, 4, 7, 7))
    gy = rng.standard_normal((5, *reference.output_shape(x.shape)[1:]))
    args = (reference.stride, reference.padding, reference.dilation, reference.groups)
    expected_gx, expected_gw = conv2d_grads(x, reference.weight.data, gy, *args)
    for conv in (reference, chunked):
        conv.forward(x)
        conv.backward(gy)
    if budget == 1:
        assert chunked.chunk_size((5, 7, 7, 4)) == 1
        assert chunked.grad_chunk_size((5, 7, 7, 4)) == (1 if chunked.stride == (1, 1) else 5)  # strided: per tap
    np.testing.assert_allclose(reference.weight.grad, expected_gw, atol=1e-10)
    np.testing.assert_allclose(chunked.forward(x), reference.forward(x), atol=1e-12)
    gx = reference.backward(gy)
    np.testing.assert_allclose(gx, expected_gx, atol=1e-10)
    np.testing.assert_allclose(chunked.backward(gy), gx, atol=1e-12)
    np.testing.assert_allclose(chunked.weight.grad, reference.weight.grad, atol=1e-12)


@pytest.mark.parametrize("geometry", CHUNKED_GEOMETRIES[1:], ids=str)
def test_a_frozen_weight_in_chunks_gives_the_input_gradient_only(geometry: dict[str, Any],
                                                                   rng: np.random.Generator) -> None:
    """Stride 1 without a weight gradient: the flipped kernel serves every chunk (it is overwritten only by a
    weight gradient), and the input gradient is the reference's."""
    conv = Conv2d(**geometry, max_workspace_bytes=1).astype(np.float64)
    conv.weight.requires_grad = False
    x = rng.standard_normal((3, 4, 7, 7))
    gy = rng.standard_normal((3, *conv.output_shape(x.shape)[1:]))
    conv.forward(x)
    gx = conv.backward(gy)
    args = (conv.stride, conv.padding, conv.dilation, conv.groups)
    np.testing.assert_allclose(gx, conv2d_grads(x, conv.weight.data, gy, *args)[0], atol=1e-10)
    assert conv.weight.grad is None


def test_memory_declaration_bounds_the_columns_by_the_budget() -> None:
    conv = Conv2d(16, 32, 3, padding=1, layout="NHWC", max_workspace_bytes=2**20)
    declared = conv.memory_declaration((64, 32, 32, 16))
    assert declared.output == (64, 32, 32, 32)
    chunk = conv.chunk_size((64, 32, 32, 16))
    assert 1 <= chunk < 64
    assert (chunk, 32, 32, 1, 3, 3, 16) in declared.workspace
    per_sample = conv.workspace_bytes_per_sample((32, 32))
    assert chunk * per_sample <= 2**20
    unbounded = Conv2d(16, 32, 3, padding=1, layout="NHWC", max_workspace_bytes=None)
    columns = (64, 32, 32, 1, 3, 3, 16)
    # with an input gradient, both gradients come from the output gradient's columns: nothing to keep
    assert columns not in unbounded.memory_declaration((64, 32, 32, 16)).cached
    unbounded.needs_input_grad = False  # a first layer: its weight gradient reads the forward's columns
    assert columns not in unbounded.memory_declaration((64, 32, 32, 16)).cached  # rebuilt by default
    unbounded.keep_columns = True  # kept on request
    assert columns in unbounded.memory_declaration((64, 32, 32, 16)).cached


@pytest.mark.parametrize(("fitting", "expected"), [(22, 16), (32, 32), (31, 16), (5, 5), (7, 7), (1, 1)])
def test_the_batch_is_split_into_the_fewest_chunks_of_even_size(fitting: int, expected: int) -> None:
    """A budget that fits 22 of 32 samples gives two chunks of 16, not 22 + 10 (a small last chunk is a less
    efficient GEMM); 5 per chunk stays 5 (seven chunks either way). Forward and gradient columns alike."""
    conv = Conv2d(16, 16, 3, padding=1, layout="NHWC")
    shape = (32, 16, 16, 16)
    conv.max_workspace_bytes = fitting * conv.workspace_bytes_per_sample((16, 16))
    assert conv.chunk_size(shape) == expected
    per_sample = conv.max_workspace_bytes // fitting
    assert -(-32 // conv.chunk_size(shape)) == -(-32 // fitting)  # no more chunks than the budget needs
    assert conv.chunk_size(shape) * per_sample <= conv.max_workspace_bytes
    gradient_per_sample = (18 * 18 * 16 + 16 * 16 * 9 * 16) * 4  # the padded output gradient and its columns
    conv.max_workspace_bytes = fitting * gradient_per_sample
    assert conv.grad_chunk_size(shape) == expected


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_output_shape_and_declaration_agree_with_forward(layout: str, rng: np.random.Generator) -> None:
    conv = Conv2d(3, 5, 3, stride=2, padding=1, layout=layout)
    x = to_layout(rng.standard_normal((2, 3, 9, 8)).astype(np.float32), layout)
    assert conv.forward(x).shape == conv.output_shape(x.shape)


def test_input_gradient_is_skipped_when_not_needed(rng: np.random.Generator) -> None:
    full = Conv2d(3, 4, 3, padding=1).astype(np.float64)
    first = Conv2d(3, 4, 3, padding=1).astype(np.float64)
    first.load_state_dict(full.state_dict())
    first.needs_input_grad = False
    x, gy = rng.standard_normal((2, 3, 5, 5)), rng.standard_normal((2, 4, 5, 5))
    for conv in (full, first):
        conv.forward(x)
    full.backward(gy)
    assert first.backward(gy) is None
    np.testing.assert_allclose(first.weight.grad, full.weight.grad)
    np.testing.assert_allclose(first.bias.grad, full.bias.grad)


def test_output_layout_converts_once(rng: np.random.Generator) -> None:
    """layout="NCHW", output_layout="NHWC": PyTorch-style input, channels-last output and gradients."""
    plain = Conv2d(3, 4, 3, padding=1).astype(np.float64)
    mixed = Conv2d(3, 4, 3, padding=1, output_layout="NHWC").astype(np.float64)
    mixed.load_state_dict(plain.state_dict())
    x = rng.standard_normal((2, 3, 5, 6))
    np.testing.assert_allclose(mixed.forward(x), plain.forward(x).transpose(0, 2, 3, 1), atol=1e-12)
    gy = rng.standard_normal((2, 4, 5, 6))
    np.testing.assert_allclose(mixed.backward(to_layout(gy, "NHWC")), plain.backward(gy), atol=1e-12)
    gradcheck(mixed, x)


def test_accumulates_parameter_gradients(rng: np.random.Generator) -> None:
    conv = Conv2d(2, 3, 3).astype(np.float64)
    x, gy = rng.standard_normal((2, 2, 5, 5)), rng.standard_normal((2, 3, 3, 3))
    conv.forward(x)
    conv.backward(gy)
    once = conv.weight.grad.copy()
    conv.forward(x)
    conv.backward(gy)
    np.testing.assert_allclose(conv.weight.grad, 2 * once)


def test_does_not_modify_its_input_or_gradient(rng: np.random.Generator) -> None:
    conv = Conv2d(3, 4, 3, padding=1, stride=2)
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    gy = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    x0, gy0 = x.copy(), gy.copy()
    conv.forward(x)
    conv.backward(gy)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(gy, gy0)


def test_pytorch_initialisation_bounds() -> None:
    conv = Conv2d(8, 16, 3)
    bound = 1 / np.sqrt(8 * 9)
    assert conv.weight.shape == (16, 8, 3, 3) and conv.bias.shape == (16,)
    assert np.abs(conv.weight.data).max() <= bound and np.abs(conv.weight.data).max() > 0.8 * bound
    assert np.abs(conv.bias.data).max() <= bound


# ---------------------------------------------------------------------------------------------- depthwise, separable
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("kwargs", [dict(kernel_size=3, padding=1), dict(kernel_size=3, stride=2, depth_multiplier=2),
                                    dict(kernel_size=(3, 2), dilation=2, padding=(2, 1), bias=False)], ids=str)
def test_depthwise(kwargs: dict[str, Any], layout: str, rng: np.random.Generator, depthwise_path: str) -> None:
    op = DepthwiseConv2d(3, **kwargs, layout=layout)
    assert op.weight.shape == (3 * kwargs.get("depth_multiplier", 1), 1, *op.kernel_size)
    x = rng.standard_normal((2, 3, 7, 6))
    gradcheck(op, to_layout(x, layout))
    y = from_layout(op.forward(to_layout(x, layout)), layout)
    b = op.bias.data if op.has_bias else None
    np.testing.assert_allclose(y, conv2d(x, op.weight.data, b, op.stride, op.padding, op.dilation, 3), atol=1e-12)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_separable(layout: str, rng: np.random.Generator) -> None:
    op = SeparableConv2d(3, 5, 3, padding=1, stride=2, layout=layout)
    assert [(n, p.shape) for n, p in op.named_parameters()] == [
        ("depthwise.weight", (3, 1, 3, 3)), ("pointwise.weight", (5, 3, 1, 1)), ("pointwise.bias", (5,))]
    x = rng.standard_normal((2, 3, 6, 6))
    gradcheck(op, to_layout(x, layout))
    d, p = op.depthwise, op.pointwise
    mid = conv2d(x, d.weight.data, None, (2, 2), (1, 1), (1, 1), 3)
    expected = conv2d(mid, p.weight.data, p.bias.data, (1, 1), (0, 0), (1, 1), 1)
    np.testing.assert_allclose(from_layout(op.forward(to_layout(x, layout)), layout), expected, atol=1e-12)


# ---------------------------------------------------------------------------------------------- backend parity
class TestConv2dOnEveryBackend(OpTestCase):
    input_shapes = [(2, 3, 7, 7)]

    def make_op(self) -> Conv2d:
        return Conv2d(3, 4, 3, stride=2, padding=1)


class TestGroupedConvOnEveryBackend(OpTestCase):
    input_shapes = [(2, 6, 5, 5)]

    def make_op(self) -> Conv2d:
        return Conv2d(6, 4, 3, padding=1, groups=2)


class TestDepthwiseOnEveryBackend(OpTestCase):
    input_shapes = [(2, 5, 5, 4)]

    def make_op(self) -> DepthwiseConv2d:
        return DepthwiseConv2d(4, 3, padding=1, layout="NHWC")


class TestSeparableOnEveryBackend(OpTestCase):
    input_shapes = [(2, 3, 6, 6)]

    def make_op(self) -> SeparableConv2d:
        return SeparableConv2d(3, 4, 3, padding=1)


# ---------------------------------------------------------------------------------------------- PyTorch
@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: repr(Conv2d(**c)))
def test_matches_pytorch_in_float32(config: dict[str, Any], rng: np.random.Generator) -> None:
    import torch

    conv = Conv2d(**config)
    reference = torch.nn.Conv2d(**config)
    reference.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in conv.state_dict().items()})
    x = rng.standard_normal((3, config["in_channels"], 9, 8)).astype(np.float32)
    xt = torch.from_numpy(x).requires_grad_(True)
    yt = reference(xt)
    gy = rng.standard_normal(tuple(yt.shape)).astype(np.float32)
    yt.backward(torch.from_numpy(gy))
    np.testing.assert_allclose(conv.forward(x), yt.detach().numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(conv.backward(gy), xt.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(conv.weight.grad, reference.weight.grad.numpy(), rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------------------------------------- errors and API
def test_wrong_channel_count_names_the_op_and_the_expected_shape() -> None:
    conv = Conv2d(3, 32, 3)
    with pytest.raises(ShapeError, match=r"Conv2d\(3→32, k=3\) got input of shape \(2, 4, 8, 8\); expected \(N, 3, H, W\)"):
        conv.forward(np.zeros((2, 4, 8, 8), np.float32))


def test_nhwc_data_given_to_an_nchw_op_gets_a_hint() -> None:
    with pytest.raises(ShapeError, match=r"looks like NHWC; pass layout='NHWC'"):
        Conv2d(3, 8, 3).forward(np.zeros((2, 8, 8, 3), np.float32))


def test_wrong_rank_and_dtype() -> None:
    conv = Conv2d(3, 8, 3)
    with pytest.raises(ShapeError, match=r"expected \(N, 3, H, W\)"):
        conv.forward(np.zeros((3, 8, 8), np.float32))
    with pytest.raises(ShapeError, match="dtype float64; its parameters are float32"):
        conv.forward(np.zeros((1, 3, 8, 8)))
    with pytest.raises(ShapeError, match="dtype int64"):
        conv.forward(np.zeros((1, 3, 8, 8), np.int64))


def test_kernel_larger_than_the_map() -> None:
    with pytest.raises(ShapeError, match=r"the 2×2 map with padding 0×0 is smaller than the kernel's 5×5 reach"):
        Conv2d(1, 1, 5).forward(np.zeros((1, 1, 2, 2), np.float32))
    with pytest.raises(ShapeError, match="smaller than the kernel"):
        Conv2d(1, 1, 5).memory_declaration((1, 1, 2, 2))


def test_bad_backward_gradient_shape() -> None:
    conv = Conv2d(1, 2, 3)
    conv.forward(np.zeros((1, 1, 5, 5), np.float32))
    with pytest.raises(ShapeError, match=r"backward got gradient of shape \(1, 2, 5, 5\); expected \(1, 2, 3, 3\)"):
        conv.backward(np.zeros((1, 2, 5, 5), np.float32))
    with pytest.raises(RuntimeError, match="before forward"):
        Conv2d(1, 2, 3).backward(np.zeros((1, 2, 3, 3), np.float32))


@pytest.mark.parametrize("kwargs, message", [
    (dict(in_channels=3, out_channels=4, kernel_size=3, groups=2), "groups=2 must divide in_channels=3"),
    (dict(in_channels=3, out_channels=4, kernel_size=0), "kernel_size must be ≥ 1"),
    (dict(in_channels=3, out_channels=4, kernel_size=3, padding=-1), "padding must be ≥ 0"),
    (dict(in_channels=0, out_channels=4, kernel_size=3), "in_channels must be a positive int"),
    (dict(in_channels=3, out_channels=4, kernel_size=3, layout="CHW"), "unknown layout 'CHW'; expected one of NCHW, NHWC"),
    (dict(in_channels=3, out_channels=4, kernel_size=(1, 2, 3)), "kernel_size must be an int or a pair"),
])
def test_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Conv2d(**kwargs)


@pytest.mark.parametrize("op", [
    Conv2d(3, 8, 3, stride=2, padding=1, bias=False, groups=1, layout="NHWC", max_workspace_bytes=1024),
    Conv2d(4, 8, (3, 1), dilation=(2, 1), groups=2, output_layout="NHWC"),
    DepthwiseConv2d(4, 3, padding=1, depth_multiplier=2),
    SeparableConv2d(4, 8, 3, padding=1, layout="NHWC"),
], ids=repr)
def test_get_config_rebuilds_the_op(op: Any) -> None:
    rebuilt = type(op)(**op.get_config())
    assert repr(rebuilt) == repr(op)
    assert [(n, p.shape) for n, p in rebuilt.named_parameters()] == [(n, p.shape) for n, p in op.named_parameters()]


def test_reprs() -> None:
    assert repr(Conv2d(3, 32, 3)) == "Conv2d(3→32, k=3)"
    assert repr(Conv2d(3, 32, (3, 5), stride=2, padding=1, bias=False, layout="NHWC")) == \
        "Conv2d(3→32, k=3×5, s=2, p=1, bias=False, NHWC)"
    assert repr(Conv2d(3, 8, 3, output_layout="NHWC")) == "Conv2d(3→8, k=3, NCHW→NHWC)"
    assert repr(DepthwiseConv2d(8, 3, padding=1)) == "DepthwiseConv2d(8, k=3, p=1)"
    assert repr(SeparableConv2d(8, 16, 3, padding=1)) == "SeparableConv2d(8→16, k=3, p=1)"


def test_resolves_through_the_entry_point() -> None:
    from neuroflow import registry

    assert ops.Conv2d is Conv2d
    assert registry.ops.distribution("Conv2d") == "neuroflow-ops-vision"
