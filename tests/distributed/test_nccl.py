"""The nccl communicator: its error paths everywhere; its collectives where CuPy sees NVIDIA GPUs (else skipped)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from neuroflow_distributed import nccl
from neuroflow_distributed.communicator import CommunicatorError


def test_without_cupy_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # import cupy raises ImportError
    with pytest.raises(CommunicatorError, match=r"needs CuPy with NCCL: pip install cupy-cuda12x"):
        nccl.NCCLCommunicator()


def test_without_a_gpu_the_error_says_so_and_points_to_mpi(monkeypatch):
    cupy = types.ModuleType("cupy")
    cuda = types.ModuleType("cupy.cuda")
    fake_nccl = types.ModuleType("cupy.cuda.nccl")

    def no_driver():
        raise RuntimeError("cudaErrorNoDevice")

    cuda.runtime = types.SimpleNamespace(getDeviceCount=no_driver)
    cuda.nccl = fake_nccl
    cupy.cuda = cuda
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.nccl", fake_nccl)
    with pytest.raises(CommunicatorError, match=r"needs an NVIDIA GPU; none is visible \(use distributed='mpi'"):
        nccl.NCCLCommunicator()
    fake_nccl.available = False
    with pytest.raises(CommunicatorError, match="built without NCCL"):
        nccl.NCCLCommunicator()


def test_the_local_rank_comes_from_the_launcher(monkeypatch):
    for variable in nccl.LOCAL_RANK_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    assert nccl.local_rank(5) == 5
    monkeypatch.setenv("MPI_LOCALRANKID", "1")
    assert nccl.local_rank(5) == 1


def test_collectives_on_a_gpu():
    cupy = pytest.importorskip("cupy", reason="CuPy is not installed: the nccl collectives are not run here")
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            pytest.skip("no NVIDIA GPU visible")
    except Exception:
        pytest.skip("no CUDA driver")
    communicator = nccl.NCCLCommunicator()  # one rank: NCCL works with a communicator of one
    try:
        array = cupy.arange(6, dtype=cupy.float32)
        communicator.allreduce_sum(array)
        communicator.start_allreduce_mean(array).wait()
        communicator.broadcast(array, 0)
        np.testing.assert_array_equal(cupy.asnumpy(array), np.arange(6, dtype=np.float32))
        assert communicator.allreduce_scalars([1.5, 2.0], "max") == [1.5, 2.0]
    finally:
        communicator.close()
