"""Shared by the opencl tests: the ``opencl`` backend on every OpenCL device found (each driver in turn: the
wheel's pocl, Debian's, a vendor's), its namespace (the tests skip without a driver), and each GEMM kernel
forced in turn."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

try:
    from neuroflow_opencl.gemm import VARIANTS
except ImportError:  # not installed: the backend fixture skips every test
    VARIANTS = ()


def _devices() -> list[tuple[int, str]]:
    """(raw index, test id) of every OpenCL device, enumerated without running anything on it; the id names the
    driver (``pocl3.0-rc2-llvm14``) so that a driver-specific failure says whose it is."""
    try:
        from neuroflow_opencl.device import all_devices

        devices = all_devices()
    except Exception:  # no pyopencl, no ICD loader: one parameter, which skips
        return [(0, "opencl")]
    found = []
    for index, device in enumerate(devices):
        version = device.platform.version
        pocl = re.search(r"PoCL (\S+)", version)
        llvm = re.search(r"LLVM (\d+)", version)
        name = f"pocl{pocl.group(1)}" if pocl else re.sub(r"\W+", "-", device.platform.name.strip()).lower()
        found.append((index, name + (f"-llvm{llvm.group(1)}" if llvm else "") + f"-{index}"))
    return found or [(0, "opencl")]


DEVICES = _devices()


@pytest.fixture(scope="session", params=[index for index, _ in DEVICES], ids=[name for _, name in DEVICES])
def backend(request: pytest.FixtureRequest) -> Any:
    """The opencl backend on one OpenCL device (pocl on the CPU in CI), selected as a user would: by its name
    among the qualified devices. A device that failed qualification skips here; ``test_qualification`` fails
    for it, with the driver's name and what went wrong."""
    neuroflow_opencl = pytest.importorskip("neuroflow_opencl")
    reason = neuroflow_opencl.OpenclBackend.unavailable_reason()
    if reason:
        pytest.skip(reason)
    from neuroflow.backends import qualification
    from neuroflow.backends.selection import get_backend

    devices = qualification.offered("opencl")
    raw, verdict = devices[request.param]
    if not verdict.ok:
        pytest.skip(f"{verdict.device} did not qualify: {verdict.explain()}")
    return get_backend(f"opencl:{[r for r, v in devices if v.ok].index(raw)}")


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
