"""Shared by the opencl tests: the ``opencl`` backend, its namespace (the tests skip without a driver), and each
GEMM kernel forced in turn."""

from __future__ import annotations

from typing import Any

import pytest

try:
    from neuroflow_opencl.gemm import VARIANTS
except ImportError:  # not installed: the backend fixture skips every test
    VARIANTS = ()


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


@pytest.fixture(params=[None, *VARIANTS])
def variant(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str | None:
    """Each kernel forced in turn (None: the one the device would choose); tiled is the GPU kernel."""
    if request.param is not None:
        monkeypatch.setenv("NEUROFLOW_OPENCL_GEMM", request.param)
    else:
        monkeypatch.delenv("NEUROFLOW_OPENCL_GEMM", raising=False)
    return request.param
