"""Inference folding: predict and evaluate run an eval-mode BatchNorm2d inside the convolution before it, with the
values of the unfolded layers; training, a hand-run eval forward and its backward run the layers as written."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import folding, ops
from neuroflow.folding import NormFolded, folded_layers
from neuroflow_ops_vision import BatchNorm2d, Conv2d

from .folding_models import CallCounter, convnet, norms, randomised


def trainer(model: nf.Sequential) -> nf.Trainer:
    return nf.Trainer(model, nf.losses.CrossEntropy(), nf.optim.SGD(lr=0.01), batch_size=8, progress=False, seed=0)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def unfolded_eval(model: nf.Sequential, x: np.ndarray) -> np.ndarray:
    """The eval forward layer by layer as written: no fusion, no folding."""
    model.eval()
    try:
        for layer in model.layers:
            x = layer.forward(x)
        return np.array(x)
    finally:
        model.train()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_predict_folds_every_norm_and_gives_the_unfolded_values_in_float64(layout, bias, rng):
    model = convnet(layout, rng, bias=bias).astype(np.float64)
    x = rng.standard_normal((8, 3, 16, 16))
    if layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    expected = softmax(unfolded_eval(model, x))
    t = trainer(model)
    counter = CallCounter(norms(model))
    got = t.predict(x)
    assert counter.calls == 0  # every BatchNorm2d ran inside the op before it
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(t.predict(x[:1]), expected[:1], rtol=1e-12, atol=1e-14)  # batch 1, planned anew


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_float32_predict_stays_as_close_to_float64_as_the_unfolded_run(layout, rng):
    model = convnet(layout, rng)
    x = rng.standard_normal((8, 3, 16, 16)).astype(np.float32)
    if layout == "NHWC":
        x = np.ascontiguousarray(x.transpose(0, 2, 3, 1))
    exact = unfolded_eval(model.astype(np.float64), x.astype(np.float64))
    model.astype(np.float32)
    unfolded_error = np.abs(unfolded_eval(model, x) - exact).max()
    counter = CallCounter(norms(model))
    with folding.folding():
        model.eval()
        folded_error = np.abs(np.array(model.forward(x)) - exact).max()
        model.train()
    assert counter.calls == 0  # the folded run was the one measured
    assert folded_error <= 4 * max(unfolded_error, 1e-6 * np.abs(exact).max())


def test_training_and_evaluate_around_predict_run_the_layers_as_written(rng):
    x = rng.standard_normal((16, 3, 16, 16)).astype(np.float32)
    y = rng.integers(0, 5, 16)
    folded, plain = convnet("NCHW", np.random.default_rng(3)), convnet("NCHW", np.random.default_rng(3))
    t_folded, t_plain = trainer(folded), trainer(plain)
    counter = CallCounter(norms(folded))
    for step in range(3):
        assert t_folded.train_step(x[:8], y[:8]) == pytest.approx(t_plain.train_step(x[:8], y[:8]), rel=1e-6)
        assert counter.calls == 4 * (step + 1)  # training normalises with the batch: never folded
        t_folded.predict(x)
        assert counter.calls == 4 * (step + 1)
    for a, b in zip(folded.parameters(), plain.parameters(), strict=True):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-5, atol=1e-6)
    metrics = t_folded.evaluate((x, y))
    assert counter.calls == 12
    assert metrics["loss"] == pytest.approx(t_plain.evaluate((x, y))["loss"], rel=1e-5)


def test_a_norm_without_running_statistics_is_not_folded(rng):
    model = convnet("NHWC", rng, track=False).astype(np.float64)
    x = rng.standard_normal((8, 16, 16, 3))
    expected = softmax(unfolded_eval(model, x))  # the first BatchNorm2d normalises with the batch's statistics
    counter = CallCounter(norms(model)[:1])
    np.testing.assert_allclose(trainer(model).predict(x), expected, rtol=1e-12, atol=1e-14)
    assert counter.calls == 1


def test_an_eval_forward_by_hand_keeps_its_backward(rng):
    """Frozen statistics with gradients (a fine-tuning, an input gradient) run outside predict: never folded."""
    model = convnet("NHWC", rng).astype(np.float64)
    model.eval()
    out = model.forward(rng.standard_normal((2, 16, 16, 3)))
    gx = model.backward(np.ones_like(out))
    assert gx.shape == (2, 16, 16, 3) and np.isfinite(gx).all()


def test_a_folded_pair_has_no_backward(rng):
    conv, bn = Conv2d(3, 4, 3, bias=False, layout="NHWC"), randomised(BatchNorm2d(4, layout="NHWC"), rng)
    (pair,) = folded_layers([conv, bn])
    assert isinstance(pair, NormFolded)
    bn.eval()
    pair.forward(rng.standard_normal((1, 5, 5, 3)).astype(np.float32))
    with pytest.raises(RuntimeError, match="no backward"):
        pair.backward(np.ones((1, 3, 3, 4), np.float32))


def test_only_a_producer_that_scales_its_output_pairs_with_a_norm_after_it(rng):
    conv, bn, relu = Conv2d(3, 4, 3, layout="NHWC"), BatchNorm2d(4, layout="NHWC"), ops.ReLU()
    assert [type(op) for op in folded_layers([bn, conv, relu, bn])] == [BatchNorm2d, Conv2d, ops.ReLU, BatchNorm2d]
    assert [type(op) for op in folded_layers([conv, bn, bn])] == [NormFolded, BatchNorm2d]


def test_folding_is_per_thread():
    seen: list[bool] = []
    with folding.folding():
        worker = threading.Thread(target=lambda: seen.append(folding.active()))
        worker.start()
        worker.join()
        assert folding.active()
    assert seen == [False] and not folding.active()


def test_forward_affine_refuses_an_activation_it_does_not_apply(rng):
    conv = Conv2d(3, 4, 1, layout="NHWC")
    with pytest.raises(ValueError, match="'relu' or None"):
        conv.forward_affine(np.ones((1, 2, 2, 3), np.float32), np.ones(4, np.float32), np.zeros(4, np.float32), "gelu")


def test_resnet_blocks_fold_their_own_pairs_in_predict(rng):
    """BasicBlock runs conv → BatchNorm itself (not through a Sequential): it folds both of its pairs, and the
    downsample's and the stem's fold through their Sequentials."""
    from neuroflow import registry

    nf.manual_seed(0)
    model = registry.models.get("resnet18")(num_classes=4).astype(np.float64)
    for bn in norms(model):
        randomised(bn, rng)
    x = rng.standard_normal((2, 3, 32, 32))
    expected = softmax(unfolded_eval(model, x))
    t = trainer(model)
    counter = CallCounter(norms(model))
    np.testing.assert_allclose(t.predict(x), expected, rtol=1e-11, atol=1e-14)
    assert counter.calls == 0


def test_a_norm_without_affine_parameters_folds_its_normalisation_alone(rng):
    nf.manual_seed(0)
    bn = BatchNorm2d(6, affine=False, layout="NHWC")
    bn.running_mean.data[...] = rng.standard_normal(6)
    bn.running_var.data[...] = rng.uniform(0.5, 2.0, 6)
    model = nf.Sequential(Conv2d(3, 6, 3, layout="NHWC"), bn, ops.Flatten(), ops.Linear(6 * 4 * 4, 3)).astype(np.float64)
    x = rng.standard_normal((4, 6, 6, 3))
    expected = softmax(unfolded_eval(model, x))
    counter = CallCounter([bn])
    np.testing.assert_allclose(trainer(model).predict(x), expected, rtol=1e-12, atol=1e-14)
    assert counter.calls == 0
