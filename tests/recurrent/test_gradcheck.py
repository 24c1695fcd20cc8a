"""Float64 finite-difference checks of every recurrent op, and backend parity through OpTestCase."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow import ops
from neuroflow.operator import Operator
from neuroflow.testing import OpTestCase, gradcheck


class TestElman(OpTestCase):
    input_shapes = [(3, 6, 4)]

    def make_op(self) -> Operator:
        return ops.Elman(4, 5)


class TestElmanSequences(OpTestCase):
    input_shapes = [(2, 5, 3)]

    def make_op(self) -> Operator:
        return ops.Elman(3, 4, nonlinearity="relu", return_sequences=True)


class TestGRU(OpTestCase):
    input_shapes = [(3, 6, 4)]

    def make_op(self) -> Operator:
        return ops.GRU(4, 5)


class TestGRUSequences(OpTestCase):
    input_shapes = [(2, 5, 3)]

    def make_op(self) -> Operator:
        return ops.GRU(3, 4, return_sequences=True)


class TestLSTM(OpTestCase):
    input_shapes = [(3, 6, 4)]

    def make_op(self) -> Operator:
        return ops.LSTM(4, 5)


class TestLSTMSequences(OpTestCase):
    input_shapes = [(2, 5, 3)]

    def make_op(self) -> Operator:
        return ops.LSTM(3, 4, return_sequences=True)


class TestWaveletElman(OpTestCase):
    input_shapes = [(3, 8, 2)]

    def make_op(self) -> Operator:
        return ops.WaveletElman(2, 4, levels=2)


class TestWaveletElmanMexicanHat(OpTestCase):
    input_shapes = [(2, 16, 1)]

    def make_op(self) -> Operator:
        return ops.WaveletElman(1, 4, levels=3, nonlinearity="mexican_hat", return_sequences=True)


class TestWaveletElmanMorlet(OpTestCase):
    input_shapes = [(2, 8, 1)]

    def make_op(self) -> Operator:
        return ops.WaveletElman(1, 4, levels=1, nonlinearity="morlet")


def _initial_state(op: Operator, batch: int, rng: np.random.Generator) -> Any:
    shape = (batch, op.hidden_size)
    if type(op).__name__ == "LSTM":
        return rng.standard_normal(shape), rng.standard_normal(shape)
    return rng.standard_normal(shape)


CONFIGS = [
    pytest.param(lambda: ops.Elman(3, 4, bias=False, return_sequences=True), (2, 7, 3), id="elman-nobias"),
    pytest.param(lambda: ops.GRU(3, 4, bias=False), (2, 7, 3), id="gru-nobias"),
    pytest.param(lambda: ops.LSTM(3, 4, bias=False, return_sequences=True), (2, 7, 3), id="lstm-nobias"),
    pytest.param(lambda: ops.Elman(2, 3, return_sequences=True), (1, 12, 2), id="elman-long"),
    pytest.param(lambda: ops.GRU(2, 3, return_sequences=True), (1, 12, 2), id="gru-long"),
    pytest.param(lambda: ops.LSTM(2, 3), (1, 12, 2), id="lstm-long"),
    pytest.param(lambda: ops.GRU(2, 3, return_sequences=True), (4, 1, 2), id="gru-one-step"),
    # bptt_steps at least the sequence length is full BPTT: the exact gradient.
    pytest.param(lambda: ops.LSTM(2, 3, return_sequences=True, bptt_steps=6), (2, 6, 2), id="lstm-k-equals-time"),
    pytest.param(lambda: ops.Elman(2, 3, bptt_steps=50), (2, 6, 2), id="elman-k-beyond-time"),
    pytest.param(lambda: ops.WaveletElman(2, 3, levels=2, nonlinearity="morlet", return_sequences=True), (2, 8, 2),
                 id="wavelet-morlet-sequences"),
    pytest.param(lambda: ops.WaveletElman(1, 3, levels=2, nonlinearity="relu"), (3, 4, 1), id="wavelet-relu"),
]


@pytest.mark.parametrize(("make", "shape"), CONFIGS)
def test_gradcheck(make: Any, shape: tuple[int, ...]) -> None:
    gradcheck(make(), np.random.default_rng(1).standard_normal(shape))


@pytest.mark.parametrize("make", [
    lambda: ops.Elman(3, 4, stateful=True, return_sequences=True),
    lambda: ops.GRU(3, 4, stateful=True),
    lambda: ops.LSTM(3, 4, stateful=True, return_sequences=True),
    lambda: ops.WaveletElman(3, 4, levels=1, nonlinearity="mexican_hat", stateful=True),
], ids=["elman", "gru", "lstm", "wavelet"])
def test_gradcheck_from_a_carried_state(make: Any) -> None:
    """A stateful op starts from its carried state; the check restores that state before every forward."""
    op = make()
    rng = np.random.default_rng(2)
    state = _initial_state(op, 2, rng)

    def restore() -> None:
        op.state = state

    gradcheck(op, rng.standard_normal((2, 4, 3)), prepare=restore)
