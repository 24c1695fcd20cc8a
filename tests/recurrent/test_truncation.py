"""Truncated BPTT against its definition: each output's gradient reaches only its last k steps."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow import ops

from .reference import check_op

MAKERS = {
    "elman": lambda **kw: ops.Elman(3, 4, **kw),
    "elman-relu": lambda **kw: ops.Elman(3, 4, nonlinearity="relu", **kw),
    "gru": lambda **kw: ops.GRU(3, 4, **kw),
    "lstm": lambda **kw: ops.LSTM(3, 4, **kw),
}


@pytest.mark.parametrize("kind", MAKERS)
@pytest.mark.parametrize("return_sequences", [False, True], ids=["many-to-one", "many-to-many"])
@pytest.mark.parametrize("bptt_steps", [1, 2, 5, 7, None])
def test_truncated_gradient_matches_the_windowed_reference(kind: str, return_sequences: bool,
                                                           bptt_steps: int | None) -> None:
    op = MAKERS[kind](return_sequences=return_sequences, bptt_steps=bptt_steps)
    check_op(op, np.random.default_rng(3).standard_normal((2, 7, 3)), directions=3)


@pytest.mark.parametrize("nonlinearity", ["tanh", "morlet", "mexican_hat"])
def test_wavelet_elman_truncation(nonlinearity: str) -> None:
    pytest.importorskip("pywt")
    op = ops.WaveletElman(2, 4, levels=2, nonlinearity=nonlinearity, return_sequences=True, bptt_steps=3)
    check_op(op, np.random.default_rng(4).standard_normal((2, 8, 2)), directions=3)


def test_one_step_truncation_ignores_the_recurrent_path() -> None:
    """With bptt_steps=1 a many-to-one Elman's gradient is that of one cell fed a constant state."""
    rng = np.random.default_rng(5)
    op = ops.Elman(3, 4, bptt_steps=1).astype(np.float64)
    x = rng.standard_normal((2, 6, 3))
    h = op.forward(x).copy()
    g = rng.standard_normal(h.shape)
    gx = op.backward(g)
    assert np.all(gx[:, :-1] == 0)
    da = g * (1 - h**2)
    np.testing.assert_allclose(gx[:, -1], da @ op.weight_ih_l0.data, rtol=1e-12)
    np.testing.assert_allclose(op.weight_ih_l0.grad, da.T @ x[:, -1], rtol=1e-12)


def test_truncation_changes_only_the_gradient() -> None:
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 9, 3))
    full, cut = ops.GRU(3, 4, return_sequences=True), ops.GRU(3, 4, return_sequences=True, bptt_steps=2)
    cut.load_state_dict(full.state_dict())
    np.testing.assert_array_equal(full.forward(x.astype(np.float32)), cut.forward(x.astype(np.float32)))
    g = rng.standard_normal((2, 9, 4)).astype(np.float32)
    assert not np.allclose(full.backward(g), cut.backward(g))


def _state(op: Any, batch: int, rng: np.random.Generator) -> Any:
    shape = (batch, op.hidden_size)
    return (rng.standard_normal(shape), rng.standard_normal(shape)) if isinstance(op, ops.LSTM) else rng.standard_normal(shape)


@pytest.mark.parametrize("kind", ["elman", "gru", "lstm"])
@pytest.mark.parametrize("bptt_steps", [None, 2])
def test_stateful_gradients_treat_the_carried_state_as_constant(kind: str, bptt_steps: int | None) -> None:
    op = MAKERS[kind](return_sequences=True, bptt_steps=bptt_steps, stateful=True)
    check_op(op, np.random.default_rng(7).standard_normal((3, 5, 3)), state=_state(op, 3, np.random.default_rng(8)))
