"""The ``opencl`` backend: Intel/AMD integrated GPUs (and pocl on the CPU) through OpenCL C kernels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from neuroflow.backends.base import Backend
from neuroflow_opencl import fused, selftest
from neuroflow_opencl.array import ClArray, is_array
from neuroflow_opencl.device import DRIVER_HELP, NO_PLATFORM_HELP, Device, all_devices, forced_vector_bytes
from neuroflow_opencl.namespace import Namespace
from neuroflow_opencl.offload import Offloader, Unloaded
from neuroflow_opencl.transfer import from_host, start_to_host, to_host


class OpenclBackend(Backend):
    """Runs ops on one OpenCL device; ``xp`` is NeuroFlow's namespace over device buffers.

    Work is queued, never waited for, until a value is read on the host:
    the loss of a step is the one host wait per training step.
    """

    name: ClassVar[str] = "opencl"

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        self.cl_device = Device(index)
        self.xp = Namespace.of(self.cl_device)
        self._kernels = fused.bind(self.cl_device)
        self.offloader = Offloader(self.cl_device)

    @classmethod
    def is_available(cls) -> bool:
        try:
            return bool(all_devices())
        except Exception:  # a broken ICD or pyopencl install means "not here", which doctor then explains
            return False

    @classmethod
    def device_count(cls) -> int:
        try:
            return len(all_devices())
        except Exception:
            return 0

    @classmethod
    def unavailable_reason(cls) -> str | None:
        try:
            return None if all_devices() else NO_PLATFORM_HELP
        except Exception as exc:
            return f"OpenCL could not be initialised ({type(exc).__name__}: {exc}); {NO_PLATFORM_HELP}"

    @classmethod
    def device_identity(cls, index: int) -> dict[str, str]:
        """The platform (driver) and device behind raw device ``index``, as the ICD loader reports them."""
        device = all_devices()[index]
        return {"backend": cls.name, "platform": device.platform.name.strip(),
                "platform version": device.platform.version.strip(), "device": device.name.strip(),
                "device version": device.version.strip(), "driver": device.driver_version.strip(),
                "vector bytes": str(forced_vector_bytes() or "from the compiler target")}

    @classmethod
    def driver_help(cls, index: int) -> str:
        return DRIVER_HELP

    def self_test(self, report: Callable[[str], None]) -> None:
        selftest.run(self, report)

    def describe(self) -> dict[str, str]:
        f = self.cl_device.facts
        return {
            "device": f.name, "platform": f.platform, "driver": f.driver, "type": f.kind, "opencl": f.version,
            "memory_mib": str(f.global_mem_bytes >> 20), "compute_units": str(f.compute_units),
            "fp64": "yes" if f.fp64 else "no", "vectors": f"{self.cl_device.vector_bytes} bytes",
        }

    def from_host(self, array: np.ndarray) -> ClArray:
        host = np.asarray(array)
        if host.dtype == np.float64 and not self.cl_device.facts.fp64:
            raise TypeError(f"{self.cl_device.facts.name} has no double precision (cl_khr_fp64); use float32")
        return from_host(self.cl_device, host)

    def to_host(self, array: Any) -> np.ndarray:
        return to_host(array) if is_array(array) else np.asarray(array)

    def start_to_host(self, array: Any) -> Callable[[], np.ndarray]:
        return start_to_host(array) if is_array(array) else super().start_to_host(array)

    # ---------------------------------------------------------------- memory
    def free_bytes(self) -> int:
        """Device memory not held by NeuroFlow's buffers (OpenCL has no query for what other programs use)."""
        self.offloader.release_finished()
        return max(self.cl_device.facts.global_mem_bytes - self.cl_device.pool_bytes, 0)

    def unload(self, array: Any) -> Any:
        return self.offloader.unload(array)

    def reload(self, handle: Any) -> Any:
        return self.offloader.reload(handle) if isinstance(handle, Unloaded) else handle

    def synchronize(self) -> None:
        self.cl_device.synchronize()

    def kernel(self, name: str) -> Callable[..., Any] | None:
        return self._kernels.get(name)
