"""Shared fixtures of the vision tests: a seeded generator; the depthwise convolution's numpy and numba paths."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import numpy as np
import pytest

from neuroflow_ops_vision import conv_depthwise


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


HAS_NUMBA = importlib.util.find_spec("numba") is not None


@pytest.fixture(params=["numpy", "numba"])
def depthwise_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test with depthwise convolutions on numpy alone, then on numba's compiled loops (skipped without
    numba)."""
    if request.param == "numba" and not HAS_NUMBA:
        pytest.skip("numba is not installed: pip install 'neuroflow-ops-vision[numba]'")
    conv_depthwise.use_numba(request.param == "numba")
    try:
        yield request.param
    finally:
        conv_depthwise.use_numba(True)
