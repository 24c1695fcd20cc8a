"""The ``cuda`` backend: CuPy as ``xp``, fused kernels for hot paths, routed memory, async offload.

Selecting ``cuda:N`` makes device N current for this thread and checks that
it is; everything the backend allocates afterwards lands there.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from neuroflow.backends.base import Backend
from neuroflow.errors import BackendUnavailableError, ConfigError
from neuroflow_cuda import fused, pool, probe
from neuroflow_cuda.offload import AsyncOffloader, CupyCopyRuntime, OffloadHandle

_ROUTING: dict[str, Any] = {}  # one router per process: CuPy's allocator setting is process-wide


def _env_mb(name: str, default_bytes: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default_bytes
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number of MiB; got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"{name} must be >= 0 MiB; got {raw!r}")
    return int(value * 2**20)


class CudaBackend(Backend):
    """NVIDIA GPUs through CuPy ≥ 13.

    Environment: ``NEUROFLOW_CUDA_SCRATCH_MB`` caps CuPy's pool for small
    temporaries (default 256); ``NEUROFLOW_CUDA_DIRECT_MB`` is the size from
    which a request gets its own device allocation (default 8);
    ``NEUROFLOW_CUDA_DISABLE`` is a comma-separated list of fused kernels to
    leave to the generic code (to bisect a suspected kernel bug).
    """

    name: ClassVar[str] = "cuda"

    def __init__(self, index: int = 0) -> None:
        super().__init__(index)
        cupy = probe.import_cupy()
        probe.check_index(index, probe.device_count(cupy))
        self.cupy = cupy
        self.xp = cupy
        self._device = cupy.cuda.Device(index)
        self._device.use()
        current = int(cupy.cuda.runtime.getDevice())
        if current != index:
            raise BackendUnavailableError(f"selected cuda:{index} but the current CUDA device is cuda:{current}; "
                                          "another library may have changed it: select the device once, before training")
        self.router, self.scratch_pool = self._routing(cupy)
        disabled = frozenset(n.strip() for n in os.environ.get("NEUROFLOW_CUDA_DISABLE", "").split(",") if n.strip())
        self._kernels = fused.bind(cupy, disabled)
        self._offloader: AsyncOffloader | None = None

    @staticmethod
    def _routing(cupy: Any) -> tuple[pool.RoutedAllocator, Any]:
        if not _ROUTING:
            router, scratch = pool.install(
                cupy,
                scratch_limit=_env_mb("NEUROFLOW_CUDA_SCRATCH_MB", pool.DEFAULT_SCRATCH_LIMIT),
                direct_threshold=_env_mb("NEUROFLOW_CUDA_DIRECT_MB", pool.DEFAULT_DIRECT_THRESHOLD),
            )
            _ROUTING.update(router=router, pool=scratch)
        return _ROUTING["router"], _ROUTING["pool"]

    # ---------------------------------------------------------------- identity
    @classmethod
    def is_available(cls) -> bool:
        return probe.unavailable_reason() is None

    @classmethod
    def device_count(cls) -> int:
        if not cls.is_available():
            return 0
        import cupy  # lazy: optional and heavy; imported only once it is known to be installed

        return probe.device_count(cupy)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """What is missing for ``cuda`` to run here and what to install; None when it can run."""
        return probe.unavailable_reason()

    def describe(self) -> dict[str, str]:
        runtime = self.cupy.cuda.runtime
        props = runtime.getDeviceProperties(self.index)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        capability = (int(props["major"]), int(props["minor"]))
        driver, cuda_runtime = int(runtime.driverGetVersion()), int(runtime.runtimeGetVersion())
        free, total = self._device.mem_info
        facts = {
            "backend": "cuda", "device": f"cuda:{self.index} {name}",
            "compute_capability": f"{capability[0]}.{capability[1]}",
            "memory": f"{free / 2**20:.0f}/{total / 2**20:.0f} MiB free",
            "driver_cuda": probe.cuda_version_text(driver), "runtime_cuda": probe.cuda_version_text(cuda_runtime),
            "cupy": str(self.cupy.__version__),
        }
        for i, warning in enumerate(probe.driver_warnings(driver, cuda_runtime, capability)):
            facts[f"WARNING{i + 1 if i else ''}"] = warning
        return facts

    def kernel(self, name: str) -> Callable[..., Any] | None:
        """The fused kernel registered as ``name`` (see ``neuroflow_cuda.fused``), or None: use the generic path."""
        return self._kernels.get(name)

    # ---------------------------------------------------------------- memory
    def free_bytes(self) -> int:
        """Device memory still free for allocations: the driver's free memory plus what the scratch pool caches."""
        free, _ = self._device.mem_info
        return int(free) + int(self.scratch_pool.free_bytes())

    def device_allocations(self) -> int:
        """Device allocations made so far (direct and scratch-pool growths); a steady-state step adds none."""
        return self.router.counters.device_allocations

    @property
    def offloader(self) -> AsyncOffloader:
        if self._offloader is None:
            self._offloader = AsyncOffloader(CupyCopyRuntime(self.cupy))
        return self._offloader

    def unload(self, array: Any) -> OffloadHandle:
        return self.offloader.unload(self.cupy.ascontiguousarray(array))

    def reload(self, handle: Any) -> Any:
        if not isinstance(handle, OffloadHandle):
            return handle  # never unloaded (the OffloadManager may hand back what it was given)
        return self.offloader.reload(handle)

    # ---------------------------------------------------------------- copies
    def from_host(self, array: np.ndarray) -> Any:
        return self.cupy.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        if isinstance(array, np.ndarray):
            return array
        if isinstance(array, OffloadHandle):
            self.offloader.collect()
            array.copied.synchronize()
            return np.array(array.host, copy=True)
        return self.cupy.asnumpy(array)

    def synchronize(self) -> None:
        self._device.synchronize()

    def matmul(self, a: Any, b: Any, out: Any = None) -> Any:
        return self.cupy.matmul(a, b, out=out)
