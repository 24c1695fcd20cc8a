"""What a steady training step no longer redoes, and that each thing it keeps is dropped when it stops holding.

A step checks the packing of the parameters, lends the pool to the model's modules and validates each op's
input from what the last full check found (``MemorySession.ready``, ``Operator.check_input``); these tests
change what those checks guard between steps (a frozen or unfrozen parameter, a replaced layer, a rebound
weight, a new dtype, a new model) and assert that the step sees the change as the first step would. Call
counts, not times: a steady step walks no parameter tree.
"""

from __future__ import annotations

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow.backends.selection import cpu_backend
from neuroflow.errors import ShapeError
from neuroflow.operator import Operator, structure_generation
from neuroflow.optim.base import CHUNK


def _mlp() -> ops.Sequential:
    return ops.Sequential(ops.Linear(12, 16), ops.ReLU(), ops.Linear(16, 8), ops.ReLU(), ops.Linear(8, 3))


def _data(n: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 12)).astype(np.float32), rng.integers(0, 3, n)


def _trainer(model: Operator, **settings) -> nf.Trainer:
    return nf.Trainer(model, nf.losses.CrossEntropy(), nf.optim.SGD(lr=0.1), batch_size=16, progress=False,
                      seed=0, **settings)


def test_a_steady_step_walks_no_parameter_tree_and_lends_the_pool_without_recursion(monkeypatch):
    x, y = _data()
    trainer = _trainer(_mlp())
    for _ in range(3):
        trainer.train_step(x, y)
    calls = {"named_parameters": 0, "attach_pool": 0}
    for name in calls:
        original = getattr(Operator, name)

        def counting(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Operator, name, counting)
    before = structure_generation()
    for _ in range(5):
        trainer.train_step(x, y)
    assert calls == {"named_parameters": 0, "attach_pool": 0}
    assert structure_generation() == before  # nothing in a step rebinds a parameter or a child


def test_freezing_and_unfreezing_a_parameter_between_steps_repacks():
    x, y = _data()
    model = _mlp()
    trainer = _trainer(model)
    trainer.train_step(x, y)
    first = model[0].weight
    first.requires_grad = False
    kept = first.data.copy()
    trainer.train_step(x, y)
    assert all(p is not first for p in trainer.memory.flat.params)
    np.testing.assert_array_equal(first.data, kept)
    first.requires_grad = True
    trainer.train_step(x, y)
    assert any(p is first for p in trainer.memory.flat.params)
    assert not np.array_equal(first.data, kept)


def test_a_layer_replaced_between_steps_is_trained():
    x, y = _data()
    model = _mlp()
    trainer = _trainer(model)
    trainer.train_step(x, y)
    new = ops.Linear(16, 8)
    setattr(model, "2", new)  # the child the parameters are walked through
    model.layers[2] = new  # and the layer Sequential runs
    before = new.weight.data.copy()
    trainer.train_step(x, y)
    assert any(p is new.weight for p in trainer.memory.flat.params)
    assert not np.array_equal(new.weight.data, before)
    assert new.buffer_pool is None  # lent for the call only, as every module is


def test_a_weight_rebound_by_hand_between_steps_is_packed_again():
    x, y = _data()
    model = _mlp()
    trainer = _trainer(model)
    trainer.train_step(x, y)
    weight = model[4].weight
    weight.data = np.zeros_like(weight.data)  # no longer a view of the flat buffer
    trainer.train_step(x, y)
    assert weight.data.base is not None
    assert np.any(weight.data != 0)  # trained from the zeros it was given


def test_use_model_forgets_what_the_last_packing_found():
    x, y = _data()
    trainer = _trainer(_mlp())
    trainer.train_step(x, y)
    other = _mlp()
    trainer.memory.use_model(other)
    trainer.train_step(x, y)
    assert trainer.memory.flat.params == other.trainable_parameters()


def test_structure_generation_moves_with_parameters_children_buffers_moves_and_casts():
    layer = ops.Linear(3, 2)
    seen = [structure_generation()]

    def moved() -> bool:
        seen.append(structure_generation())
        return seen[-1] != seen[-2]

    layer.extra = nf.Tensor(np.zeros(2, np.float32))
    assert moved()
    layer.child = ops.ReLU()
    assert moved()
    layer.register_buffer("stat", nf.Tensor(np.zeros(2, np.float32)))
    assert moved()
    layer.to(cpu_backend())
    assert moved()
    layer.astype(np.float64)
    assert moved()
    layer.note = "not a tensor"
    layer.forward(np.ones((1, 3)))
    assert not moved()


