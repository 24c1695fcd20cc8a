"""The Backend interface: what every device plugin provides.

Ops are written once against ``backend.xp``; the primitives below have a
generic implementation on ``xp`` that a device backend overrides only where
it has something faster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from neuroflow.allocators.direct import DirectAllocator
from neuroflow.allocators.stats import MemoryStats
from neuroflow.backends.namespaces import array_namespace


class Backend:
    """One device: its array namespace, copies to and from the host, counters, primitives."""

    name: ClassVar[str] = "base"
    xp: Any = np

    def __init__(self, index: int = 0) -> None:
        self.index = index  # the device's own index (``device_count`` counts them)
        #: The name the user selected it by, set by ``get_backend``: ``name:N`` counts qualified devices only.
        self.selected_as: str | None = None
        self._allocator: Any = None

    # ---------------------------------------------------------------- identity
    @classmethod
    def is_available(cls) -> bool:
        """Whether this backend can run on this machine (drivers, devices present)."""
        return True

    @classmethod
    def device_count(cls) -> int:
        """How many devices ``name:0`` … ``name:N-1`` this backend can run on here."""
        return 1 if cls.is_available() else 0

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this backend cannot run here and what to install; None when it can."""
        return None if cls.is_available() else f"backend {cls.name!r} cannot run on this machine"

    # ---------------------------------------------------------------- qualification
    #: Whether a device of this backend must pass a run in a child process before this process uses it
    #: (``neuroflow.backends.qualification``): every device plugin, unless it runs nothing but numpy.
    needs_qualification: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass is qualified unless it says otherwise itself: a plugin deriving from ``CpuBackend`` to
        reuse its copies still runs code of its own."""
        super().__init_subclass__(**kwargs)
        if "needs_qualification" not in cls.__dict__:
            cls.needs_qualification = True

    @classmethod
    def device_identity(cls, index: int) -> dict[str, str]:
        """What names device ``index`` and the driver that runs it, read without running anything on it:
        qualification is cached per identity. A backend with drivers of its own adds their versions."""
        return {"backend": cls.name, "device": str(index)}

    @classmethod
    def driver_help(cls, index: int) -> str:
        """What a user can do when device ``index`` is refused (another driver to install, say)."""
        return ""

    def self_test(self, report: Callable[[str], None]) -> None:
        """Build and run this backend's own kernels, raising ``AssertionError`` on a wrong result; called in
        the qualification child before the common training check. ``report(stage)`` names each stage first,
        so a crash can be blamed on it. The default has nothing beyond the common check to run."""

    def describe(self) -> dict[str, str]:
        """Facts for ``neuroflow doctor``: device name, versions, memory."""
        return {"backend": self.name, "device": str(self.index)}

    @property
    def device(self) -> str:
        """``name:N`` as ``get_backend`` takes it."""
        return self.selected_as or f"{self.name}:{self.index}"

    # ---------------------------------------------------------------- memory
    @property
    def allocator(self) -> Any:
        if self._allocator is None:
            self._allocator = DirectAllocator(self.xp)
        return self._allocator

    def use_allocator(self, allocator: Any) -> None:
        self._allocator = allocator

    def memory_stats(self) -> MemoryStats:
        """Bytes in use and at peak, pool size and allocation count, as the allocator counted them."""
        return self.allocator.stats()

    def free_bytes(self) -> int | None:
        """Device memory still free for the pool, or None where there is no separate device pool (cpu)."""
        return None

    def unload(self, array: Any) -> Any:
        """Start moving ``array`` to host memory; returns a handle for ``reload``.

        A device backend copies on a separate stream/queue into pinned host
        memory and releases the device buffer once the copy is done; the
        generic implementation keeps the array where it is.
        """
        return array

    def reload(self, handle: Any) -> Any:
        """The device array for a handle from ``unload``, waiting only for that copy."""
        return handle

    # ---------------------------------------------------------------- copies
    def from_host(self, array: np.ndarray) -> Any:
        """A device array holding a copy of the host array ``array``."""
        return self.xp.asarray(array)

    def to_host(self, array: Any) -> np.ndarray:
        """A numpy array with the contents of device array ``array`` (waits for pending work)."""
        return np.asarray(array)

    def start_to_host(self, array: Any) -> Callable[[], np.ndarray]:
        """Start copying ``array`` to the host; calling the result returns the numpy copy.

        A backend that queues work can start the copy now and have it done by the next host wait, which
        spares the caller a wait of its own (the Trainer reads the logits for accuracy so, and then the
        loss). The caller must not write ``array`` before calling the result. This default copies then.
        """
        return lambda: self.to_host(array)

    def synchronize(self) -> None:
        """Wait until all queued work on this device is done (one host wait per step)."""

    # ---------------------------------------------------------------- primitives
    def kernel(self, name: str) -> Callable[..., Any] | None:
        """This backend's fused implementation of ``name``, or None: the caller runs its generic code on ``xp``.

        The names, parameters and results are declared once, in :mod:`neuroflow.backends.kernels`
        (``kernels.LINEAR``, ...); a backend builds its table with ``kernels.implementations``, which
        refuses an undeclared name. A fused kernel writes into the caller's buffers and agrees with the
        generic code to float rounding.
        """
        return None

    def fused(self, name: str, like: Any) -> Callable[..., Any] | None:
        """``kernel(name)`` for arrays like ``like``; None for arrays of another namespace (a host-side trace of
        a model placed on this backend, as ``nf.memory.profile`` makes, must run the generic code)."""
        return self.kernel(name) if array_namespace(like) is self.xp else None

    def matmul(self, a: Any, b: Any, out: Any = None) -> Any:
        """General matrix product; the hot path of Linear and convolution."""
        return self.xp.matmul(a, b, out=out)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.device}>"
