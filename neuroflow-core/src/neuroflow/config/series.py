"""Time-series datasets from a config: standardised windows and the value each forecasts."""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow.errors import ConfigError


class SeriesWindows:
    """A dataset of standardised windows of a series, (samples, window, features), and the value each forecasts.

    ``mean`` and ``std`` undo the standardisation: original = value · std + mean.
    (Not an ArrayDataset subclass: importing neuroflow.data would slow every CLI start.)
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, mean: float, std: float) -> None:
        self.x, self.y = x.astype(np.float32), y.astype(np.float32)
        self.mean, self.std = mean, std

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: Any) -> tuple[np.ndarray, np.ndarray]:
        return self.x[index], self.y[index]

    def persistence(self) -> np.ndarray:
        """The persistence forecast (each window's last value), the baseline a forecaster must beat."""
        return self.x[:, -1]


def series_windows(data: dict[str, Any]) -> tuple[SeriesWindows, SeriesWindows]:
    """Windows → the value ``horizon`` steps on: the first ``split`` to train on, the later ones held out.

    The series is standardised by the values the training windows touch,
    as neuroflow-ops-recurrent's own forecasting test does, so nothing of
    the held-out tail leaks into training.
    """
    try:
        from neuroflow_ops_recurrent import data as series_data
    except ImportError:
        raise ConfigError(f"[data] dataset = {data['dataset']!r} comes with neuroflow-ops-recurrent: "
                          "pip install neuroflow-ops-recurrent") from None
    _, values = getattr(series_data, data["dataset"])()
    window, horizon, split = data["window"], data.get("horizon", 1), data.get("split", 0.8)
    pairs = len(values) - window - horizon + 1
    train = int(split * pairs)
    if not 0 < train < pairs:
        raise ConfigError(f"[data] window = {window}, horizon = {horizon} and split = {split} leave {max(train, 0)} "
                          f"training and {max(pairs - train, 0)} held-out windows of the {len(values)} values; "
                          "each needs at least one")
    x, y = series_data.one_step_windows(values, window, dtype=np.float64)
    x, y = x[:pairs], y[horizon - 1:]  # window i → the value horizon steps after it
    seen = values[:train + window + horizon - 1]
    mean, std = float(seen.mean()), float(seen.std())
    return (SeriesWindows((x[:train] - mean) / std, (y[:train] - mean) / std, mean, std),
            SeriesWindows((x[train:] - mean) / std, (y[train:] - mean) / std, mean, std))
