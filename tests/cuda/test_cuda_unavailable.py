"""Without CuPy, with a too-old CuPy, without a driver or device: `cuda` says what is missing and what to install."""

from __future__ import annotations

import subprocess
import sys
import types
from typing import Any

import pytest

from neuroflow import registry
from neuroflow.errors import BackendUnavailableError
from neuroflow_cuda.backend import CudaBackend


def fake_cupy(version: str = "14.0.0", count: int | Exception = 1) -> types.ModuleType:
    def get_device_count() -> int:
        if isinstance(count, Exception):
            raise count
        return count

    module = types.ModuleType("cupy")
    module.__version__ = version  # type: ignore[attr-defined]
    module.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=get_device_count))  # type: ignore[attr-defined]
    return module


def with_cupy(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    if module is None:  # an import of cupy that fails, whether or not it is installed here
        monkeypatch.setitem(sys.modules, "cupy", None)
    else:
        monkeypatch.setitem(sys.modules, "cupy", module)


def test_the_backend_is_registered_through_its_entry_point() -> None:
    assert "cuda" in registry.backends.names()
    assert registry.backends.distribution("cuda") == "neuroflow-cuda"
    assert registry.backends.get("cuda") is CudaBackend


def test_without_cupy_the_backend_is_unavailable_and_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    with_cupy(monkeypatch, None)
    assert CudaBackend.is_available() is False
    reason = CudaBackend.unavailable_reason()
    assert reason is not None and "needs CuPy" in reason and "pip install 'neuroflow-cuda[cuda12]'" in reason
    with pytest.raises(BackendUnavailableError, match=r"needs CuPy.*neuroflow-cuda\[cuda12\]"):
        CudaBackend(0)


def test_an_old_cupy_is_refused_with_the_version_found(monkeypatch: pytest.MonkeyPatch) -> None:
    with_cupy(monkeypatch, fake_cupy("12.3.0"))
    reason = CudaBackend.unavailable_reason()
    assert reason is not None and "CuPy >= 13; found 12.3.0" in reason


def test_a_driver_error_is_reported_with_the_drivers_own_words(monkeypatch: pytest.MonkeyPatch) -> None:
    with_cupy(monkeypatch, fake_cupy(count=RuntimeError("cudaErrorInsufficientDriver")))
    reason = CudaBackend.unavailable_reason()
    assert reason is not None and "cudaErrorInsufficientDriver" in reason and "nvidia-smi" in reason
    with pytest.raises(BackendUnavailableError, match="CUDA driver cannot be used"):
        CudaBackend(0)


def test_no_device_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    with_cupy(monkeypatch, fake_cupy(count=0))
    assert CudaBackend.is_available() is False
    assert "reports no device" in (CudaBackend.unavailable_reason() or "")


def test_a_device_index_past_the_last_names_the_devices_that_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    with_cupy(monkeypatch, fake_cupy(count=2))
    with pytest.raises(BackendUnavailableError, match=r"cuda:5 was asked for; this machine has 2 CUDA device\(s\): cuda:0, cuda:1"):
        CudaBackend(5)


def test_importing_the_package_and_probing_never_crash_or_import_cupy_eagerly() -> None:
    code = ("import sys, neuroflow_cuda, neuroflow_cuda.backend; "
            "print(neuroflow_cuda.backend.CudaBackend.is_available() in (True, False)); "
            "print('cupy' in sys.modules and not neuroflow_cuda.backend.CudaBackend.is_available())")
    done = subprocess.run([sys.executable, "-c", "import sys, neuroflow_cuda; print('cupy' in sys.modules)"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split()[0] == "True"
