"""ConvertLayout and layout handling shared by the ops."""

from __future__ import annotations

import numpy as np
import pytest

from neuroflow import ops
from neuroflow.errors import ShapeError
from neuroflow.testing import OpTestCase, gradcheck
from neuroflow_ops_vision import ConvertLayout


@pytest.mark.parametrize("source, target", [("NCHW", "NHWC"), ("NHWC", "NCHW"), ("NCHW", "NCHW")])
def test_convert_layout(source: str, target: str, rng: np.random.Generator) -> None:
    op = ConvertLayout(source, target)
    x = rng.standard_normal((2, 3, 4, 5))
    y = op.forward(x)
    expected = x if source == target else x.transpose((0, 2, 3, 1) if target == "NHWC" else (0, 3, 1, 2))
    np.testing.assert_array_equal(y, expected)
    assert y.shape == op.output_shape(x.shape)
    gradcheck(op, x)


def test_one_channel_conversion_is_a_view(rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 1, 4, 5)).astype(np.float32)
    y = ConvertLayout().forward(x)
    assert y.shape == (2, 4, 5, 1) and np.shares_memory(x, y)


def test_errors_and_api() -> None:
    with pytest.raises(ShapeError, match=r"ConvertLayout\(NCHW→NHWC\) got input of shape \(2, 3\); expected \(N, C, H, W\)"):
        ConvertLayout().forward(np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="unknown layout 'NWHC'"):
        ConvertLayout("NWHC", "NCHW")
    op = ConvertLayout("NHWC", "NCHW")
    assert repr(ConvertLayout(**op.get_config())) == "ConvertLayout(NHWC→NCHW)"
    assert ops.ConvertLayout is ConvertLayout


class TestConvertLayoutOnEveryBackend(OpTestCase):
    input_shapes = [(2, 3, 4, 5)]

    def make_op(self) -> ConvertLayout:
        return ConvertLayout()
