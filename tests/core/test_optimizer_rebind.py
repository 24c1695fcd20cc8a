"""Freezing (or unfreezing) a layer between steps packs the parameters again; the optimizer keeps the state of
every parameter still training and its step count, as PyTorch's optimizer does for the parameters it still updates."""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops


def _model():
    nf.manual_seed(0)
    return nf.Sequential(ops.Linear(12, 16), ops.ReLU(), ops.Linear(16, 8), ops.ReLU(), ops.Linear(8, 3))


def _batch(step):
    rng = np.random.default_rng(step)
    return rng.standard_normal((16, 12)).astype(np.float32), rng.integers(0, 3, 16)


OPTIMIZERS = {
    "sgd-momentum": lambda: nf.optim.SGD(lr=0.05, momentum=0.9),
    "adam": lambda: nf.optim.Adam(lr=1e-2),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_freezing_a_layer_keeps_the_others_optimizer_state(name):
    """Run A freezes layer 0 after 5 steps; run B keeps training it but puts its weights back after every step:
    both forwards are the same, so the other layers must train identically, momentum and step count carried on
    (with the state reset at the repack, their next updates would differ)."""
    frozen, restored = _model(), _model()
    a = nf.Trainer(frozen, optimizer=OPTIMIZERS[name](), progress=False, replay_steps=False)
    b = nf.Trainer(restored, optimizer=OPTIMIZERS[name](), progress=False, replay_steps=False)
    for step in range(5):
        assert a.train_step(*_batch(step)) == b.train_step(*_batch(step))
    first = frozen.layers[0]
    first.weight.requires_grad = first.bias.requires_grad = False
    kept = [p.data.copy() for p in restored.layers[0].parameters()]
    for step in range(5, 12):
        assert a.train_step(*_batch(step)) == b.train_step(*_batch(step))
        for p, value in zip(restored.layers[0].parameters(), kept, strict=True):
            p.data[...] = value
    assert a.optimizer.step_count == b.optimizer.step_count == 12
    for p, q in zip(frozen.parameters(), restored.parameters(), strict=True):
        np.testing.assert_array_equal(p.data, q.data)


def test_a_layer_unfrozen_starts_with_fresh_state_and_the_others_keep_theirs():
    model = _model()
    trainer = nf.Trainer(model, optimizer=nf.optim.SGD(lr=0.05, momentum=0.9), progress=False)
    first = model.layers[0]
    first.weight.requires_grad = first.bias.requires_grad = False
    for step in range(3):
        trainer.train_step(*_batch(step))
    opt = trainer.optimizer
    last = model.layers[4]
    before = opt.state["momentum_buffer"][opt.flat.slices[opt.flat.params.index(last.weight)]].copy()
    assert np.abs(before).max() > 0
    first.weight.requires_grad = first.bias.requires_grad = True
    trainer.train_step(*_batch(3))  # packed again: layer 0 joins with zero momentum, then this step's gradient
    flat = opt.flat
    assert first.weight in flat.params
    momentum = opt.state["momentum_buffer"]
    grad = flat.grad[flat.slices[flat.params.index(first.weight)]]
    np.testing.assert_array_equal(momentum[flat.slices[flat.params.index(first.weight)]], grad)  # first step: buf = g
    g_last = flat.grad[flat.slices[flat.params.index(last.weight)]]
    np.testing.assert_allclose(momentum[flat.slices[flat.params.index(last.weight)]], 0.9 * before + g_last,
                               rtol=1e-6)
    assert opt.step_count == 4
