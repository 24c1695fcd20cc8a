"""Shared by the opencl tests: the ``opencl`` backend and its namespace (the tests skip without a driver)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def backend() -> Any:
    """The opencl:0 backend (pocl on the CPU in CI)."""
    neuroflow_opencl = pytest.importorskip("neuroflow_opencl")
    reason = neuroflow_opencl.OpenclBackend.unavailable_reason()
    if reason:
        pytest.skip(reason)
    from neuroflow.backends.selection import get_backend

    return get_backend("opencl")


@pytest.fixture(scope="session")
def xp(backend: Any) -> Any:
    """``backend.xp``: NeuroFlow's numpy-like namespace over OpenCL buffers."""
    return backend.xp
