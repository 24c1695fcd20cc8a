"""Shared fixtures of the vision tests: a seeded generator; the ops' numpy and numba paths."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from typing import TypeVar

import numpy as np
import pytest

from neuroflow.backends import cpu_parallel
from neuroflow_ops_vision import compiled


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def every_size_splits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every pass and kernel call handed to ``cpu_parallel`` splits between its threads, however small: the tests
    that compare thread counts need the split path whatever their arrays' size."""
    monkeypatch.setattr(cpu_parallel, "MIN_PARALLEL", 0)


T = TypeVar("T")

HAS_NUMBA = importlib.util.find_spec("numba") is not None


def on_numpy(run: Callable[[], T]) -> T:
    """``run()`` with every op on its numpy code (numba's kernels off), as the reference for the kernels."""
    compiled.use_numba(False)
    try:
        return run()
    finally:
        compiled.use_numba(True)


def _on_path(path: str) -> Iterator[str]:
    if path == "numba":
        if not HAS_NUMBA:
            pytest.skip("numba is not installed: pip install 'neuroflow-ops-vision[numba]'")
        importlib.import_module("numba")  # the kernels that only ride on a loaded numba run too (compiled.RIDERS)
    compiled.use_numba(path == "numba")
    try:
        yield path
    finally:
        compiled.use_numba(True)


@pytest.fixture(params=["numpy", "numba"])
def depthwise_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test with depthwise convolutions on numpy alone, then on numba's compiled loops (skipped without
    numba)."""
    yield from _on_path(request.param)


@pytest.fixture(params=["numpy", "numba"])
def numba_path(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test with every op on its numpy code, then with numba's compiled kernels where an op has them
    (skipped without numba)."""
    yield from _on_path(request.param)
