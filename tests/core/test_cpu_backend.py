"""The cpu backend: which BLAS kernels numpy runs (they decide GEMM speed), and its fused-kernel lookups."""

from __future__ import annotations

import numpy as np

from neuroflow.backends import kernels
from neuroflow.backends.cpu import CpuBackend, blas_core


def test_describe_names_the_blas_kernels_and_a_forced_choice(monkeypatch):
    core = blas_core()
    assert core is None or (isinstance(core, str) and core)
    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    assert CpuBackend().describe()["blas_core"] == (core or "unknown")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert CpuBackend().describe()["blas_core"] == f"{core or 'unknown'} (OPENBLAS_CORETYPE=Haswell)"


def test_numpy_has_no_fused_kernels_but_a_subclass_that_adds_one_is_asked():
    assert CpuBackend().fused(kernels.LINEAR.name, np.zeros(2)) is None

    def linear(*args):
        return "ran"

    class WithLinear(CpuBackend):
        def kernel(self, name):
            return linear if name == kernels.LINEAR.name else None

    backend = WithLinear()
    assert backend.fused(kernels.LINEAR.name, np.zeros(2)) is linear
    assert backend.fused(kernels.SGD_UPDATE.name, np.zeros(2)) is None
