"""How users reach the ops: entry points, configs that rebuild them, readable names."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops, registry


@pytest.mark.parametrize("name", ["Elman", "WaveletElman", "GRU", "LSTM"])
def test_ops_resolve_through_entry_points(name: str) -> None:
    assert name in registry.ops.names()
    assert registry.ops.distribution(name) == "neuroflow-ops-recurrent"
    assert getattr(ops, name).__name__ == name


@pytest.mark.parametrize("op", [
    ops.Elman(3, 8, nonlinearity="relu", return_sequences=True, bptt_steps=4, stateful=True),
    ops.GRU(3, 8, bias=False),
    ops.LSTM(3, 8, bptt_steps=2),
    ops.WaveletElman(2, 8, levels=3, nonlinearity="morlet"),
], ids=repr)
def test_get_config_rebuilds_the_op(op: nf.Operator) -> None:
    rebuilt = type(op)(**op.get_config())
    assert repr(rebuilt) == repr(op)
    assert [(n, p.shape) for n, p in rebuilt.named_parameters()] == [(n, p.shape) for n, p in op.named_parameters()]


def test_repr_shows_sizes_and_non_default_options() -> None:
    assert repr(ops.Elman(1, 16)) == "Elman(1→16)"
    assert repr(ops.GRU(4, 8, return_sequences=True, bptt_steps=5)) == "GRU(4→8, return_sequences=True, bptt_steps=5)"
    assert repr(ops.WaveletElman(1, 8, nonlinearity="mexican_hat")) == (
        "WaveletElman(1→8, levels=2, nonlinearity='mexican_hat')")


def test_wavelet_elman_parameters() -> None:
    op = ops.WaveletElman(2, 5, levels=3, nonlinearity="morlet")
    shapes = dict((n, p.shape) for n, p in op.named_parameters())
    assert shapes == {"weight_ih_l0": (5, 8), "weight_hh_l0": (5, 5), "bias_ih_l0": (5,), "bias_hh_l0": (5,),
                      "translation": (5,), "dilation": (5,)}
    assert "translation" not in dict(ops.WaveletElman(2, 5).named_parameters())


def test_recurrent_layer_in_a_sequential_trains_end_to_end() -> None:
    nf.manual_seed(0)
    model = nf.Sequential(ops.LSTM(2, 8), ops.Linear(8, 1))
    x = np.random.default_rng(0).standard_normal((16, 5, 2)).astype(np.float32)
    target = x[:, :, 0].sum(axis=1, keepdims=True)
    loss = nf.losses.MSE()
    first = loss.forward(model.forward(x), target)
    for _ in range(60):
        model.zero_grad()
        loss.forward(model.forward(x), target)
        model.backward(loss.backward())
        for p in model.trainable_parameters():
            p.data -= 0.05 * p.grad
    assert loss.forward(model.forward(x), target) < 0.2 * first


@pytest.mark.parametrize("make", [
    lambda: ops.Elman(2, 8, bptt_steps=3),
    lambda: ops.WaveletElman(2, 8, levels=1, nonlinearity="morlet"),
    lambda: ops.LSTM(2, 8, return_sequences=True, stateful=True),
], ids=["elman-truncated", "wavelet-morlet", "lstm-stateful"])
def test_trainer_clips_recurrent_gradients(make: Any) -> None:
    """Global-norm clipping bounds a plain SGD step: the update's norm is lr × clip_grad_norm at most."""
    if not hasattr(nf, "Trainer") or not hasattr(nf.optim, "SGD"):  # pragma: no cover - the core provides both
        pytest.skip("this core has no Trainer/SGD")
    nf.manual_seed(0)
    model = nf.Sequential(make(), ops.Linear(8, 1))
    trainer = nf.Trainer(model, loss=nf.losses.MSE(), optimizer=nf.optim.SGD(lr=1.0), batch_size=4,
                         clip_grad_norm=1e-3, progress=False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8, 2)).astype(np.float32)
    y = rng.standard_normal(model.output_shape(x.shape)).astype(np.float32) * 10
    before = [p.data.copy() for p in model.parameters()]
    trainer.train_step(x, y)
    step = np.sqrt(sum(float(((p.data - b) ** 2).sum()) for p, b in zip(model.parameters(), before)))
    assert 0 < step <= 1e-3 * 1.001
