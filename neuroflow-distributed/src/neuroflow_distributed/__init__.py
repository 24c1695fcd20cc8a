"""neuroflow-distributed: data-parallel training for NeuroFlow over MPI (mpi4py) or NCCL (CuPy).

``Trainer(distributed="mpi")`` (or ``"nccl"``, or ``"auto"`` under a
launcher) finds these communicators through the ``neuroflow_communicators``
entry points; :mod:`neuroflow_distributed.buckets` holds the gradient
buckets the Trainer allreduces during backward.
"""

from neuroflow_distributed.buckets import BucketPlan, GradientBuckets
from neuroflow_distributed.communicator import Communicator, CommunicatorError, Handle

__all__ = ["BucketPlan", "Communicator", "CommunicatorError", "GradientBuckets", "Handle"]
