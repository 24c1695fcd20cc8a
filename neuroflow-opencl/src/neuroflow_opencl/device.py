"""OpenCL devices: enumeration across platforms, one context and two queues per device, compiled programs.

``opencl:N`` counts devices across every platform in the order the ICD
loader reports them, so an iGPU and pocl on one laptop are ``opencl:0`` and
``opencl:1``. Programs are compiled once per device and source text; pyopencl
additionally keeps the binaries in its on-disk cache between runs.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from neuroflow.errors import BackendUnavailableError, OutOfMemoryError
from neuroflow_opencl.cdtypes import ELEMENT_ALIGNED_VECTORS, element_aligned_vectors

MAX_CONSTANTS = 4096  # parameter buffers kept per device (see Device.constants)
INT64 = np.dtype(np.int64)

#: Host→device copies that may be in flight at once (each holds its host array alive until done).
MAX_PENDING_UPLOADS = 64

#: The widest vector, in bytes, that kernels use: one AVX-512 register (see ``Device.vector_bytes``).
VECTOR_BYTES = 64
#: ... on an x86 device whose compiler targets a CPU without AVX-512 (two AVX registers of it otherwise).
NARROW_VECTOR_BYTES = 32

#: Asks the device's own compiler which x86 vector extensions it generates code for (its predefined macros).
_TARGET_SOURCE = """__kernel void target(__global int* out)
{
    int features = 0;
#ifdef __x86_64__
    features |= 1;
#endif
#ifdef __AVX__
    features |= 2;
#endif
#ifdef __AVX512F__
    features |= 4;
#endif
    out[0] = features;
}
"""

NO_PLATFORM_HELP = (
    "no OpenCL platform was found. For an Intel or AMD integrated GPU install the vendor's OpenCL driver "
    "(ICD: intel-opencl-icd / Intel Graphics Compute Runtime, or AMD ROCm/Adrenalin); to run on the CPU "
    "install the portable driver with: pip install 'neuroflow-opencl[pocl]'"
)


DRIVER_HELP = (
    "Another OpenCL driver can run it: on Debian/Ubuntu `apt-get install pocl-opencl-icd` (PoCL with a newer "
    "LLVM, for the CPU), or your GPU vendor's ICD; `OCL_ICD_VENDORS=<directory of .icd files>` chooses which "
    "drivers load"
)


def _pyopencl() -> Any:
    try:
        import pyopencl
    except ImportError as exc:  # the package depends on it; a broken install still deserves a clear message
        raise BackendUnavailableError(f"the opencl backend needs pyopencl: pip install pyopencl ({exc})") from exc
    return pyopencl


@cache
def all_devices() -> tuple[Any, ...]:
    """Every OpenCL device of every platform, in ICD order (empty when there is no driver)."""
    cl = _pyopencl()
    try:
        platforms = cl.get_platforms()
    except cl.Error:  # "platform not found" is how the ICD loader says there is no driver
        return ()
    devices: list[Any] = []
    for platform in platforms:
        try:
            devices.extend(platform.get_devices())
        except cl.Error:
            continue
    return tuple(devices)


@dataclass(frozen=True)
class DeviceFacts:
    """What ``neuroflow doctor`` and the kernels need to know about one device."""

    index: int
    name: str
    platform: str
    driver: str  # the platform's version string: names the driver release (and pocl's LLVM)
    kind: str
    version: str
    global_mem_bytes: int
    max_alloc_bytes: int
    compute_units: int
    fp64: bool


def facts(device: Any, index: int) -> DeviceFacts:
    cl = _pyopencl()
    kind = "gpu" if device.type & cl.device_type.GPU else "cpu" if device.type & cl.device_type.CPU else "other"
    return DeviceFacts(
        index=index, name=device.name.strip(), platform=device.platform.name.strip(),
        driver=" ".join(device.platform.version.split()), kind=kind,
        version=device.version.strip(), global_mem_bytes=int(device.global_mem_size),
        max_alloc_bytes=int(device.max_mem_alloc_size), compute_units=int(device.max_compute_units),
        fp64="cl_khr_fp64" in device.extensions or bool(device.double_fp_config),
    )


#: Forces ``Device.vector_bytes`` (32 or 64) on every device, to measure or to check a driver with it.
VECTOR_BYTES_VAR = "NEUROFLOW_OPENCL_VECTOR_BYTES"


def forced_vector_bytes() -> int | None:
    """The width ``NEUROFLOW_OPENCL_VECTOR_BYTES`` forces, or None to follow the device's compiler target."""
    value = os.environ.get(VECTOR_BYTES_VAR)
    if not value:
        return None
    if value not in ("32", "64"):
        raise ValueError(f"{VECTOR_BYTES_VAR}={value!r}; expected 32 or 64 (bytes of a vector register), or unset")
    return int(value)


