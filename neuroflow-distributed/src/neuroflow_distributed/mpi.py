"""MPICommunicator: the ``mpi`` communicator, over mpi4py on host (numpy) buffers.

Collectives run on a duplicate of ``COMM_WORLD``, so they never match a
user's own MPI calls. Device arrays (CuPy, OpenCL) are staged through host
buffers kept per shape, so a steady-state CuPy step allocates nothing.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np

from neuroflow_distributed import faults
from neuroflow_distributed.buckets import GradientBuckets
from neuroflow_distributed.communicator import INSTALL_MPI, CommunicatorError, check_reduction
from neuroflow_distributed.launch import launch as launch_workers
from neuroflow_distributed.sparse import sparse_allreduce_sum

#: Seconds between a rank's last words and its MPI abort. Flushed output is still in the pipe to the launcher's
#: proxy when the abort kills every rank, and the proxy, killed too, may not forward it: under load a run ended
#: with no message at all. The pause lets the proxy forward this rank's message, and another rank's, which
#: is printing its own.
ABORT_GRACE_S = 0.5


class MPIHandle:
    """A started ``Iallreduce``: :meth:`done` drives MPI's progress without blocking, :meth:`wait` finishes it."""

    def __init__(self, request: Any, finish: Any = None) -> None:
        self.request = request
        self.finish = finish  # copies a staged result back to the device array, or scales a mean

    def done(self) -> bool:
        """Whether the result is in (MPI progresses a non-blocking collective only inside MPI calls: this is one)."""
        return bool(self.request.Test())

    def wait(self) -> None:
        faults.wait(self.request, "a gradient allreduce")  # with a deadline: a lost rank ends the run
        if self.finish is not None:
            finish, self.finish = self.finish, None
            finish()


class MPICommunicator:
    """The processes ``mpiexec`` started (one alone under plain ``python``), as a :class:`Communicator`."""

    #: ``neuroflow train --nproc N`` starts its workers with this (see :mod:`neuroflow_distributed.launch`)
    launch = staticmethod(launch_workers)

    def __init__(self, comm: Any = None) -> None:
        try:
            from mpi4py import MPI  # lazy: optional dependency, and importing it initialises MPI
        except ImportError as error:
            raise CommunicatorError(f"the mpi communicator needs mpi4py and an MPI library: {INSTALL_MPI} "
                                    f"({type(error).__name__}: {error})") from error
        self.MPI = MPI
        self.world = MPI.COMM_WORLD
        self.comm = (comm if comm is not None else self.world).Dup()
        self.rank = int(self.comm.Get_rank())
        self.size = int(self.comm.Get_size())
        if self.size > 1:  # a rank that fails, dies or hangs ends the run (a communicator of its own for the exit)
            faults.install(self, self.world.Dup().Ibarrier)
        self.closed = False
        self._ops = {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}
        # staging buffers of device arrays; an in-flight one holds its array, so that its id is not reused
        self._staging: dict[tuple[int, tuple[int, ...], str], tuple[Any, np.ndarray]] = {}

    def __repr__(self) -> str:
        return f"MPICommunicator(rank={self.rank}, size={self.size})"

    # ------------------------------------------------------------------ collectives
    def broadcast(self, array: Any, root: int = 0) -> None:
        host = self._host(array)
        faults.wait(self._live().Ibcast(host, root=root), f"a broadcast from rank {root}")
        self._back(array, host)

    def allreduce_sum(self, array: Any) -> None:
        host = self._host(array)
        faults.wait(self._live().Iallreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM), "an allreduce")
        self._back(array, host)

    def start_allreduce_sum(self, array: Any) -> MPIHandle:
        """Start replacing ``array`` with the sum over ranks; :meth:`MPIHandle.wait` finishes it."""
        host = self._host(array, own=True)
        request = self._live().Iallreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM)
        return MPIHandle(request, None if host is array else (lambda: self._back(array, host)))

    def start_allreduce_mean(self, array: Any) -> MPIHandle:
        host = self._host(array, own=True)
        request = self._live().Iallreduce(self.MPI.IN_PLACE, host, op=self.MPI.SUM)
        scale = 1.0 / self.size

        def finish() -> None:
            np.multiply(host, host.dtype.type(scale), out=host)  # the same bits on every rank: the same sum scaled
            self._back(array, host)

        return MPIHandle(request, finish)

    def allreduce_scalars(self, values: list[float], op: str = "sum", what: str = "the step's sums") -> list[float]:
        buffer = np.asarray(values, dtype=np.float64).copy()
        faults.wait(self._live().Iallreduce(self.MPI.IN_PLACE, buffer, op=self._ops[check_reduction(op)]),
                    f"an allreduce of {what}")
        return [float(v) for v in buffer]

    def sparse_allreduce_sum(self, array: Any) -> bool:
        """Replace ``array`` with its sum over ranks, sending only its nonzeros (see :mod:`.sparse`); whether it did."""
        host = self._host(array)
        sent = sparse_allreduce_sum(self._live(), host)
        self._back(array, host)
        return sent

    def gradient_buckets(self, grad: Any, slices: list[slice], bucket_bytes: int) -> GradientBuckets:
        """Buckets over the flat gradient ``grad`` (see :class:`GradientBuckets`), allreduced with this communicator."""
        return GradientBuckets(self, grad, slices, bucket_bytes)

    def barrier(self) -> None:
        faults.wait(self._live().Ibarrier(), "a barrier")

    def abort(self, code: int, message: str) -> None:
        monitor = faults.monitor()
        if monitor is not None:  # the launcher reads why from the run directory
            monitor.record_abort(code, message)
        print(f"neuroflow: rank {self.rank} of {self.size} aborts the run: {message}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        time.sleep(ABORT_GRACE_S)
        self.world.Abort(int(code))

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.comm.Free()

    # ------------------------------------------------------------------ buffers
    def _live(self) -> Any:
        if self.closed:
            raise CommunicatorError(f"{self!r} is closed")
        return self.comm

    def _host(self, array: Any, own: bool = False) -> np.ndarray:
        """``array`` itself when it is a contiguous numpy array; else a host copy in a kept staging buffer: one
        per shape for a blocking call, one of ``array``'s own (``own``) for a collective that stays in flight."""
        if isinstance(array, np.ndarray):
            if not array.flags.c_contiguous:
                raise CommunicatorError(f"collectives need contiguous arrays; got one of shape {array.shape} "
                                        f"with strides {array.strides}")
            return array
        if not hasattr(array, "get"):
            raise CommunicatorError(f"the mpi communicator takes numpy, CuPy or OpenCL arrays; got "
                                    f"{type(array).__name__}")
        key = (id(array) if own else 0, tuple(array.shape), str(array.dtype))
        kept = self._staging.get(key)
        if kept is None or kept[0] is not array and own:
            kept = self._staging[key] = (array if own else None, np.empty(array.shape, dtype=array.dtype))
        host = kept[1]
        if type(array).__module__.split(".")[0] == "cupy":
            array.get(out=host)
        else:  # an OpenCL array (NeuroFlow's ClArray, pyopencl's Array): its get() returns a new host copy
            np.copyto(host, array.get())
        return host

    @staticmethod
    def _back(array: Any, host: np.ndarray) -> None:
        if host is array:
            return
        if hasattr(array, "set"):  # CuPy, pyopencl
            array.set(host)
        else:  # NeuroFlow's ClArray copies a host array in by assignment
            array[...] = host
