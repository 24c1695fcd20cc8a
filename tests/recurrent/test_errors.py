"""Bad input gets an error that names the op, the expected and the given shape or dtype."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from neuroflow import ops
from neuroflow.errors import ShapeError


@pytest.mark.parametrize(("op", "x", "message"), [
    (ops.Elman(1, 16), np.zeros((8, 5), np.float32),
     "Elman(1→16) got input of shape (8, 5); expected (batch, time, 1); add a feature axis: x[..., None]"),
    (ops.GRU(3, 4), np.zeros((2, 5, 2), np.float32), "GRU(3→4) got input of shape (2, 5, 2); expected (batch, time, 3)"),
    (ops.LSTM(3, 4), np.zeros((2, 0, 3), np.float32),
     "LSTM(3→4) got input of shape (2, 0, 3); expected at least one sample and one time step"),
    (ops.LSTM(3, 4), [[[0.0, 0.0, 0.0]]], "LSTM(3→4) got list; expected an array of shape (batch, time, 3)"),
    (ops.Elman(3, 4), np.zeros((2, 5, 3), np.int64), "Elman(3→4) got input of dtype int64; expected a floating dtype"),
    (ops.GRU(3, 4), np.zeros((2, 5, 3), np.float64), "GRU(3→4) got input of dtype float64; its parameters are float32"),
    (ops.WaveletElman(1, 8, levels=2), np.zeros((4, 10, 1), np.float32),
     "WaveletElman(1→8, levels=2) got a window of 10 steps; its 2-level db4 transform needs a multiple of 4"),
])
def test_bad_input_is_named(op: Any, x: Any, message: str) -> None:
    with pytest.raises(ShapeError, match=re.escape(message)):
        op.forward(x)


def test_memory_declaration_checks_shapes_like_forward() -> None:
    with pytest.raises(ShapeError, match=re.escape("Elman(2→3) got input of shape (4, 2); expected (batch, time, 2)")):
        ops.Elman(2, 3).memory_declaration((4, 2))
    with pytest.raises(ShapeError, match="multiple of 8"):
        ops.WaveletElman(2, 3, levels=3).memory_declaration((4, 12, 2))


def test_backward_checks_its_gradient_and_its_order() -> None:
    op = ops.LSTM(3, 4, return_sequences=True)
    with pytest.raises(RuntimeError, match=re.escape("backward called before forward")):
        op.backward(np.zeros((2, 5, 4), np.float32))
    op.forward(np.zeros((2, 5, 3), np.float32))
    with pytest.raises(ShapeError, match=re.escape("backward got gradient of shape (2, 4); expected (2, 5, 4)")):
        op.backward(np.zeros((2, 4), np.float32))
    op.backward(np.zeros((2, 5, 4), np.float32))
    with pytest.raises(RuntimeError, match="backward called twice for one forward; run forward again first"):
        op.backward(np.zeros((2, 5, 4), np.float32))


@pytest.mark.parametrize(("make", "message"), [
    (lambda: ops.Elman(3, 4, nonlinearity="sigmoid"), "Elman: unknown nonlinearity 'sigmoid'; available: tanh, relu"),
    (lambda: ops.WaveletElman(3, 4, nonlinearity="haar"),
     "unknown nonlinearity 'haar'; available: tanh, relu, morlet, mexican_hat"),
    (lambda: ops.GRU(0, 4), "GRU needs positive sizes; got input_size=0, hidden_size=4"),
    (lambda: ops.LSTM(3, 4, bptt_steps=0), "bptt_steps must be None (full BPTT) or an integer >= 1; got 0"),
    (lambda: ops.WaveletElman(3, 4, levels=0), "WaveletElman needs levels >= 1; got 0"),
])
def test_bad_arguments_are_named(make: Any, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        make()
