"""The mpi communicator's collectives on opencl device arrays (staged through host buffers), on every rank."""

from __future__ import annotations

import numpy as np

from neuroflow.backends.selection import get_backend
from neuroflow_distributed.mpi import MPICommunicator

backend = get_backend("opencl")
comm = MPICommunicator()
rank, size = comm.rank, comm.size
values = np.arange(6, dtype=np.float32) + rank

array = backend.from_host(values)
comm.allreduce_sum(array)
np.testing.assert_array_equal(backend.to_host(array), sum(np.arange(6, dtype=np.float32) + r for r in range(size)))

array = backend.from_host(values)
comm.broadcast(array, root=size - 1)
np.testing.assert_array_equal(backend.to_host(array), np.arange(6, dtype=np.float32) + size - 1)

array = backend.from_host(values)
comm.start_allreduce_mean(array).wait()
np.testing.assert_allclose(backend.to_host(array), np.arange(6, dtype=np.float32) + (size - 1) / 2)
comm.close()
print(f"rank {rank} of {size}: ok")