class Device:
    """One OpenCL device with its context, compute queue, copy queue and program cache."""

    def __init__(self, index: int = 0) -> None:
        cl = _pyopencl()
        devices = all_devices()
        if not devices:
            raise BackendUnavailableError(NO_PLATFORM_HELP)
        if not 0 <= index < len(devices):
            listing = ", ".join(f"opencl:{i} = {d.name.strip()}" for i, d in enumerate(devices))
            raise BackendUnavailableError(f"there is no OpenCL device {index}; found {listing}")
        self.cl = cl
        self.index = index
        self.device = devices[index]
        self.facts = facts(self.device, index)
        self.build_options = [f"-D{ELEMENT_ALIGNED_VECTORS}"] if element_aligned_vectors(self.facts.platform) else []
        self.context = cl.Context([self.device])
        self.queue = cl.CommandQueue(self.context)
        # Offload copies run on their own queue so compute never waits on a copy it does not need.
        self.copy_queue = cl.CommandQueue(self.context)
        self._programs: dict[str, Any] = {}
        self._constants: dict[tuple[np.dtype, tuple[Any, ...]], Any] = {}
        self._kernels: dict[tuple[str, str], Any] = {}
        #: The numpy-like namespace (``backend.xp``) over this device's arrays; ``Namespace.of(device)``, a
        #: layer above, makes it on first use.
        self.namespace: Any = None
        # lazy: pyopencl, a heavy dependency, is imported when a device opens (see _pyopencl), not with this module
        from pyopencl.tools import ImmediateAllocator, MemoryPool

        # Buffers of arrays the runtime did not plan (temporaries) come back to this pool when the array
        # is dropped: the in-order queue makes reuse safe, and the steady state creates no cl.Buffer.
        self._pool = MemoryPool(ImmediateAllocator(self.queue))
        self._next_address = 1 << 32
        # Events of queued host→device copies: pyopencl's event for such a copy waits for it when destroyed
        # (it keeps the host array alive), so dropping it at once would make every upload a host wait.
        self._uploads: collections.deque[Any] = collections.deque()

    @property
    def vector_bytes(self) -> int:
        """The width, in bytes, of the vectors the kernels keep in registers and load and store as one.

        64 (16 floats), unless the device's compiler targets an x86 CPU without AVX-512, as pocl 3.0's LLVM 14
        does on AMD Zen 4 (it knows the CPU only as ``znver3``): then 32. That LLVM crashes in codegen
        (``DAGTypeLegalizer::SplitVecRes_TernaryOp``, or "Do not know how to scalarize this operator's
        operand") on a 64-byte vector passed to one of pocl's builtins (``sqrt``, ``convert_float16``,
        ``vload16``), and without AVX-512 such a vector is two registers anyway. The rule reads the compiler's
        own ``__AVX512F__`` macro, from a one-line kernel run once per device.
        """
        width = self.__dict__.get("_vector_bytes")
        if width is None:
            width = forced_vector_bytes()
            if width is None:
                features = self.target_features()
                narrow = features & 1 and not features & 4
                width = NARROW_VECTOR_BYTES if narrow else VECTOR_BYTES
            self._vector_bytes = width
        return width

    def target_features(self) -> int:
        """Bit flags of what the device's compiler targets: 1 x86-64, 2 AVX, 4 AVX-512F (from its predefined
        macros; 0 for a GPU or another architecture)."""
        out = np.zeros(1, np.int32)
        buffer = self.cl.Buffer(self.context, self.cl.mem_flags.WRITE_ONLY, out.nbytes)
        self.kernel(_TARGET_SOURCE, "target")(self.queue, (1,), None, buffer)
        self.cl.enqueue_copy(self.queue, out, buffer)
        self.queue.finish()
        return int(out[0])

    def allocate(self, nbytes: int) -> Any:
        """A buffer of at least ``nbytes`` bytes from the device pool."""
        if nbytes > self.facts.max_alloc_bytes:
            raise OutOfMemoryError(
                f"{nbytes} bytes exceed the largest single allocation of {self.facts.name} "
                f"({self.facts.max_alloc_bytes} bytes); lower the batch size or set a memory budget"
            )
        return self._pool.allocate(max(int(nbytes), 1))

    def reserve_address(self, nbytes: int) -> int:
        """A fresh virtual address range of ``nbytes`` (never reused, so stale views never alias new ones)."""
        address = self._next_address
        self._next_address += (max(int(nbytes), 1) + 4095) // 4096 * 4096
        return address

    @property
    def pool_bytes(self) -> int:
        """Bytes the temporary pool holds on the device (in use or kept for reuse)."""
        return int(self._pool.managed_bytes)

    def keep_until_done(self, event: Any) -> None:
        """Hold a host→device copy's event until it has completed (checked without waiting)."""
        complete = self.cl.command_execution_status.COMPLETE
        uploads = self._uploads
        while uploads and uploads[0].command_execution_status == complete:
            uploads.popleft()
        if len(uploads) >= MAX_PENDING_UPLOADS:  # bound the host memory held: wait for the oldest
            uploads.popleft().wait()
        uploads.append(event)

    def synchronize(self) -> None:
        self.queue.finish()
        self._uploads.clear()

    def constants(self, values: tuple[Any, ...], dtype: np.dtype = INT64) -> Any:
        """A read-only buffer of ``values`` as ``dtype``, made once per distinct tuple and kept.

        Kernels read their offsets, strides, sizes and scalar parameters from such buffers: pocl takes
        ~9 µs to set each scalar argument (measured: 17 longs cost 150 µs of a 165 µs launch; one float
        set between launches of a kernel ~30 µs) and ~0.1 µs to set a buffer, and a training step repeats
        the same sizes, strides, offsets and hyperparameters every step.
        """
        key = (dtype, values)
        buffer = self._constants.get(key)
        if buffer is None:
            if len(self._constants) >= MAX_CONSTANTS:  # shapes that never repeat: start over (queued kernels keep theirs)
                self._constants.clear()
            buffer = self._constants[key] = self.arguments(values, dtype)
        return buffer

    def arguments(self, values: tuple[Any, ...], dtype: np.dtype = INT64) -> Any:
        """A new read-only buffer of ``values`` as ``dtype``, for parameters that change at every launch (an
        optimizer's bias corrections): ~6 µs, where setting them as scalar arguments costs ~9 µs each."""
        host = np.array(values or (0,), dtype=dtype)
        return self.cl.Buffer(self.context, self.cl.mem_flags.READ_ONLY | self.cl.mem_flags.COPY_HOST_PTR,
                              hostbuf=host)

    def kernel(self, source: str, name: str) -> Any:
        """The kernel ``name`` of ``source``, compiled on first use and kept for the process."""
        key = (source, name)
        kernel = self._kernels.get(key)
        if kernel is None:
            program = self._programs.get(source)
            if program is None:
                program = self.cl.Program(self.context, source).build(options=self.build_options)
                self._programs[source] = program
            kernel = getattr(program, name)
            self._kernels[key] = kernel
        return kernel

    def __repr__(self) -> str:
        return f"<opencl:{self.index} {self.facts.name} ({self.facts.platform})>"
