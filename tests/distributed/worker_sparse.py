"""Under ``mpiexec -n 2``: the sparse sum of mostly-zero arrays equals the dense allreduce bit for bit, and a dense
enough array takes the dense path. Prints one line per case."""

from __future__ import annotations

import numpy as np

from neuroflow.registry import communicators


def main() -> None:
    comm = communicators.get("mpi")()
    for density in (0.01, 0.1, 0.9):
        rng = np.random.default_rng(comm.rank)  # each rank its own entries, overlapping in places
        array = rng.standard_normal(10_000).astype(np.float32)
        array[rng.random(array.size) >= density] = 0
        dense = array.copy()
        comm.allreduce_sum(dense)
        sent = comm.sparse_allreduce_sum(array)
        print(f"rank {comm.rank} density {density}: sparse={sent} equal={np.array_equal(array, dense)}", flush=True)


if __name__ == "__main__":
    main()
