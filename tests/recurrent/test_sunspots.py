"""The bundled sunspot series, its windowing, and forecasters that beat persistence on the held-out tail."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import neuroflow as nf
from neuroflow import ops
from neuroflow_ops_recurrent.data import one_step_windows, sunspots

WINDOW = 16
TRAIN_FRACTION = 0.8


def test_sunspots_is_the_yearly_series_1700_to_2008() -> None:
    years, values = sunspots()
    assert years.shape == values.shape == (309,)
    np.testing.assert_array_equal(years, np.arange(1700, 2009))
    assert values[:4].tolist() == [5.0, 11.0, 16.0, 23.0] and values[-1] == 2.9
    assert values.min() >= 0 and values.max() == pytest.approx(190.2)


def test_one_step_windows_pairs_each_window_with_the_next_value() -> None:
    series = np.arange(10.0)
    x, y = one_step_windows(series, 4)
    assert x.shape == (6, 4, 1) and y.shape == (6, 1) and x.dtype == np.float32
    np.testing.assert_array_equal(x[2, :, 0], [2, 3, 4, 5])
    np.testing.assert_array_equal(y[:, 0], [4, 5, 6, 7, 8, 9])
    x2, y2 = one_step_windows(np.stack([series, -series], axis=1), 3, dtype=np.float64)
    assert x2.shape == (7, 3, 2) and y2[0].tolist() == [3.0, -3.0]
    with pytest.raises(ValueError, match="window < 10"):
        one_step_windows(series, 10)


class Adam:
    """Plain Adam on the model's trainable parameters (kept here so the test needs nothing but the ops)."""

    def __init__(self, params: list[Any], lr: float) -> None:
        self.params, self.lr, self.t = params, lr, 0
        self.m = [np.zeros_like(p.data) for p in params]
        self.v = [np.zeros_like(p.data) for p in params]

    def step(self) -> None:
        self.t += 1
        for p, m, v in zip(self.params, self.m, self.v):
            m *= 0.9
            m += 0.1 * p.grad
            v *= 0.999
            v += 0.001 * p.grad**2
            p.data -= self.lr * (m / (1 - 0.9**self.t)) / (np.sqrt(v / (1 - 0.999**self.t)) + 1e-8)


def _forecast_mse(recurrent: nf.Operator, epochs: int = 100) -> tuple[float, float]:
    """Train recurrent → Linear on the first 80 % of windows; (model MSE, persistence MSE) on the rest."""
    _, values = sunspots()
    x, y = one_step_windows(values, WINDOW, dtype=np.float64)
    split = int(TRAIN_FRACTION * len(x))
    seen = values[:split + WINDOW]                    # every value the training pairs touch
    mean, std = seen.mean(), seen.std()
    xs, ys = ((x - mean) / std).astype(np.float32), ((y - mean) / std).astype(np.float32)
    model = nf.Sequential(recurrent, ops.Linear(recurrent.hidden_size, 1))
    loss, optimizer = nf.losses.MSE(), Adam(model.trainable_parameters(), lr=1e-2)
    rng = np.random.default_rng(0)
    for _ in range(epochs):
        order = rng.permutation(split)
        for start in range(0, split, 32):
            batch = order[start:start + 32]
            model.zero_grad()
            loss.forward(model.forward(xs[batch]), ys[batch])
            model.backward(loss.backward())
            optimizer.step()
    prediction = model.forward(xs[split:]) * std + mean
    model_mse = float(np.mean((prediction - y[split:]) ** 2))
    persistence_mse = float(np.mean((x[split:, -1] - y[split:]) ** 2))
    return model_mse, persistence_mse


@pytest.mark.parametrize("make", [
    pytest.param(lambda: ops.Elman(1, 16), id="elman"),
    pytest.param(lambda: ops.WaveletElman(1, 16, levels=2), id="wavelet-elman"),
    pytest.param(lambda: ops.WaveletElman(1, 16, levels=2, nonlinearity="mexican_hat"), id="wavelet-elman-mexican-hat"),
])
def test_forecaster_beats_persistence_on_the_held_out_tail(make: Any) -> None:
    nf.manual_seed(0)
    model_mse, persistence_mse = _forecast_mse(make())
    print(f"held-out MSE {model_mse:.1f} vs persistence {persistence_mse:.1f}")
    # With a margin: a forecaster that learned nothing sits at or above persistence.
    assert model_mse < 0.8 * persistence_mse
