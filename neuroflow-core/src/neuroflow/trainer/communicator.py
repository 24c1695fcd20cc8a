"""Communicator: what a data-parallel Trainer asks of the processes it trains with, and how it finds one.

The core never imports a communicator's implementation: a distribution
(``neuroflow-distributed``) registers factories in the entry-point group
``neuroflow_communicators`` (``mpi``, ``nccl``), and :func:`open_communicator`
calls the one a Trainer's ``distributed=`` option names. A factory takes no
arguments and returns an object with the methods of :class:`Communicator`.
"""

from __future__ import annotations

import os
from typing import Any, Protocol, runtime_checkable

from neuroflow.errors import ConfigError
from neuroflow.registry import communicators

#: Set by ``neuroflow train --nproc N`` (and honoured under any launcher): the communicator ``distributed="auto"``
#: opens. Without it, "auto" opens ``mpi`` when an MPI launcher's variables say there are several processes.
COMMUNICATOR_VARIABLE = "NEUROFLOW_DISTRIBUTED"
#: Process-count variables of the MPI launchers: MPICH/Intel MPI (hydra), Open MPI, Slurm's PMI.
MPI_SIZE_VARIABLES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS", "PMIX_SIZE")


class Handle(Protocol):
    """A collective started and not yet finished; :meth:`wait` blocks until its result is in the array."""

    def done(self) -> bool:
        """Whether the result is in, without blocking (it also lets the library progress the collective)."""
        ...

    def wait(self) -> None: ...


class GradientReducer(Protocol):
    """The gradient of one flat buffer, summed over ranks in buckets while backward still runs.

    The Trainer calls :meth:`begin` before a step's last backward,
    :meth:`ready` as each parameter's gradient becomes final (in whatever
    order backward finishes them), then :meth:`finish`, which starts what is
    left and waits for everything: the buffer then holds the sum over ranks.
    """

    def begin(self) -> None: ...

    def ready(self, index: int) -> None:
        """Parameter ``index`` (its position in the flat buffer) holds its final gradient of this step (called
        only between :meth:`begin` and :meth:`finish`, at most once per parameter)."""
        ...

    def finish(self) -> None: ...


@runtime_checkable
class Communicator(Protocol):
    """The processes of one data-parallel run; every collective is entered by every rank, in the same order.

    Arrays are the backend's (numpy for mpi; CuPy device arrays for nccl, or
    host-staged by an mpi communicator), contiguous, and modified in place.
    """

    #: this process's index, 0 .. size-1; rank 0 writes files and prints
    rank: int
    #: the number of processes
    size: int

    def broadcast(self, array: Any, root: int = 0) -> None:
        """Overwrite ``array`` on every rank with ``root``'s (blocking)."""
        ...

    def allreduce_sum(self, array: Any) -> None:
        """Replace ``array`` on every rank with the element-wise sum over ranks (blocking)."""
        ...

    def start_allreduce_sum(self, array: Any) -> Handle:
        """Start replacing ``array`` with the element-wise sum over ranks (see :meth:`start_allreduce_mean`)."""
        ...

    def start_allreduce_mean(self, array: Any) -> Handle:
        """Start replacing ``array`` with the element-wise mean over ranks; done once the handle's ``wait`` returns.

        The array must not be read or written until then. Every rank gets the
        same bits (the sum is reduced once and broadcast, or reduced in the
        same order everywhere).
        """
        ...

    def allreduce_scalars(self, values: list[float], op: str = "sum", what: str = "the step's sums") -> list[float]:
        """The element-wise ``op`` ("sum", "max" or "min") over ranks of a few float64 values (blocking); ``what``
        they are names the collective in the error of a rank that waited too long in it."""
        ...

    def sparse_allreduce_sum(self, array: Any) -> bool:
        """Replace the mostly-zero ``array`` (a compressed gradient) with its sum over ranks, exchanging only its
        nonzero entries where that sends fewer bytes (blocking); whether it did."""
        ...

    def gradient_buckets(self, grad: Any, slices: list[slice], bucket_bytes: int) -> GradientReducer:
        """A reducer of the flat gradient ``grad`` whose parameters own ``slices``, in buckets of about
        ``bucket_bytes`` taken in reverse parameter order (the order backward finishes them)."""
        ...

    def barrier(self) -> None:
        """Return once every rank has called it."""
        ...

    def abort(self, code: int, message: str) -> None:
        """End every rank of the run with exit status ``code`` after printing ``message`` (never returns)."""
        ...

    def close(self) -> None:
        """Release the communicator's resources (idempotent); collectives after it raise."""
        ...


def requested_communicator(option: str | None) -> str | None:
    """The communicator name ``distributed=option`` asks for: None for one process.

    ``"auto"`` reads the launcher's environment: ``NEUROFLOW_DISTRIBUTED`` if
    set, else ``"mpi"`` when an MPI launcher started more than one process,
    else None (a plain ``python script.py`` trains alone).
    """
    if option != "auto":
        return option
    named = os.environ.get(COMMUNICATOR_VARIABLE, "").strip()
    if named:
        return named
    for variable in MPI_SIZE_VARIABLES:
        value = os.environ.get(variable, "")
        if value.isdigit() and int(value) > 1:
            return "mpi"
    return None


def open_communicator(name: str) -> Communicator:
    """The communicator registered as ``name`` (``neuroflow_communicators``), created; errors name what exists."""
    factory = communicators.get(name)  # UnknownNameError lists the names and what to install
    communicator = factory()
    for attribute in ("rank", "size", "broadcast", "allreduce_sum", "start_allreduce_sum", "start_allreduce_mean",
                      "allreduce_scalars", "sparse_allreduce_sum", "gradient_buckets", "barrier", "abort", "close"):
        if not hasattr(communicator, attribute):
            raise ConfigError(f"communicator {name!r} ({type(communicator).__name__}) has no {attribute!r}; "
                              f"a communicator implements neuroflow.trainer.communicator.Communicator")
    return communicator  # type: ignore[no-any-return]
