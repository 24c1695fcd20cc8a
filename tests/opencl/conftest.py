"""Shared by the opencl tests: the ``opencl`` backend, its namespace (the tests skip without a driver), and each
GEMM kernel forced in turn."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
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


@contextlib.contextmanager
def forced_gemm(backend: Any, name: str | None) -> Iterator[None]:
    """``NEUROFLOW_OPENCL_GEMM=name`` (None: unset) inside the block, changed only while the device is idle.

    pocl links a kernel on its own threads, spawning the linker with the process environment; a setenv at
    that moment frees the array the spawn reads, the spawn fails (EFAULT) and pocl aborts the process.
    """
    saved = os.environ.get("NEUROFLOW_OPENCL_GEMM")
    _set_gemm(backend, name)
    try:
        yield
    finally:
        _set_gemm(backend, saved)


def _set_gemm(backend: Any, value: str | None) -> None:
    backend.synchronize()
    if value is None:
        os.environ.pop("NEUROFLOW_OPENCL_GEMM", None)
    else:
        os.environ["NEUROFLOW_OPENCL_GEMM"] = value


@pytest.fixture(params=[None, *VARIANTS])
def variant(request: pytest.FixtureRequest, backend: Any) -> Iterator[str | None]:
    """Each kernel forced in turn (None: the one the device would choose); tiled is the GPU kernel."""
    with forced_gemm(backend, request.param):
        yield request.param
