"""The cpu backend: numpy, with the BLAS numpy was built with."""

from __future__ import annotations

import os
from typing import ClassVar

import numpy as np

from neuroflow.backends.base import Backend


class CpuBackend(Backend):
    """Runs everything with numpy on the host; copies to and from the host are free."""

    name: ClassVar[str] = "cpu"
    xp = np
    needs_qualification: ClassVar[bool] = False  # numpy itself: the reference every other backend is checked against

    def from_host(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def to_host(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array)

    def describe(self) -> dict[str, str]:
        return {
            "backend": "cpu",
            "device": "host",
            "numpy": np.__version__,
            "cpu_count": str(os.cpu_count()),
        }
