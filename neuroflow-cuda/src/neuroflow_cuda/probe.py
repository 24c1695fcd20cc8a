"""Finding CuPy and a CUDA device, and saying what is missing when there is none.

Nothing here imports CuPy at module import: ``neuroflow doctor`` and
``neuroflow backends`` load the backend class on machines without CuPy or
without a GPU, and must get a reason, not a traceback.
"""

from __future__ import annotations

import importlib
from typing import Any

from neuroflow.errors import BackendUnavailableError

MIN_CUPY_MAJOR = 13
INSTALL_HINT = (
    "install CuPy for your CUDA driver: pip install 'neuroflow-cuda[cuda12]' (CUDA 12 drivers) "
    "or 'neuroflow-cuda[cuda13]' (CUDA 13 drivers); `nvidia-smi` shows the driver's CUDA version"
)

#: Oldest CUDA version (as ``cudaDriverGetVersion`` reports it: 1000·major + 10·minor) whose driver
#: runs kernels natively on a compute capability. An older driver cannot load code built for the card.
MIN_CUDA_FOR_ARCH: dict[tuple[int, int], int] = {
    (5, 0): 6000, (6, 0): 8000, (7, 0): 9000, (7, 5): 10000,
    (8, 0): 11000, (8, 6): 11010, (8, 7): 11040, (8, 9): 11080,
    (9, 0): 11080, (10, 0): 12080, (12, 0): 12080,
}


def cuda_version_text(version: int) -> str:
    """``12040`` → ``"12.4"``: the form ``nvidia-smi`` prints."""
    return f"{version // 1000}.{version % 1000 // 10}"


def import_cupy() -> Any:
    """The ``cupy`` module; BackendUnavailableError saying what to install when it is missing or too old."""
    try:
        cupy = importlib.import_module("cupy")
    except ImportError as exc:
        raise BackendUnavailableError(f"backend 'cuda' needs CuPy, which is not importable ({exc}); {INSTALL_HINT}") from None
    major = _major(getattr(cupy, "__version__", "0"))
    if major < MIN_CUPY_MAJOR:
        raise BackendUnavailableError(
            f"backend 'cuda' needs CuPy >= {MIN_CUPY_MAJOR}; found {cupy.__version__}. {INSTALL_HINT}"
        )
    return cupy


def device_count(cupy: Any) -> int:
    """How many CUDA devices the driver shows; BackendUnavailableError naming the driver's complaint when none."""
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError without a driver; its class lives in a compiled module
        raise BackendUnavailableError(
            f"backend 'cuda': CuPy {cupy.__version__} is installed but the CUDA driver cannot be used "
            f"({type(exc).__name__}: {exc}). Check that an NVIDIA GPU and driver are present (`nvidia-smi`) "
            f"and that CuPy matches the driver's CUDA major version; {INSTALL_HINT}"
        ) from None
    if count == 0:
        raise BackendUnavailableError("backend 'cuda': the CUDA driver is loaded but reports no device (`nvidia-smi` lists none)")
    return count


def unavailable_reason() -> str | None:
    """Why ``cuda`` cannot run here, or None when CuPy imports and at least one device is present."""
    try:
        device_count(import_cupy())
    except BackendUnavailableError as exc:
        return str(exc)
    return None


def check_index(index: int, count: int) -> None:
    """Raise BackendUnavailableError unless ``cuda:index`` exists among ``count`` devices."""
    if not 0 <= index < count:
        existing = ", ".join(f"cuda:{i}" for i in range(count))
        raise BackendUnavailableError(f"device cuda:{index} was asked for; this machine has {count} CUDA device(s): {existing}")


def driver_warnings(driver: int, runtime: int, capability: tuple[int, int]) -> list[str]:
    """What is wrong with this driver for this card and this CuPy, as sentences; empty when all is well.

    ``driver`` and ``runtime`` are CUDA versions as the CUDA API reports them
    (12040 for 12.4); ``capability`` is the card's (major, minor).
    """
    warnings = []
    known = [cc for cc in MIN_CUDA_FOR_ARCH if cc <= capability]
    if capability > max(MIN_CUDA_FOR_ARCH):
        warnings.append(f"compute capability {capability[0]}.{capability[1]} is newer than this check knows; "
                        "if kernels fail to load, update the driver and CuPy")
    if known:
        needed = MIN_CUDA_FOR_ARCH[max(known)]
        if driver < needed:
            warnings.append(
                f"the driver supports CUDA {cuda_version_text(driver)}, older than the {cuda_version_text(needed)} "
                f"compute capability {capability[0]}.{capability[1]} needs: update the NVIDIA driver"
            )
    if driver // 1000 < runtime // 1000:
        warnings.append(
            f"the driver supports CUDA {cuda_version_text(driver)} but CuPy was built for CUDA "
            f"{cuda_version_text(runtime)}: install the CuPy wheel for CUDA {driver // 1000} or update the driver"
        )
    elif driver < runtime:
        # Minor-version compatibility runs prebuilt code, but PTX that NVRTC emits for the fused kernels
        # is only loaded by a driver at least as new as NVRTC.
        warnings.append(
            f"the driver supports CUDA {cuda_version_text(driver)}, older than CuPy's CUDA "
            f"{cuda_version_text(runtime)}: runtime-compiled kernels may fail to load; update the driver"
        )
    return warnings


def _major(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0
