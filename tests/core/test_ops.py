"""Core ops: float64 gradient checks, backend parity, references, stress over shapes, and errors."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neuroflow as nf
from neuroflow import ops
from neuroflow.errors import ShapeError
from neuroflow.testing import GradcheckError, OpTestCase, gradcheck


class TestLinear(OpTestCase):
    input_shapes = [(5, 7)]

    def make_op(self):
        return ops.Linear(7, 3)


class TestLinearNoBias3D(OpTestCase):
    input_shapes = [(2, 4, 6)]

    def make_op(self):
        return ops.Linear(6, 5, bias=False)


class TestReLU(OpTestCase):
    input_shapes = [(4, 9)]

    def make_op(self):
        return ops.ReLU()


class TestLeakyReLU(OpTestCase):
    input_shapes = [(4, 9)]

    def make_op(self):
        return ops.LeakyReLU(0.2)


class TestSigmoid(OpTestCase):
    input_shapes = [(3, 8)]

    def make_op(self):
        return ops.Sigmoid()


class TestTanh(OpTestCase):
    input_shapes = [(3, 8)]

    def make_op(self):
        return ops.Tanh()


class TestGELU(OpTestCase):
    input_shapes = [(3, 8)]

    def make_op(self):
        return ops.GELU()


class TestSoftmax(OpTestCase):
    input_shapes = [(4, 6)]

    def make_op(self):
        return ops.Softmax(axis=-1)


class TestSoftmaxAxis0(OpTestCase):
    input_shapes = [(5, 3)]

    def make_op(self):
        return ops.Softmax(axis=0)


class TestDropout(OpTestCase):
    input_shapes = [(6, 10)]

    def make_op(self):
        return ops.Dropout(0.3, seed=7)

    def prepare(self, op):
        op.rng = np.random.default_rng(op.seed)


class TestFlatten(OpTestCase):
    input_shapes = [(2, 3, 4, 5)]

    def make_op(self):
        return ops.Flatten()


class TestReshape(OpTestCase):
    input_shapes = [(2, 12)]

    def make_op(self):
        return ops.Reshape(3, -1)


class TestAdd(OpTestCase):
    input_shapes = [(3, 4), (3, 4)]

    def make_op(self):
        return ops.Add()


class TestSequential(OpTestCase):
    input_shapes = [(4, 6)]

    def make_op(self):
        return nf.Sequential(ops.Linear(6, 5), ops.Tanh(), ops.Linear(5, 2))


class TestResidualWithShortcut(OpTestCase):
    input_shapes = [(3, 4)]

    def make_op(self):
        return nf.Residual(nf.Sequential(ops.Linear(4, 6), ops.GELU()), shortcut=ops.Linear(4, 6, bias=False))


class TestConcat(OpTestCase):
    input_shapes = [(3, 4)]

    def make_op(self):
        return nf.Concat(ops.Linear(4, 2), ops.Sigmoid(), ops.Linear(4, 3), axis=-1)


def test_linear_matches_reference_and_accumulates():
    layer = ops.Linear(4, 3)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    w, b = layer.weight.data.copy(), layer.bias.data.copy()
    np.testing.assert_allclose(layer.forward(x), x @ w.T + b, rtol=1e-6)
    g = np.ones((5, 3), np.float32)
    gx = layer.backward(g)
    np.testing.assert_allclose(gx, g @ w, rtol=1e-6)
    np.testing.assert_allclose(layer.weight.grad, g.T @ x, rtol=1e-6)
    layer.forward(x)
    layer.backward(g)
    np.testing.assert_allclose(layer.weight.grad, 2 * g.T @ x, rtol=1e-6)
    np.testing.assert_allclose(layer.bias.grad, 2 * g.sum(0), rtol=1e-6)


def test_activation_values():
    x = np.array([[-2.0, -0.5, 0.0, 0.5, 2.0]], np.float32)
    np.testing.assert_allclose(ops.ReLU().forward(x), np.maximum(x, 0))
    np.testing.assert_allclose(ops.LeakyReLU(0.1).forward(x), np.where(x > 0, x, 0.1 * x), rtol=1e-6)
    np.testing.assert_allclose(ops.Sigmoid().forward(x), 1 / (1 + np.exp(-x)), rtol=1e-6)
    np.testing.assert_allclose(ops.Tanh().forward(x), np.tanh(x), rtol=1e-6)
    erf = np.vectorize(math.erf)
    exact_gelu = 0.5 * x * (1 + erf(x / math.sqrt(2)))
    np.testing.assert_allclose(ops.GELU().forward(x), exact_gelu, atol=1e-3)
    sm = ops.Softmax().forward(x)
    np.testing.assert_allclose(sm.sum(axis=-1), 1.0, rtol=1e-6)


def test_sigmoid_does_not_overflow():
    y = ops.Sigmoid().forward(np.array([[-1e4, 1e4]], np.float32))
    np.testing.assert_allclose(y, [[0.0, 1.0]])


def test_dropout_seeded_scaled_and_identity_in_eval():
    x = np.ones((200, 50), np.float32)
    a, b = ops.Dropout(0.25, seed=3), ops.Dropout(0.25, seed=3)
    ya, yb = a.forward(x), b.forward(x)
    np.testing.assert_array_equal(ya, yb)
    assert set(np.unique(ya)) == {0.0, np.float32(1 / 0.75)}
    assert abs((ya == 0).mean() - 0.25) < 0.02
    a.eval()
    np.testing.assert_array_equal(a.forward(x), x)
    with pytest.raises(ValueError, match="Dropout probability"):
        ops.Dropout(1.0)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 6),
    features=st.integers(1, 9),
    out=st.integers(1, 7),
    act=st.sampled_from(["ReLU", "LeakyReLU", "Sigmoid", "Tanh", "GELU"]),
)
def test_stress_linear_activation_stack(batch, features, out, act):
    model = nf.Sequential(ops.Linear(features, out), getattr(ops, act)(), ops.Linear(out, 2))
    x = np.random.default_rng(batch * 31 + features).standard_normal((batch, features))
    gradcheck(model, [x], max_checks=12)


@settings(max_examples=20, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=2, max_size=4), axis=st.integers(-1, 1))
def test_stress_softmax_and_reshape(shape, axis):
    x = np.random.default_rng(len(shape)).standard_normal(shape)
    gradcheck(ops.Softmax(axis=axis), [x], max_checks=12)
    gradcheck(ops.Flatten(), [x], max_checks=8)


def test_gradcheck_catches_a_wrong_backward():
    class WrongTanh(ops.Tanh):
        def _backward(self, g, gx):
            gx[...] = g  # forgets the derivative of tanh

    with pytest.raises(GradcheckError, match="input 0"):
        gradcheck(WrongTanh(), [np.linspace(-1, 1, 6).reshape(2, 3)])


@pytest.mark.parametrize(
    ("op", "x", "message"),
    [
        (ops.Linear(784, 128), np.zeros((64, 785), np.float32), r"Linear\(784→128\) got input of shape \(64, 785\); expected \(\*, 784\)"),
        (ops.Linear(4, 2), np.zeros((3, 4), np.int64), "dtype int64"),
        (ops.Linear(4, 2), np.zeros((3, 4), np.float64), "its parameters are float32"),
        (ops.ReLU(), [1, 2], "got list; expected an array"),
        (ops.Reshape(5, 5), np.zeros((2, 12), np.float32), r"cannot be shaped \(5, 5\)"),
        (ops.Flatten(2), np.zeros((2, 3), np.float32), "expected more than 2 dimensions"),
    ],
)
def test_bad_inputs_name_the_op(op, x, message):
    with pytest.raises(ShapeError, match=message):
        op.forward(x)


def test_add_and_residual_shape_errors():
    with pytest.raises(ShapeError, match=r"Add\(\) got inputs of shapes"):
        ops.Add().forward(np.zeros((2, 3)), np.zeros((3, 2)))
    with pytest.raises(ShapeError, match="pass shortcut"):
        nf.Residual(ops.Linear(4, 6)).forward(np.zeros((2, 4), np.float32))


def test_constructor_errors():
    with pytest.raises(ValueError, match="positive sizes"):
        ops.Linear(0, 3)
    with pytest.raises(TypeError, match="expected an Operator"):
        nf.Sequential(ops.ReLU(), "relu")
    with pytest.raises(ValueError, match="at most one -1"):
        ops.Reshape(-1, -1)


def test_named_parameters_follow_pytorch_names_in_stable_order():
    model = nf.Sequential(ops.Linear(4, 3), ops.ReLU(), nf.Residual(ops.Linear(3, 3)))
    names = [name for name, _ in model.named_parameters()]
    assert names == ["0.weight", "0.bias", "2.block.weight", "2.block.bias"]
    assert model.state_dict()["0.weight"].shape == (3, 4)


def test_load_state_dict_checks_names_and_shapes():
    model = nf.Sequential(ops.Linear(4, 3))
    state = {"0.weight": np.ones((3, 4), np.float32), "0.bias": np.zeros(3, np.float32)}
    model.load_state_dict(state)
    np.testing.assert_array_equal(model[0].weight.data, 1.0)
    with pytest.raises(KeyError, match="missing"):
        model.load_state_dict({"0.weight": state["0.weight"]})
    with pytest.raises(ShapeError, match=r"0.bias: model has shape \(3,\)"):
        model.load_state_dict({**state, "0.bias": np.zeros(4, np.float32)})


def test_debug_mode_names_a_backward_with_the_wrong_shape(monkeypatch):
    from neuroflow import debug

    class Truncating(ops.ReLU):
        def backward(self, grad_out):
            return super().backward(grad_out)[:, :-1]

    model = nf.Sequential(ops.Linear(4, 3), Truncating())
    x = np.ones((2, 4), np.float32)
    monkeypatch.setattr(debug, "_enabled", True)
    model.forward(x)
    with pytest.raises(ShapeError, match=r"Truncating\(\).backward returned a gradient of shape \(2, 2\); its forward input had shape \(2, 3\)"):
        model.backward(np.ones((2, 3), np.float32))


def test_memory_declarations_chain_through_sequential():
    model = nf.Sequential(ops.Flatten(), ops.Linear(12, 5), ops.ReLU())
    assert model.output_shape((7, 3, 4)) == (7, 5)
    decl = model[1].memory_declaration((7, 12))
    assert decl.cached == [(7, 12)] and decl.output == (7, 5)
    with pytest.raises(ShapeError):
        model.output_shape((7, 13))


def test_linear_bias_gradient_float32_meets_the_pairwise_bound(nf_backend):
    """The bias gradient of 131,072 rows (a batch of sequences through one Linear) in float32 is the float64 sum
    to log2(n)·eps, pairwise summation's worst-case bound doubled; numpy's sum over the rows, one after
    another, erred 4.9e-6 here."""
    rng = np.random.default_rng(0)
    n = 131_072
    x = rng.standard_normal((n, 16)).astype(np.float32)
    g = (rng.standard_normal((n, 8)) + 1.0).astype(np.float32)
    layer = ops.Linear(16, 8)
    wide = copy.deepcopy(layer).astype(np.float64)
    wide.forward(x.astype(np.float64))
    wide.backward(g.astype(np.float64))
    narrow = layer.to(nf_backend)
    narrow.forward(nf_backend.from_host(x))
    narrow.backward(nf_backend.from_host(g))
    got = nf_backend.to_host(narrow.bias.grad).astype(np.float64)
    assert np.linalg.norm(got - wide.bias.grad) <= math.log2(n) * np.finfo(np.float32).eps * np.linalg.norm(wide.bias.grad)
