"""Time-series datasets from a config: standardised windows and the value each forecasts."""

from __future__ import annotations

from typing import Any

import numpy as np


class SeriesWindows:
    """A dataset of standardised windows of a series, (samples, window, features), and the value each forecasts.

    ``mean`` and ``std`` undo the standardisation: original = value · std + mean.
    A forecasting data set a config names (a ``neuroflow_datasets`` entry)
    loads as these, and ``neuroflow train`` then reports the held-out error
    next to :meth:`persistence`'s.
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
