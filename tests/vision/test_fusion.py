"""Activation fusion: a ReLU next to a BatchNorm2d or MaxPool2d runs inside it, with identical values and gradients."""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.fusion import ActivationFused, fuse
from neuroflow_ops_vision import BatchNorm2d, Conv2d, MaxPool2d

from .model_step import forward_backward


def pytorch_style(layout: str = "NHWC", seed: int = 0) -> nf.Sequential:
    """Conv → ReLU → MaxPool and Conv → BN → ReLU, as a PyTorch user writes them."""
    nf.manual_seed(seed)
    return nf.Sequential(
        Conv2d(3, 8, 3, padding=1, output_layout=layout), ops.ReLU(), MaxPool2d(2, layout=layout),
        Conv2d(8, 16, 3, padding=1, layout=layout), BatchNorm2d(16, layout=layout), ops.ReLU(),
        MaxPool2d(2, layout=layout), ops.ReLU(),  # a ReLU after an op that already applied one: absorbed too
        ops.Flatten(), ops.Linear(16 * 4 * 4, 5),
    )


def batch(n: int = 6, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, 16, 16)).astype(np.float32), rng.integers(0, 5, n)


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
def test_fused_run_gives_the_unfused_values_and_gradients_bit_for_bit(layout):
    x, y = batch()
    plain, fused = pytorch_style(layout), pytorch_style(layout)
    assert fuse(fused) == 3
    run = fused._run
    assert [type(layer).__name__ for layer in run] == [
        "Conv2d", "ActivationFused", "Conv2d", "ActivationFused", "ActivationFused", "Flatten", "Linear"]
    assert run[1].op is fused[2] and run[3].op is fused[4] and run[4].op is fused[6]
    for a, b in zip(forward_backward(plain, x, y), forward_backward(fused, x, y)):
        np.testing.assert_array_equal(a, b)


def test_fusing_leaves_the_model_as_written(tmp_path):
    model = pytorch_style()
    before = (repr(model), [layer.get_config() for layer in model], list(model.state_dict()))
    fuse(model)
    x, y = batch()
    forward_backward(model, x, y)
    assert (repr(model), [layer.get_config() for layer in model], list(model.state_dict())) == before
    assert model[2].activation is None and model[4].activation is None  # only during each call
    nf.save(model, tmp_path / "m.safetensors")
    loaded = nf.load(tmp_path / "m.safetensors")
    assert [type(layer) for layer in loaded] == [type(layer) for layer in model]


def test_a_sequential_changed_after_fusing_runs_its_layers_as_they_are():
    model = pytorch_style()
    fuse(model)
    model.layers[5] = ops.Tanh()  # the BatchNorm's ReLU is now a Tanh: nothing may absorb it
    assert model._run is model.layers
    x, _ = batch()
    out = model.forward(x)
    assert np.isfinite(out).all()


def test_the_first_layer_is_never_absorbed_and_other_activations_are_left_alone():
    nf.manual_seed(0)
    model = nf.Sequential(ops.ReLU(), MaxPool2d(2), Conv2d(3, 4, 3), ops.Tanh(), MaxPool2d(2),
                          BatchNorm2d(4), ops.LeakyReLU(0.1))
    assert fuse(model) == 0 and model._run is model.layers


def test_the_trainer_fuses_and_the_plan_shrinks_to_that_of_the_hand_fused_model():
    x, y = batch(16)
    arenas = {}
    for name in ("pytorch style", "hand fused"):
        model = pytorch_style()
        if name == "hand fused":
            conv1, _, _, conv2, bn, _, _, _, flatten, linear = model.layers
            model = nf.Sequential(conv1, MaxPool2d(2, layout="NHWC", activation="relu"), conv2,
                                  BatchNorm2d(16, activation="relu", layout="NHWC"),
                                  MaxPool2d(2, layout="NHWC", activation="relu"), flatten, linear)
        trainer = nf.Trainer(model, optimizer=nf.optim.SGD(lr=0.1), batch_size=16, progress=False, seed=0)
        trainer.train_step(x, y)
        arenas[name] = trainer.memory.plan.arena_bytes
        if name == "pytorch style":
            assert any(isinstance(layer, ActivationFused) for layer in model._run)
    assert arenas["pytorch style"] == arenas["hand fused"]
