"""The data sets this distribution registers under ``neuroflow_datasets``, for a config's ``[data]`` table.

``dataset = "sunspots"`` with ``window = 16`` (``horizon``, ``split``) gives
standardised windows of the yearly series and the value each forecasts;
``neuroflow train`` reports the held-out error next to the persistence
forecast's.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from neuroflow.config.series import SeriesWindows
from neuroflow_ops_recurrent.data.sunspots import sunspots
from neuroflow_ops_recurrent.data.windows import one_step_windows


def series_windows(values: np.ndarray, window: int, horizon: int = 1,
                   split: float = 0.8) -> tuple[SeriesWindows, SeriesWindows]:
    """Windows of ``values`` → the value ``horizon`` steps on: the first ``split`` to train on, the later ones held out.

    The series is standardised by the values the training windows touch, as
    this distribution's own forecasting test does, so nothing of the held-out
    tail leaks into training. Raises ValueError when either part would be empty.
    """
    pairs = len(values) - window - horizon + 1
    train = int(split * pairs)
    if not 0 < train < pairs:
        raise ValueError(f"window = {window}, horizon = {horizon} and split = {split} leave {max(train, 0)} "
                         f"training and {max(pairs - train, 0)} held-out windows of the {len(values)} values; "
                         "each needs at least one")
    x, y = one_step_windows(values, window, dtype=np.float64)
    x, y = x[:pairs], y[horizon - 1:]  # window i → the value horizon steps after it
    seen = values[:train + window + horizon - 1]
    mean, std = float(seen.mean()), float(seen.std())
    return (SeriesWindows((x[:train] - mean) / std, (y[:train] - mean) / std, mean, std),
            SeriesWindows((x[train:] - mean) / std, (y[train:] - mean) / std, mean, std))


class Sunspots:
    """The yearly sunspot numbers as forecasting windows: ``[data] dataset = "sunspots"``, ``window = N``.

    ``window``: how many past values each forecast reads; ``horizon``: how
    many steps after the window the forecast value lies (1: the next year);
    ``split``: the fraction of windows to train on, the earliest ones.
    """

    loss: ClassVar[str | None] = "MSE"

    def __init__(self, *, window: int, horizon: int = 1, split: float = 0.8) -> None:
        for key, value in (("window", window), ("horizon", horizon)):
            if value < 1:
                raise ValueError(f"{key!r} must be a positive integer; got {value!r}")
        if not 0 < split < 1:
            raise ValueError(f"'split' is the fraction of windows to train on, between 0 and 1; got {split!r}")
        self.window, self.horizon, self.split = window, horizon, split

    def load(self) -> tuple[SeriesWindows, SeriesWindows]:
        """The training windows and the held-out ones, standardised by the training part."""
        _, values = sunspots()
        return series_windows(values, self.window, self.horizon, self.split)
