"""Memory: the declaration matches the buffers taken, buffers are reused, inputs are never written."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from neuroflow import ops


class RecordingPool:
    """A buffer pool that remembers every (owner, key) it handed out."""

    def __init__(self) -> None:
        self.held: dict[tuple[int, str], np.ndarray] = {}
        self.allocations = 0

    def get(self, owner: object, key: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        slot = (id(owner), key)
        array = self.held.get(slot)
        if array is None or array.shape != tuple(shape) or array.dtype != dtype:
            array = np.empty(shape, dtype)
            self.held[slot] = array
            self.allocations += 1
        return array


CONFIGS = [
    pytest.param(lambda: ops.Elman(3, 4), (2, 6, 3), id="elman"),
    pytest.param(lambda: ops.Elman(3, 4, bias=False, return_sequences=True), (1, 6, 3), id="elman-seq-nobias-b1"),
    pytest.param(lambda: ops.GRU(3, 4, return_sequences=True, bptt_steps=2), (2, 6, 3), id="gru-seq-k2"),
    pytest.param(lambda: ops.GRU(3, 4, bptt_steps=2, stateful=True), (2, 6, 3), id="gru-k2-stateful"),
    pytest.param(lambda: ops.LSTM(3, 4, return_sequences=True, bptt_steps=3, stateful=True), (2, 6, 3),
                 id="lstm-seq-k3-stateful"),
    pytest.param(lambda: ops.LSTM(3, 4, bias=False), (1, 6, 3), id="lstm-nobias-b1"),
    pytest.param(lambda: ops.WaveletElman(2, 4, levels=2), (2, 8, 2), id="wavelet"),
    pytest.param(lambda: ops.WaveletElman(2, 4, levels=1, nonlinearity="morlet", return_sequences=True), (2, 8, 2),
                 id="wavelet-morlet"),
    pytest.param(lambda: ops.WaveletElman(1, 4, levels=2, nonlinearity="mexican_hat", stateful=True), (3, 8, 1),
                 id="wavelet-hat-stateful"),
    pytest.param(lambda: _first_layer(ops.LSTM(3, 4, return_sequences=True)), (2, 6, 3), id="lstm-first-layer"),
    pytest.param(lambda: _first_layer(ops.WaveletElman(2, 4, levels=2)), (2, 8, 2), id="wavelet-first-layer"),
]


def _first_layer(op: Any) -> Any:
    op.needs_input_grad = False  # what the Trainer sets on a model's first layer
    return op


def _step(op: Any, x: np.ndarray, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = op.forward(x).copy()
    gx = op.backward(g)
    return y, None if gx is None else gx.copy()


@pytest.mark.parametrize(("make", "shape"), CONFIGS)
def test_declaration_lists_exactly_the_buffers_taken(make: Any, shape: tuple[int, ...]) -> None:
    op = make()
    pool = RecordingPool()
    op.attach_pool(pool)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    for _ in range(2):  # the second step starts from a carried state when stateful
        y = op.forward(x)
        op.backward(rng.standard_normal(y.shape).astype(np.float32))
    declaration = op.memory_declaration(shape)
    wavelet = isinstance(op, ops.WaveletElman)
    cached = declaration.cached if wavelet else declaration.cached[1:]    # the caller owns a plain op's input
    if op.stateful:                                                       # the carried state is the op's own
        cached = cached[:-len(op.state_names)]
    workspace = declaration.workspace[:]
    if wavelet:  # the transform matrix is a per-window constant, not a pool buffer
        workspace.remove((shape[1] * op.cell_input_size, shape[1] * shape[2]))
    expected = cached + workspace + ([tuple(shape)] if op.needs_input_grad else [])  # + the input gradient
    if not op.return_sequences:
        expected.append(declaration.output)                               # the sequence output is the cached h
    assert Counter(a.shape for a in pool.held.values()) == Counter(expected)
    assert declaration.output == tuple(y.shape)


@pytest.mark.parametrize(("make", "shape"), CONFIGS)
def test_steady_state_reuses_every_buffer_and_matches_a_run_without_pool(make: Any, shape: tuple[int, ...]) -> None:
    pooled, plain = make(), make()
    plain.load_state_dict(pooled.state_dict())
    pool = RecordingPool()
    pooled.attach_pool(pool)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    g = rng.standard_normal(pooled.output_shape(shape)).astype(np.float32)
    x_before, g_before = x.copy(), g.copy()
    for step in range(3):
        y1, gx1 = _step(pooled, x, g)
        y2, gx2 = _step(plain, x, g)
        if step == 0:
            allocations = pool.allocations
        np.testing.assert_array_equal(y1, y2)
        if gx1 is not None:
            np.testing.assert_array_equal(gx1, gx2)
    assert pool.allocations == allocations, "a steady-state step took a new buffer"
    for a, b in zip(pooled.parameters(), plain.parameters()):
        np.testing.assert_array_equal(a.grad, b.grad)
    np.testing.assert_array_equal(x, x_before)  # neither the input nor the incoming gradient is written
    np.testing.assert_array_equal(g, g_before)


@pytest.mark.parametrize("name", ["GRU", "LSTM"])
def test_output_survives_backward(name: str) -> None:
    """Backward reuses its caches in place, never the returned hidden sequence."""
    op = getattr(ops, name)(3, 4, return_sequences=True)
    x = np.random.default_rng(2).standard_normal((2, 5, 3)).astype(np.float32)
    y = op.forward(x)
    before = y.copy()
    op.backward(np.ones_like(y))
    np.testing.assert_array_equal(y, before)


@pytest.mark.parametrize("name", ["Elman", "WaveletElman", "GRU", "LSTM"])
def test_a_first_layer_skips_the_input_gradient_only(name: str) -> None:
    full = getattr(ops, name)(2, 4, return_sequences=True)
    first = _first_layer(getattr(ops, name)(2, 4, return_sequences=True))
    first.load_state_dict(full.state_dict())
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 8, 2)).astype(np.float32)
    g = rng.standard_normal((3, 8, 4)).astype(np.float32)
    full.forward(x)
    full.backward(g)
    first.forward(x)
    assert first.backward(g) is None
    for (n, a), b in zip(full.named_parameters(), first.parameters()):
        np.testing.assert_array_equal(a.grad, b.grad, err_msg=n)
