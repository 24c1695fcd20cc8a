"""LoRA adapters: gradients, frozen bases, apply_lora on model trees, fuse/unfuse, memory, a real fine-tune."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.lora import LoRAConv2d, LoRAError, LoRALinear
from neuroflow.memory.profile import trace_step
from neuroflow.testing import OpTestCase, gradcheck

HAS_VISION = importlib.util.find_spec("neuroflow_ops_vision") is not None
needs_vision = pytest.mark.skipif(not HAS_VISION, reason="neuroflow-ops-vision is not installed")


def trained_b(adapter, seed=1):
    """Give B non-zero values: at B = 0 the gradient of A is zero and checks nothing."""
    adapter.lora_B.data[...] = np.random.default_rng(seed).standard_normal(adapter.lora_B.shape)
    return adapter


def mlp(*sizes):
    layers = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers += [ops.Linear(a, b)] + ([ops.ReLU()] if i < len(sizes) - 2 else [])
    return nf.Sequential(*layers)


def batch(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- gradients
class TestLoRALinear(OpTestCase):
    input_shapes = [(6, 9)]

    def make_op(self):
        nf.manual_seed(0)
        return trained_b(LoRALinear(ops.Linear(9, 7), rank=3, alpha=6))


class TestLoRALinearDropout3D(OpTestCase):
    input_shapes = [(2, 4, 9)]

    def make_op(self):
        nf.manual_seed(0)
        return trained_b(LoRALinear(ops.Linear(9, 5), rank=2, alpha=3, dropout=0.25, seed=7))

    def prepare(self, op):
        op.lora_dropout.rng = np.random.default_rng(3)


@needs_vision
@pytest.mark.parametrize("layout, output_layout", [("NCHW", None), ("NHWC", None), ("NCHW", "NHWC")])
def test_lora_conv2d_gradcheck_in_every_layout(layout, output_layout):
    nf.manual_seed(0)
    conv = ops.Conv2d(3, 6, 3, stride=2, padding=1, layout=layout, output_layout=output_layout)
    adapter = trained_b(LoRAConv2d(conv, rank=2, alpha=4, dropout=0.2, seed=3))
    x = np.random.default_rng(2).standard_normal((2, 3, 7, 6) if layout == "NCHW" else (2, 7, 6, 3))
    gradcheck(adapter, x, prepare=lambda: setattr(adapter.lora_dropout, "rng", np.random.default_rng(5)))
    assert conv.weight.grad is None and conv.bias.grad is None
    assert adapter.lora_A.shape == (2, 3, 3, 3) and adapter.lora_B.shape == (6, 2)


def test_only_the_adapter_gets_gradients_and_the_frozen_weight_gemm_is_skipped():
    nf.manual_seed(0)
    model = nf.lora.apply_lora(mlp(12, 10, 4), rank=2)
    grads = {name: p.requires_grad for name, p in model.named_parameters()}
    assert grads == {"0.weight": False, "0.bias": False, "0.lora_A": True, "0.lora_B": True,
                     "2.weight": False, "2.bias": False, "2.lora_A": True, "2.lora_B": True}
    model.forward(batch((5, 12)))
    model.backward(batch((5, 4), seed=1))
    for name, p in model.named_parameters():
        assert (p.grad is not None) == p.requires_grad, name
    # The traced step asks for no weight- or bias-gradient buffer of a frozen base, and the first layer's
    # input gradient (which the Trainer never needs) is not computed either.
    slots = trace_step(model, nf.losses.CrossEntropy(), (5, 12))
    bases = {id(model[0].base): "0", id(model[2].base): "2"}
    asked = {(bases[id(s.owner)], s.key) for s in slots if id(s.owner) in bases}
    assert asked == {("0", "y"), ("2", "y"), ("2", "gx")}
    assert not any(s.owner is model[0].lora_down and s.key == "gx" for s in slots)


def test_lora_alone_equals_the_low_rank_formula():
    nf.manual_seed(0)
    adapter = trained_b(LoRALinear(ops.Linear(8, 6), rank=3, alpha=12))
    x = batch((4, 8)).astype(np.float64)
    adapter.astype(np.float64)
    w, b = adapter.weight.data, adapter.bias.data
    a, bb = adapter.lora_A.data, adapter.lora_B.data
    np.testing.assert_allclose(adapter.forward(x), x @ w.T + b + 4.0 * x @ a.T @ bb.T, rtol=1e-12)


def test_dropout_applies_in_training_only():
    nf.manual_seed(0)
    adapter = trained_b(LoRALinear(ops.Linear(30, 6), rank=4, dropout=0.5))
    plain = copy.deepcopy(adapter)
    plain.lora_dropout.p = 0.0
    x = batch((8, 30))
    assert not np.allclose(adapter.forward(x), plain.forward(x))
    adapter.eval()
    plain.eval()
    np.testing.assert_array_equal(adapter.forward(x), plain.forward(x))


# --------------------------------------------------------------------------- apply_lora
def test_apply_lora_starts_identical_and_keeps_the_original_names():
    nf.manual_seed(0)
    model = mlp(20, 16, 5)
    x = batch((7, 20))
    before = model.forward(x).copy()
    original = {k: v.copy() for k, v in model.state_dict().items()}
    assert nf.lora.apply_lora(model, rank=4, alpha=8) is model
    np.testing.assert_array_equal(model.forward(x), before)
    state = model.state_dict()
    assert list(state) == ["0.weight", "0.bias", "0.lora_A", "0.lora_B", "2.weight", "2.bias", "2.lora_A", "2.lora_B"]
    assert state["0.lora_A"].shape == (4, 20) and state["0.lora_B"].shape == (16, 4)
    assert not state["0.lora_B"].any()
    bound = 1 / np.sqrt(20)  # Kaiming-uniform, a=√5
    assert 0 < np.abs(state["0.lora_A"]).max() <= bound
    for name, value in original.items():
        np.testing.assert_array_equal(state[name], value)
    # Sequential's children are both attributes and its layers list.
    assert model.layers[0] is getattr(model, "0") and isinstance(model.layers[0], LoRALinear)
    assert model[0].in_features == 20 and model[0].weight is model[0].base.weight  # reads like its Linear


def test_apply_lora_inside_residual_and_concat_and_by_path_or_callable():
    nf.manual_seed(0)
    inner = nf.Sequential(ops.Linear(8, 8), ops.ReLU())
    model = nf.Sequential(nf.Residual(inner), nf.Concat(ops.Linear(8, 3), ops.Linear(8, 2)), ops.Linear(5, 4))
    x = batch((3, 8))
    before = model.forward(x).copy()
    nf.lora.apply_lora(model, targets=["0.block.0", "1.1"])
    assert isinstance(inner[0], LoRALinear) and inner.layers[0] is getattr(inner, "0")
    concat = model[1]
    assert isinstance(concat.branches[1], LoRALinear) and concat.branches[1] is getattr(concat, "1")
    assert not isinstance(concat.branches[0], LoRALinear) and not isinstance(model[2], LoRALinear)
    np.testing.assert_array_equal(model.forward(x), before)
    model.backward(batch((3, 4)))  # the tree still runs backward

    nf.lora.apply_lora(model, targets=lambda path, op: path == "2")
    assert isinstance(model[2], LoRALinear)
    assert sorted(n for n, p in model.named_parameters() if p.requires_grad) == [
        "0.block.0.lora_A", "0.block.0.lora_B", "1.0.bias", "1.0.weight",
        "1.1.lora_A", "1.1.lora_B", "2.lora_A", "2.lora_B"]


def test_a_single_layer_model_is_returned_as_its_adapter():
    layer = ops.Linear(4, 3)
    adapted = nf.lora.apply_lora(layer)
    assert isinstance(adapted, LoRALinear) and adapted.base is layer
    assert nf.lora.fuse(adapted) is layer


def test_wrong_targets_say_what_exists():
    model = mlp(6, 5, 3)
    with pytest.raises(LoRAError, match=r"'Lineer' is neither a layer path nor an op type.*Linear.*0 \(Linear"):
        nf.lora.apply_lora(model, targets=("Lineer",))
    with pytest.raises(LoRAError, match=r"no layer matched targets=\('Softmax',\); layers that can take an adapter: 0 "):
        nf.lora.apply_lora(model, targets=("Softmax",))
    with pytest.raises(LoRAError, match=r"layer 1 \(ReLU\(\)\) cannot take a LoRA adapter"):
        nf.lora.apply_lora(model, targets=["1"])
    with pytest.raises(LoRAError, match="rank must be a positive integer; got 0"):
        nf.lora.apply_lora(model, rank=0)
    assert not any(isinstance(layer, LoRALinear) for layer in model)  # nothing changed by a refused call
    nf.lora.apply_lora(model)
    with pytest.raises(LoRAError, match="already has a LoRA adapter"):
        nf.lora.apply_lora(model, targets=["0"])
    with pytest.raises(LoRAError, match="no layer matched"):
        nf.lora.apply_lora(model)


@needs_vision
def test_conv_targets_are_matched_by_exact_type_and_grouped_convs_refused():
    nf.manual_seed(0)
    model = nf.Sequential(ops.Conv2d(3, 8, 3, padding=1), ops.DepthwiseConv2d(8, 3, padding=1),
                          ops.Conv2d(8, 4, 1, groups=2), ops.Flatten(), ops.Linear(4 * 5 * 5, 3))
    with pytest.raises(LoRAError, match=r"layer 2 .* grouped convolution \(groups=2\)"):
        nf.lora.apply_lora(model, targets=("Conv2d",))
    x = batch((2, 3, 5, 5))
    before = model.forward(x).copy()
    nf.lora.apply_lora(model, targets=["0", "4"])
    assert [type(layer).__name__ for layer in model] == [
        "LoRAConv2d", "DepthwiseConv2d", "Conv2d", "Flatten", "LoRALinear"]
    np.testing.assert_array_equal(model.forward(x), before)


# --------------------------------------------------------------------------- training
def test_training_changes_only_the_adapters():
    nf.manual_seed(0)
    model = nf.lora.apply_lora(mlp(20, 16, 5), rank=4)
    before = {name: p.data.copy() for name, p in model.named_parameters()}
    trainer = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=1e-2, weight_decay=0.1), batch_size=8, progress=False)
    x, y = batch((32, 20)), np.arange(32) % 5
    losses = [trainer.train_step(x, y) for _ in range(5)]
    assert losses[-1] < losses[0]
    for name, p in model.named_parameters():
        changed = not np.array_equal(before[name], p.data)
        assert changed == ("lora" in name), name
    # Only the adapters are packed: no gradient buffer or optimizer state for the frozen base.
    adapters = sum(p.data.size for name, p in model.named_parameters() if "lora" in name)
    assert trainer.flat_parameters.size == adapters
    # A steady-state step allocates nothing.
    allocations = trainer.memory_stats().allocations
    trainer.train_step(x, y)
    assert trainer.memory_stats().allocations == allocations


def test_mark_only_lora_as_trainable_freezes_everything_else():
    model = nf.Sequential(ops.Linear(6, 6), ops.ReLU(), ops.Linear(6, 2))
    nf.lora.apply_lora(model, targets=["0"])
    assert nf.lora.mark_only_lora_as_trainable(model) == ["2.weight", "2.bias"]
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["0.lora_A", "0.lora_B"]
    with pytest.raises(LoRAError, match="no LoRA adapters"):
        nf.lora.mark_only_lora_as_trainable(mlp(3, 2))


# --------------------------------------------------------------------------- fuse / unfuse
def test_fuse_equals_the_adapted_model_and_unfuse_restores_it():
    nf.manual_seed(0)
    original = mlp(20, 16, 5)
    names = list(original.state_dict())
    model = nf.lora.apply_lora(copy.deepcopy(original), rank=4, alpha=8)
    for layer in (model[0], model[2]):
        trained_b(layer)
    x = batch((9, 20))
    adapted = model.forward(x).copy()
    weights = {k: v.copy() for k, v in model.state_dict().items()}

    assert nf.lora.fuse(model) is model
    assert [type(layer).__name__ for layer in model] == ["Linear", "ReLU", "Linear"]
    assert list(model.state_dict()) == names  # loads into the original model (or PyTorch) by name
    np.testing.assert_allclose(model.forward(x), adapted, rtol=1e-5, atol=1e-5)
    assert all(p.requires_grad for p in model.parameters())  # as before apply_lora
    expected = weights["0.weight"] + 2.0 * weights["0.lora_B"] @ weights["0.lora_A"]
    np.testing.assert_allclose(model[0].weight.data, expected, rtol=1e-6, atol=1e-6)

    assert nf.lora.unfuse(model) is model
    assert [type(layer).__name__ for layer in model] == ["LoRALinear", "ReLU", "LoRALinear"]
    np.testing.assert_allclose(model.forward(x), adapted, rtol=1e-5, atol=1e-5)
    for name, value in model.state_dict().items():
        np.testing.assert_allclose(value, weights[name], rtol=0, atol=1e-6, err_msg=name)
    assert not any(p.requires_grad for name, p in model.named_parameters() if "lora" not in name)
    with pytest.raises(LoRAError, match="no fused LoRA layers"):
        nf.lora.unfuse(original)
    with pytest.raises(LoRAError, match="no LoRA adapters"):
        nf.lora.fuse(original)


def test_fuse_merges_half_precision_weights_in_float32():
    nf.manual_seed(0)
    adapter = trained_b(LoRALinear(ops.Linear(16, 8), rank=4, alpha=4))
    reference = adapter.weight.data.astype(np.float32) + adapter.delta_weight()
    adapter.astype(np.float16)
    assert adapter.delta_weight().dtype == np.float32
    layer = nf.lora.fuse(adapter)
    assert layer.weight.data.dtype == np.float16
    np.testing.assert_allclose(layer.weight.data, reference, rtol=1e-3, atol=1e-3)


@needs_vision
def test_fused_conv_equals_the_adapted_conv():
    nf.manual_seed(0)
    model = nf.Sequential(ops.Conv2d(3, 8, 3, stride=2, padding=1, output_layout="NHWC"), ops.ReLU(),
                          ops.Conv2d(8, 4, 3, layout="NHWC"))
    model[0].keep_columns = True  # a user's choice the adapter suspends and fusing gives back
    nf.lora.apply_lora(model, targets=("Conv2d",), rank=2)
    for i in (0, 2):
        trained_b(model[i], seed=i)
    x = batch((2, 3, 9, 9))
    adapted = model.forward(x).copy()
    # A frozen conv keeps no im2col columns for a weight gradient it never computes; fused, it does again.
    assert not model[0].base.keep_columns
    nf.lora.fuse(model)
    assert model[0].keep_columns
    np.testing.assert_allclose(model.forward(x), adapted, rtol=1e-5, atol=1e-5)


def test_quantized_weights_refuse_apply_and_fuse(tmp_path: Path):
    nf.manual_seed(0)
    path = tmp_path / "mlp.safetensors"
    nf.save(mlp(6, 4, 2), path, quantize="int8")
    loaded = nf.load(path)
    with pytest.raises(LoRAError, match=r"cannot apply LoRA: .*INT8.*Quantize after fusing"):
        nf.lora.apply_lora(loaded)
    adapted = nf.lora.apply_lora(mlp(6, 4, 2))
    object.__setattr__(adapted, "_neuroflow_quantization", "int8")  # as nf.load marks a model from an INT8 file
    with pytest.raises(LoRAError, match="cannot fuse LoRA adapters"):
        nf.lora.fuse(adapted)


def test_an_adapted_model_saves_and_loads(tmp_path: Path):
    nf.manual_seed(0)
    model = nf.lora.apply_lora(mlp(6, 5, 3), rank=2, alpha=3, dropout=0.1)
    trained_b(model[0])
    config = model[0].get_config()
    assert config == {"rank": 2, "alpha": 3.0, "dropout": 0.1, "seed": model[0].lora_dropout.seed}
    rebuilt = LoRALinear(copy.deepcopy(model[0].base), **config)
    assert rebuilt.get_config() == config
    nf.save(model, tmp_path / "lora.safetensors")
    loaded = nf.load(tmp_path / "lora.safetensors")
    loaded.eval()
    model.eval()
    x = batch((4, 6))
    np.testing.assert_array_equal(loaded.forward(x), model.forward(x))
    assert [n for n, p in loaded.named_parameters() if p.requires_grad] == [
        n for n, p in model.named_parameters() if p.requires_grad]


# --------------------------------------------------------------------------- memory
def test_planned_peak_of_lora_fine_tuning_is_far_below_full_fine_tuning():
    nf.manual_seed(0)
    full = mlp(784, 1024, 1024, 10)
    lora = nf.lora.apply_lora(copy.deepcopy(full), rank=8)
    loss, optimizer = nf.losses.CrossEntropy(), nf.optim.AdamW()
    full_report = nf.memory.profile(full, (64, 784), loss, optimizer)
    lora_report = nf.memory.profile(lora, (64, 784), loss, optimizer)
    adapters = sum(p.data.size for name, p in lora.named_parameters() if "lora" in name)
    weights = sum(p.data.size for p in full.parameters())
    # Gradients and optimizer state for the adapters only; the frozen weights count once, as parameters.
    assert lora_report.gradient_bytes == 4 * adapters
    assert lora_report.optimizer_bytes == optimizer.state_nbytes(adapters, 4)
    assert lora_report.parameter_bytes == 4 * (weights + adapters)
    assert full_report.gradient_bytes == 4 * weights
    assert full_report.optimizer_bytes == optimizer.state_nbytes(weights, 4)
    saved = 1 - lora_report.predicted_peak_bytes / full_report.predicted_peak_bytes
    # Full: weights + gradients + AdamW's two moments = 4 weight-sized buffers (the update's scratch is one
    # small chunk); LoRA keeps 1, plus activations both need: at least 3/4 of 90 % of the peak goes.
    assert saved > 0.65, saved


# --------------------------------------------------------------------------- a real fine-tune
def _first(dataset, n):
    return dataset[np.arange(n)]


def test_lora_fine_tune_of_an_mnist_mlp_learns_fashion_mnist():
    try:
        mnist, fashion, fashion_test = (nf.data.mnist("train"), nf.data.fashion_mnist("train"),
                                        nf.data.fashion_mnist("test"))
    except FileNotFoundError as exc:
        pytest.skip(f"MNIST or Fashion-MNIST is not on this machine: {exc}")
    nf.manual_seed(0)
    model = mlp(784, 128, 10)
    pretrain = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=2e-3), batch_size=128, progress=False, seed=0)
    pretrain.fit(_first(mnist, 12000), epochs=1)
    test = _first(fashion_test, 2000)
    untuned = pretrain.evaluate(test)["accuracy"]

    nf.lora.apply_lora(model, rank=8, alpha=16)
    tune = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=5e-3), batch_size=128, progress=False, seed=0)
    tune.fit(_first(fashion, 12000), epochs=1)
    tuned = tune.evaluate(test)["accuracy"]
    assert tuned > 0.6 and tuned > untuned + 0.35, (untuned, tuned)
    nf.lora.fuse(model)
    assert abs(nf.Trainer(model, progress=False).evaluate(test)["accuracy"] - tuned) < 0.005


def test_trainer_lora_fusion_trains_only_the_adapters_and_refuses_a_model_without_them():
    import neuroflow as nf
    from neuroflow import ops

    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(6, 32), ops.ReLU(), ops.Linear(32, 3))
    nf.lora.apply_lora(model, rank=2, targets=["0"])  # layer 2 is not adapted: lora_fusion freezes it too
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 6)).astype(np.float32), rng.integers(0, 3, 32)
    before = {name: p.data.copy() for name, p in model.named_parameters()}
    trainer = nf.Trainer(model, batch_size=16, lora_fusion=True, progress=False)
    trainer.fit((x, y), epochs=1)
    assert trainer.flat_parameters.size == 2 * 6 + 32 * 2
    changed = {name for name, p in model.named_parameters() if not np.array_equal(p.data, before[name])}
    assert changed == {"0.lora_B", "0.lora_A"} or changed == {"0.lora_B"}
    plain = nf.Sequential(ops.Linear(6, 3))
    with pytest.raises(nf.lora.LoRAError, match="no LoRA adapters"):
        nf.Trainer(plain, lora_fusion=True, progress=False).train_step(x, y)
