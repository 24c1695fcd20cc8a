"""Stateful mode: the hidden state carries across forward calls, detached, until reset_state()."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from neuroflow import ops
from neuroflow.errors import ShapeError

MAKERS = {
    "elman": lambda **kw: ops.Elman(3, 4, **kw),
    "gru": lambda **kw: ops.GRU(3, 4, **kw),
    "lstm": lambda **kw: ops.LSTM(3, 4, **kw),
    "wavelet": lambda **kw: ops.WaveletElman(3, 4, levels=1, nonlinearity="morlet", **kw),
}


@pytest.mark.parametrize("kind", ["elman", "gru", "lstm"])
def test_chunks_of_a_stateful_op_equal_one_pass_over_the_sequence(kind: str) -> None:
    whole = MAKERS[kind](return_sequences=True)
    chunked = MAKERS[kind](return_sequences=True, stateful=True)
    chunked.load_state_dict(whole.state_dict())
    x = np.random.default_rng(0).standard_normal((2, 8, 3)).astype(np.float32)
    expected = whole.forward(x).copy()
    first = chunked.forward(x[:, :3]).copy()
    second = chunked.forward(x[:, 3:]).copy()
    np.testing.assert_allclose(np.concatenate([first, second], axis=1), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", MAKERS)
def test_reset_state_starts_from_zeros(kind: str) -> None:
    op = MAKERS[kind](stateful=True)
    x = np.random.default_rng(1).standard_normal((2, 4, 3)).astype(np.float32)
    first = op.forward(x).copy()
    assert op.state is not None
    second = op.forward(x).copy()
    assert not np.allclose(first, second)
    op.reset_state()
    assert op.state is None
    np.testing.assert_array_equal(op.forward(x), first)


def test_state_holds_the_final_step_and_is_detached_from_the_previous_batch() -> None:
    op = ops.LSTM(3, 4, stateful=True, return_sequences=True)
    rng = np.random.default_rng(2)
    x1, x2 = (rng.standard_normal((2, 5, 3)).astype(np.float32) for _ in range(2))
    h1 = op.forward(x1).copy()
    h, c = (part.copy() for part in op.state)  # the op reuses its state arrays at the next forward
    np.testing.assert_array_equal(h, h1[:, -1])
    op.forward(x2)
    gx = op.backward(np.ones((2, 5, 4), np.float32))
    assert gx.shape == x2.shape  # only the current batch gets a gradient; nothing flows into x1

    fresh = ops.LSTM(3, 4, return_sequences=True)
    fresh.load_state_dict(op.state_dict())
    op.zero_grad()
    fresh.state = (h, c)
    fresh.forward(x2)
    np.testing.assert_allclose(fresh.backward(np.ones((2, 5, 4), np.float32)), gx, rtol=1e-6)


def test_a_set_state_is_the_initial_state_of_every_forward_of_a_stateless_op() -> None:
    op = ops.GRU(3, 4)
    rng = np.random.default_rng(3)
    op.state = rng.standard_normal((2, 4))
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    np.testing.assert_array_equal(op.forward(x).copy(), op.forward(x))


def test_stateful_batch_size_change_is_refused_with_advice() -> None:
    op = ops.Elman(3, 4, stateful=True)
    op.forward(np.zeros((4, 2, 3), np.float32))
    with pytest.raises(ShapeError, match=r"carries state for batch 4; got batch 3.*reset_state\(\)"):
        op.forward(np.zeros((3, 2, 3), np.float32))
    op.reset_state()
    assert op.forward(np.zeros((3, 2, 3), np.float32)).shape == (3, 4)


@pytest.mark.parametrize(("op", "value", "message"), [
    (ops.Elman(3, 4), np.zeros((2, 5)), r"h has shape \(2, 5\); expected \(batch, 4\)"),
    (ops.LSTM(3, 4), np.zeros((2, 4)), r"takes 2 arrays \(h, c\)"),
    (ops.LSTM(3, 4), (np.zeros((2, 4)), np.zeros((3, 4))), r"c has shape \(3, 4\)"),
])
def test_invalid_state_is_refused(op: Any, value: Any, message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        op.state = value
