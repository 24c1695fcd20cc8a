"""NCCLCommunicator: the ``nccl`` communicator, over CuPy's ``cupy.cuda.nccl`` on device arrays (one GPU per rank).

The ranks meet through MPI (``mpiexec`` starts them): rank 0 draws NCCL's
unique id and broadcasts it; each rank takes GPU ``local rank % GPUs``.
Collectives run on a stream of their own that first waits for the work
queued before them (the backward that wrote the gradient); a handle is an
event on that stream. The few host scalars go over MPI.
"""

from __future__ import annotations

import os
from typing import Any

from neuroflow_distributed.buckets import GradientBuckets
from neuroflow_distributed.communicator import CommunicatorError, check_reduction
from neuroflow_distributed.launch import launch as launch_workers
from neuroflow_distributed.mpi import MPICommunicator

INSTALL_CUPY = "pip install cupy-cuda12x (or cupy-cuda13x), which brings NCCL"
#: Variables a launcher sets to this process's index among the ranks of its host.
LOCAL_RANK_VARIABLES = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK")


def import_nccl() -> tuple[Any, Any]:
    """``(cupy, cupy.cuda.nccl)``, or a CommunicatorError saying what to install or what is missing."""
    try:
        import cupy  # lazy: optional dependency, and importing it looks for the CUDA driver
        from cupy.cuda import nccl
    except ImportError as error:
        raise CommunicatorError(f"the nccl communicator needs CuPy with NCCL: {INSTALL_CUPY} "
                                f"({type(error).__name__}: {error})") from error
    if not getattr(nccl, "available", True):
        raise CommunicatorError(f"this CuPy was built without NCCL: {INSTALL_CUPY}")
    return cupy, nccl


def local_rank(rank: int) -> int:
    """This process's index on its host, from the launcher's variables (else its global rank)."""
    for variable in LOCAL_RANK_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit():
            return int(value)
    return rank


def visible_gpus(cupy: Any) -> int:
    """How many GPUs CuPy sees; a CommunicatorError when there is none (the nccl communicator needs one a rank)."""
    devices = _device_count(cupy)
    if devices == 0:
        raise CommunicatorError("the nccl communicator needs an NVIDIA GPU; none is visible "
                                "(use distributed='mpi' on CPUs)")
    return devices


def launch_on_gpus(nproc: int, argv: Any, communicator: str = "nccl") -> int:
    """``neuroflow train --nproc N`` with ``distributed = "nccl"``: CuPy, NCCL and a GPU are checked here, before
    any rank starts (else every rank would fail alike), then :func:`~neuroflow_distributed.launch.launch`."""
    cupy, _ = import_nccl()
    visible_gpus(cupy)
    return launch_workers(nproc, argv, communicator)


class NCCLHandle:
    """A collective queued on the communicator's stream; ``done``/``wait`` look at the event recorded after it."""

    def __init__(self, event: Any, finish: Any = None) -> None:
        self.event = event
        self.finish = finish

    def done(self) -> bool:
        return bool(self.event.done)

    def wait(self) -> None:
        self.event.synchronize()
        if self.finish is not None:
            finish, self.finish = self.finish, None
            finish()


class NCCLCommunicator:
    """One GPU per rank, as a :class:`Communicator` whose arrays are CuPy device arrays."""

    #: ``neuroflow train --nproc N`` starts its workers with this, through mpiexec (the rendezvous is over MPI)
    launch = staticmethod(launch_on_gpus)

    def __init__(self, mpi: MPICommunicator | None = None) -> None:
        cupy, nccl = import_nccl()
        devices = visible_gpus(cupy)
        self.cupy, self.nccl = cupy, nccl
        self.mpi = mpi if mpi is not None else MPICommunicator()
        self.rank, self.size = self.mpi.rank, self.mpi.size
        self.device = cupy.cuda.Device(local_rank(self.rank) % devices)
        self.device.use()
        unique_id = nccl.get_unique_id() if self.rank == 0 else None
        unique_id = self.mpi.comm.bcast(unique_id, root=0)
        self.comm = nccl.NcclCommunicator(self.size, unique_id, self.rank)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.closed = False
        self._dtypes = {"float16": nccl.NCCL_FLOAT16, "float32": nccl.NCCL_FLOAT32, "float64": nccl.NCCL_FLOAT64,
                        "int32": nccl.NCCL_INT32, "int64": nccl.NCCL_INT64}

    def __repr__(self) -> str:
        return f"NCCLCommunicator(rank={self.rank}, size={self.size}, device={self.device.id})"

    def broadcast(self, array: Any, root: int = 0) -> None:
        ptr, count, dtype = self._buffer(array)
        self._after_queued_work()
        self.comm.bcast(ptr, ptr, count, dtype, root, self.stream.ptr)
        self.stream.synchronize()

    def allreduce_sum(self, array: Any) -> None:
        self.start_allreduce_sum(array).wait()

    def start_allreduce_sum(self, array: Any) -> NCCLHandle:
        ptr, count, dtype = self._buffer(array)
        self._after_queued_work()
        self.comm.allReduce(ptr, ptr, count, dtype, self.nccl.NCCL_SUM, self.stream.ptr)
        return NCCLHandle(self.stream.record())

    def start_allreduce_mean(self, array: Any) -> NCCLHandle:
        handle = self.start_allreduce_sum(array)
        with self.stream:
            array *= array.dtype.type(1.0 / self.size)
        handle.event = self.stream.record()
        return handle

    def allreduce_scalars(self, values: list[float], op: str = "sum", what: str = "the step's sums") -> list[float]:
        return self.mpi.allreduce_scalars(values, check_reduction(op), what)

    def sparse_allreduce_sum(self, array: Any) -> bool:
        """The dense sum: NCCL has no gather of uneven lengths, and a GPU's links make dense the cheaper (False)."""
        self.allreduce_sum(array)
        return False

    def gradient_buckets(self, grad: Any, slices: list[slice], bucket_bytes: int) -> GradientBuckets:
        return GradientBuckets(self, grad, slices, bucket_bytes)

    def barrier(self) -> None:
        self.stream.synchronize()
        self.mpi.barrier()

    def abort(self, code: int, message: str) -> None:
        try:
            self.comm.abort()  # NCCL's own: a peer stuck in a kernel returns
        finally:
            self.mpi.abort(code, message)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.stream.synchronize()
            self.comm.destroy()
            self.mpi.close()

    def _buffer(self, array: Any) -> tuple[int, int, int]:
        if self.closed:
            raise CommunicatorError(f"{self!r} is closed")
        if not hasattr(array, "data") or not hasattr(array.data, "ptr"):
            raise CommunicatorError(f"the nccl communicator takes CuPy device arrays; got {type(array).__name__} "
                                    f"(distributed='mpi' stages host arrays)")
        if not array.flags.c_contiguous:
            raise CommunicatorError(f"collectives need contiguous arrays; got one of shape {array.shape}")
        dtype = self._dtypes.get(str(array.dtype))
        if dtype is None:
            raise CommunicatorError(f"NCCL has no {array.dtype}; available: {', '.join(self._dtypes)}")
        return int(array.data.ptr), int(array.size), dtype

    def _after_queued_work(self) -> None:
        """Make the collective's stream wait for what the current stream queued (the op that wrote the array)."""
        self.stream.wait_event(self.cupy.cuda.get_current_stream().record())


def _device_count(cupy: Any) -> int:
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # CuPy raises its own CUDARuntimeError when there is no driver
        return 0
