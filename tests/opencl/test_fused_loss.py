"""The fused softmax-cross-entropy on opencl: the generic loss's values and gradients, and its label checks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from neuroflow.errors import ShapeError
from neuroflow.losses import CrossEntropy

# ``backend``: the shared opencl fixture (tests/opencl/conftest.py), which skips without a driver.


def _fused_loss(backend, smoothing=0.0):
    loss = CrossEntropy(label_smoothing=smoothing)
    loss.to(backend)  # as the Trainer does
    return loss


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fused_matches_the_generic_loss_and_gradient(backend, smoothing):
    rng = np.random.default_rng(0)
    logits, labels = (rng.standard_normal((7, 5)) * 3).astype(np.float32), rng.integers(0, 5, 7)
    generic = CrossEntropy(label_smoothing=smoothing)
    expected = generic.forward(logits.copy(), labels)
    expected_grad = generic.backward(scale=0.5)
    fused = _fused_loss(backend, smoothing)
    assert backend.fused("softmax_cross_entropy", backend.from_host(logits)) is not None
    got = fused.forward(backend.from_host(logits), backend.from_host(labels))
    np.testing.assert_allclose(got, expected, rtol=1e-5)
    np.testing.assert_allclose(backend.to_host(fused.backward(scale=0.5)), expected_grad, rtol=1e-5, atol=1e-7)


def test_an_out_of_range_label_is_named_not_read(backend):
    logits = backend.from_host(np.zeros((3, 4), np.float32))
    with pytest.raises(ShapeError, match=r"outside \[0, 4\): min 0, max 4"):
        _fused_loss(backend).forward(logits, backend.from_host(np.array([0, 4, 1])))


def test_nan_logits_with_valid_labels_give_a_nan_loss(backend):
    logits = np.zeros((2, 3), np.float32)
    logits[1, 1] = np.nan
    value = _fused_loss(backend).forward(backend.from_host(logits), backend.from_host(np.array([0, 2])))
    assert math.isnan(value)  # the Trainer then stops with NonFiniteLossError, not a label error
