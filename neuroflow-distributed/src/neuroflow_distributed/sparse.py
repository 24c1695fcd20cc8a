"""The sum over ranks of a mostly-zero array (a compressed gradient), exchanging only its nonzero entries.

Each rank sends the indices and values of its nonzeros to every other
(``Allgatherv``) and adds every rank's entries, in rank order, into a
zeroed array: every rank runs the same additions, so every rank gets the
same bits, and for two ranks the same bits as a dense allreduce (0 + a + b).
When the entries of all ranks together would take more bytes than the
dense array, the dense allreduce runs instead (every rank sees the same
counts, so every rank makes the same choice).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from neuroflow_distributed import faults

#: bytes an index takes on the wire
INDEX_BYTES = np.dtype(np.int64).itemsize


def sparse_allreduce_sum(comm: Any, array: np.ndarray) -> bool:
    """Replace the contiguous numpy ``array`` with its sum over the ranks of mpi4py ``comm``; True when the
    nonzeros were exchanged, False when the dense sum was cheaper."""
    from mpi4py import MPI  # lazy: optional dependency

    flat = array.reshape(-1)
    index = np.flatnonzero(flat)
    counts = np.zeros(comm.Get_size(), dtype=np.int64)
    faults.wait(comm.Iallgather(np.array([index.size], dtype=np.int64), counts), "a count of gradient entries")
    total = int(counts.sum())
    if total * (INDEX_BYTES + flat.itemsize) >= flat.nbytes:
        faults.wait(comm.Iallreduce(MPI.IN_PLACE, flat, op=MPI.SUM), "a dense compressed-gradient allreduce")
        return False
    indices = np.empty(total, dtype=np.int64)
    values = np.empty(total, dtype=flat.dtype)
    faults.wait(comm.Iallgatherv(index.astype(np.int64, copy=False), (indices, counts)), "a gather of indices")
    faults.wait(comm.Iallgatherv(np.ascontiguousarray(flat[index]), (values, counts)), "a gather of values")
    flat.fill(0)
    start = 0
    for count in counts.tolist():  # one rank's indices are distinct: a fancy-indexed add is exact
        flat[indices[start:start + count]] += values[start:start + count]
        start += count
    return True
