"""Losses: values against direct formulas, float64 finite-difference gradients, label checks."""

from __future__ import annotations

import numpy as np
import pytest

from neuroflow.errors import ShapeError
from neuroflow.losses import MSE, CrossEntropy


def _reference_ce(logits, labels, smoothing=0.0):
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    c = logits.shape[1]
    target = np.full(logits.shape, smoothing / c)
    target[np.arange(len(labels)), labels] += 1 - smoothing
    return float(-(target * logp).sum(axis=1).mean())


def _numeric_grad(fn, x, eps=1e-6):
    g = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        old = x[i]
        x[i] = old + eps
        plus = fn(x)
        x[i] = old - eps
        minus = fn(x)
        x[i] = old
        g[i] = (plus - minus) / (2 * eps)
    return g


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_value_and_gradient(smoothing):
    rng = np.random.default_rng(0)
    logits, labels = rng.standard_normal((5, 4)) * 3, rng.integers(0, 4, 5)
    loss = CrossEntropy(label_smoothing=smoothing)
    assert loss.forward(logits, labels) == pytest.approx(_reference_ce(logits, labels, smoothing), rel=1e-10)
    analytic = loss.backward(scale=0.5).copy()
    numeric = _numeric_grad(lambda z: 0.5 * _reference_ce(z, labels, smoothing), logits.copy())
    np.testing.assert_allclose(analytic, numeric, atol=1e-7)


def test_cross_entropy_is_exact_for_confident_wrong_predictions():
    logits = np.array([[200.0, -200.0]], np.float32)
    assert CrossEntropy().forward(logits, np.array([1])) == pytest.approx(400.0)


@pytest.mark.parametrize(
    ("logits", "labels", "message"),
    [
        (np.zeros((3, 4)), np.zeros(2, int), r"labels of shape \(2,\); expected \(3,\)"),
        (np.zeros((3, 4)), np.zeros(3), "dtype float64; expected integers"),
        (np.zeros((3, 4)), np.array([0, 4, 1]), r"outside \[0, 4\)"),
        (np.zeros(4), np.zeros(4, int), r"expected \(batch, classes\)"),
    ],
)
def test_cross_entropy_rejects_bad_labels(logits, labels, message):
    with pytest.raises(ShapeError, match=message):
        CrossEntropy().forward(logits, labels)


def test_mse_value_gradient_and_shape_check():
    rng = np.random.default_rng(1)
    pred, target = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    loss = MSE()
    assert loss.forward(pred, target) == pytest.approx(((pred - target) ** 2).mean())
    numeric = _numeric_grad(lambda p: ((p - target) ** 2).mean(), pred.copy())
    np.testing.assert_allclose(loss.backward(), numeric, atol=1e-7)
    with pytest.raises(ShapeError, match="equal shapes"):
        loss.forward(pred, target[:, :1])


def test_predictions_are_probabilities():
    probs = CrossEntropy().predictions(np.array([[1.0, 2.0, 3.0]]))
    np.testing.assert_allclose(probs.sum(), 1.0)
    assert probs.argmax() == 2


@pytest.mark.parametrize("loss", [CrossEntropy(), CrossEntropy(label_smoothing=0.1), MSE()], ids=repr)
def test_float32_loss_means_meet_the_pairwise_bound(loss, nf_backend):
    """The batch mean over 131,072 rows (MSE: elements) in float32 is the float64 mean to log2(n)·eps.

    A guard rather than a fix: these means run over contiguous arrays, which numpy sums pairwise (CuPy in a
    tree, the opencl backend in double), so they met the bound before the blocked sums of
    ``neuroflow.backends.reductions`` too; a sequential sum would miss it (~1e-5 here).
    """
    rng = np.random.default_rng(0)
    n = 131_072
    if isinstance(loss, MSE):
        pred, target = rng.standard_normal((n, 1)) + 1.0, rng.standard_normal((n, 1))
    else:
        pred, target = rng.standard_normal((n, 10)) * 3.0, rng.integers(0, 10, n)
    pred32 = pred.astype(np.float32)
    wide = type(loss)(**loss.get_config()).forward(pred32.astype(np.float64), target)
    device_target = target if target.dtype.kind in "iu" else target.astype(np.float32)
    narrow = loss.to(nf_backend).forward(nf_backend.from_host(pred32), nf_backend.from_host(device_target))
    assert abs(narrow - wide) <= np.log2(n) * np.finfo(np.float32).eps * abs(wide)
