"""Yearly sunspot numbers, 1700–2008 (309 values; public domain, NOAA NGDC via statsmodels)."""

from __future__ import annotations

from importlib import resources

import numpy as np


def sunspots() -> tuple[np.ndarray, np.ndarray]:
    """The yearly sunspot series as (years int64, values float64), both of shape (309,).

    Example::

        years, values = sunspots()
        x, y = one_step_windows(values, window=16)
    """
    text = resources.files(__package__).joinpath("sunspots.csv").read_text(encoding="utf-8")
    rows = [line.split(",") for line in text.splitlines() if line and not line.startswith(("#", '"'))]
    years = np.array([int(year) for year, _ in rows], dtype=np.int64)
    values = np.array([float(value) for _, value in rows], dtype=np.float64)
    return years, values
