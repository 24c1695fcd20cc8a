"""Supervised pairs from a series: each window of past values and the value that follows it."""

from __future__ import annotations

from typing import Any

import numpy as np


def one_step_windows(series: Any, window: int, dtype: Any = np.float32) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets) for one-step-ahead forecasting of ``series``.

    ``series`` is (time,) or (time, features). Pair i is the window
    ``series[i:i+window]`` → ``series[i+window]``: inputs have shape
    (pairs, window, features), targets (pairs, features), pairs = time − window,
    in time order (split train/test by index, never shuffle first).

    Example::

        x, y = one_step_windows(values, 16)      # x: (293, 16, 1), y: (293, 1)
    """
    data = np.asarray(series, dtype=dtype)
    if data.ndim == 1:
        data = data[:, None]
    if data.ndim != 2:
        raise ValueError(f"one_step_windows takes a series of shape (time,) or (time, features); got {data.shape}")
    if isinstance(window, bool) or int(window) < 1 or int(window) >= data.shape[0]:
        raise ValueError(f"one_step_windows needs 1 <= window < {data.shape[0]} (the series length); got {window!r}")
    window = int(window)
    pairs = data.shape[0] - window
    index = np.arange(window)[None, :] + np.arange(pairs)[:, None]
    return np.ascontiguousarray(data[index]), data[window:].copy()