def test_check_input_keeps_refusing_what_it_refused_after_accepting_a_batch():
    layer = ops.Linear(4, 2)
    good = np.ones((5, 4), np.float32)
    layer.forward(good)
    layer.forward(good)  # accepted from the cache
    with pytest.raises(ShapeError, match=r"expected \(\*, 4\)"):
        layer.forward(np.ones((5, 3), np.float32))
    with pytest.raises(ShapeError, match="floating dtype"):
        layer.forward(np.ones((5, 4), np.int32))
    with pytest.raises(ShapeError, match="its parameters are float32"):
        layer.forward(np.ones((5, 4), np.float64))
    layer.forward(good)
    layer.weight.data = layer.weight.data.astype(np.float64)  # rebound by hand: no structure change recorded
    with pytest.raises(ShapeError, match="its parameters are float64"):
        layer.forward(good)
    with pytest.raises(ShapeError, match="expected an array"):
        layer.forward([[1.0] * 4])


def test_linear_backward_refuses_a_gradient_of_the_wrong_width():
    layer = ops.Linear(4, 2)
    layer.forward(np.ones((5, 4), np.float32))
    with pytest.raises(ShapeError, match="forward batch was 5"):
        layer.backward(np.ones((5, 3), np.float32))
    with pytest.raises(ShapeError, match="forward batch was 5"):
        layer.backward(np.ones((4, 2), np.float32))


def test_linear_on_a_batch_of_sequences_keeps_its_leading_shape():
    layer = ops.Linear(4, 3)
    x = np.random.default_rng(0).standard_normal((2, 5, 4)).astype(np.float64)
    layer.astype(np.float64)
    y = layer.forward(x)
    assert y.shape == (2, 5, 3)
    np.testing.assert_allclose(y, x @ layer.weight.data.T + layer.bias.data, rtol=1e-12)
    gx = layer.backward(np.ones_like(y))
    assert gx.shape == x.shape


def test_relu_gradient_is_zero_where_the_output_is_zero_or_nan():
    relu = ops.ReLU()
    x = np.array([[-1.0, 0.0, 2.0, np.nan, 3.0]], np.float32)
    relu.forward(x)
    g = relu.backward(np.full_like(x, 5.0))
    np.testing.assert_array_equal(g, [[0.0, 0.0, 5.0, 0.0, 5.0]])  # as PyTorch's threshold_backward


@pytest.mark.parametrize("labels", [np.array([0, 2, -1]), np.array([0, 3, 1]), np.array([0, 1, 2**40])])
def test_cross_entropy_names_labels_out_of_range(labels):
    loss = nf.losses.CrossEntropy()
    with pytest.raises(ShapeError, match=r"outside \[0, 3\): min"):
        loss.forward(np.zeros((3, 3), np.float32), labels)


@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.uint64, np.int64])
def test_cross_entropy_takes_labels_of_any_integer_dtype(dtype):
    loss = nf.losses.CrossEntropy()
    logits = np.random.default_rng(0).standard_normal((4, 3))
    labels = np.array([0, 1, 2, 1], dtype)
    value = loss.forward(logits, labels)
    shifted = logits - logits.max(axis=1, keepdims=True)
    expected = np.mean(np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(4), labels.astype(np.int64)])
    assert value == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_float32_loss_equals_the_numpy_mean_and_changes_batch_size(smoothing):
    loss = nf.losses.CrossEntropy(label_smoothing=smoothing)
    rng = np.random.default_rng(1)
    for n in (64, 7, 64):  # the per-row scratch follows the batch size
        logits = rng.standard_normal((n, 10)).astype(np.float32) * 3
        labels = rng.integers(0, 10, n)
        value = loss.forward(logits, labels)
        z = logits - logits.max(axis=1, keepdims=True)
        log_norm = np.log(np.exp(z).sum(axis=1))
        nll = float((log_norm - z[np.arange(n), labels]).mean())
        expected = (1 - smoothing) * nll + smoothing * float((log_norm - z.mean(axis=1)).mean()) if smoothing else nll
        assert value == pytest.approx(expected, rel=1e-6)
        if not smoothing:
            assert value == nll  # the same float32 arithmetic as numpy's mean, bit for bit
        g = loss.backward()
        target = np.full((n, 10), smoothing / 10, np.float32)
        target[np.arange(n), labels] += 1 - smoothing
        probs = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
        np.testing.assert_allclose(g, (probs - target) / n, atol=1e-7)


@pytest.mark.parametrize("size", [10, CHUNK, 2 * CHUNK + 5])
def test_plain_sgd_is_p_minus_lr_times_g_in_every_chunk(size):
    rng = np.random.default_rng(0)
    p = nf.Tensor(rng.standard_normal(size).astype(np.float32), requires_grad=True)
    g = rng.standard_normal(size).astype(np.float32)
    start = p.data.copy()
    opt = nf.optim.SGD(lr=0.05)
    flat = opt.bind_parameters([p])
    flat.grad[...] = g
    opt.step()
    np.testing.assert_array_equal(p.data, start - np.float32(0.05) * g)
    np.testing.assert_array_equal(flat.grad, g)  # the gradient is left as it was
