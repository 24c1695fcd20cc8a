"""Trainer(update_in_backward=True): updates applied as backward produces each whole gradient."""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.errors import ConfigError


def mlp(seed: int = 0) -> nf.Sequential:
    nf.manual_seed(seed)
    return nf.Sequential(ops.Linear(12, 32), ops.ReLU(), ops.Linear(32, 16), ops.Tanh(), ops.Linear(16, 4))


def blobs(n: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    return (rng.standard_normal((n, 12)) + y[:, None]).astype(np.float32), y


OPTIMIZERS = {
    "sgd": lambda: nf.optim.SGD(lr=0.05),
    "momentum": lambda: nf.optim.SGD(lr=0.05, momentum=0.9),
    "nesterov+decay": lambda: nf.optim.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
    "adam": lambda: nf.optim.Adam(lr=1e-2),
    "adamw": lambda: nf.optim.AdamW(lr=1e-2),
}


def train(update_in_backward: bool, optimizer, make=mlp, data=None, **kwargs):
    x, y = blobs() if data is None else data
    trainer = nf.Trainer(make(), nf.losses.CrossEntropy(), optimizer(), batch_size=16, seed=1, progress=False,
                         update_in_backward=update_in_backward, **kwargs)
    history = trainer.fit((x, y), epochs=3)  # 16 + 16 + 8: a short last batch every epoch
    return trainer, [p.data.copy() for p in trainer.model.parameters()], history


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_the_same_weights_and_losses_as_updating_after_backward(name: str) -> None:
    plain, expected, expected_history = train(False, OPTIMIZERS[name])
    streaming, weights, history = train(True, OPTIMIZERS[name])
    for a, b in zip(expected, weights):
        np.testing.assert_array_equal(a, b)
    assert [e["loss"] for e in history] == [e["loss"] for e in expected_history]
    assert streaming.optimizer.step_count == plain.optimizer.step_count == 9


def test_the_same_weights_under_a_learning_rate_schedule() -> None:
    runs = []
    for update_in_backward in (False, True):
        scheduler = nf.schedulers.Step(step_size_steps=2, gamma=0.5)  # the rate changes within each epoch
        _, weights, _ = train(update_in_backward, OPTIMIZERS["momentum"], scheduler=scheduler)
        runs.append(weights)
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_streamed_gradients_are_not_kept_and_the_gradient_buffer_shrinks() -> None:
    trainer, _, _ = train(True, OPTIMIZERS["momentum"])
    # every parameter of an MLP is a linear layer's, written whole: none keeps a gradient
    assert all(p.grad is None for p in trainer.model.parameters())
    assert trainer.flat_parameters.grad.size == 0
    assert trainer.flat_parameters.data.size == sum(p.data.size for p in trainer.model.parameters())


def test_a_repacked_model_finds_its_streamed_parameters_again() -> None:
    """Freezing a layer packs the parameters anew (every gradient kept); the next step runs as usual and
    streams again after it: the weights stay those of updating after backward."""
    runs = []
    x, y = blobs()
    for update_in_backward in (False, True):
        trainer, _, _ = train(update_in_backward, OPTIMIZERS["momentum"])
        trainer.model[0].weight.requires_grad = False
        for _ in range(3):
            trainer.train_step(x[:16], y[:16])
        runs.append([p.data.copy() for p in trainer.model.parameters()])
        if update_in_backward:
            assert trainer.model[0].weight.grad is None and trainer.model[2].weight.grad is None
            assert trainer.flat_parameters.data.size == sum(p.data.size for p in trainer.model.trainable_parameters())
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(("option", "value", "named"), [
    ("clip_grad_norm", 1.0, "clip_grad_norm"),
    ("gradient_accumulation_steps", 2, "gradient_accumulation_steps > 1"),
    ("gradient_compression", "topk", "gradient_compression"),
    ("enable_async_unload", True, "enable_async_unload"),
])
def test_options_that_need_every_gradient_first_are_refused(option: str, value, named: str) -> None:
    extra = {"compression_ratio": 0.1} if option == "gradient_compression" else {}
    with pytest.raises(ConfigError, match=rf"update_in_backward .* cannot be combined with {named}"):
        nf.Trainer(mlp(), optimizer=nf.optim.SGD(lr=0.1), update_in_backward=True, **{option: value}, **extra)


def test_a_model_whose_gradients_are_not_written_once_is_refused_after_the_first_step(monkeypatch) -> None:
    """When the runtime cannot promise one write per gradient and step (a layer used twice), there is no
    whole gradient to update from: the first step says so."""
    trainer = nf.Trainer(mlp(), nf.losses.CrossEntropy(), nf.optim.SGD(lr=0.1), batch_size=16, progress=False,
                         update_in_backward=True)
    monkeypatch.setattr(trainer.memory, "grads_zeroed", lambda: False)
    x, y = blobs()
    with pytest.raises(ConfigError, match="one micro-batch, and no layer used twice"):
        trainer.train_step(x[:16], y[:16])


def test_a_non_finite_loss_counts_no_step_and_changes_no_weight() -> None:
    from neuroflow.errors import NonFiniteLossError

    trainer, _, _ = train(True, OPTIMIZERS["adam"])
    counted = trainer.optimizer.step_count
    x, y = blobs()
    x[0, 0] = np.nan
    before = [p.data.copy() for p in trainer.model.parameters()]
    with pytest.raises(NonFiniteLossError):
        trainer.train_step(x[:16], y[:16])
    assert trainer.optimizer.step_count == counted  # Adam's bias correction is not thrown off by one
    for a, p in zip(before, trainer.model.parameters()):
        np.testing.assert_array_equal(a, p.data)
