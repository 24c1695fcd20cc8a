"""The cpu backend: which BLAS kernels numpy runs (they decide GEMM speed), how long its idle threads spin, and its
fused-kernel lookups."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from neuroflow import blas_idle
from neuroflow.backends import kernels
from neuroflow.backends.cpu import CpuBackend, blas_core, openblas_thread_timeout


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


def _run(code: str, **env: str) -> list[str]:
    variables = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    done = subprocess.run([sys.executable, "-c", code], env={**variables, **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split("\n")[:-1]


_SEEN = """
import sys
{first}
from neuroflow.backends.cpu import CpuBackend, openblas_thread_timeout
import os
print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), openblas_thread_timeout(), CpuBackend().describe()["blas_idle_spin"])
"""


@pytest.mark.skipif(openblas_thread_timeout() is None, reason="numpy's BLAS is not an OpenBLAS that says")
def test_importing_neuroflow_before_numpy_shortens_openblas_idle_spin_and_a_users_setting_stands():
    spin = f"2^{blas_idle.TIMEOUT} ticks (OPENBLAS_THREAD_TIMEOUT={blas_idle.TIMEOUT})"
    # the spec's snippet: neuroflow first, numpy after it (here through the cpu backend), so OpenBLAS reads it
    assert _run(_SEEN.format(first="import neuroflow as nf")) == [f"{blas_idle.TIMEOUT} {blas_idle.TIMEOUT} {spin}"]
    assert _run(_SEEN.format(first="import neuroflow.cli")) == [f"{blas_idle.TIMEOUT} {blas_idle.TIMEOUT} {spin}"]
    # a user's own value stands
    assert _run(_SEEN.format(first="import neuroflow"), OPENBLAS_THREAD_TIMEOUT="9") == [
        "9 9 2^9 ticks (OPENBLAS_THREAD_TIMEOUT=9)"]
    # numpy first: too late for this process (the cpu backend says so); processes it starts still inherit it
    assert _run(_SEEN.format(first="import numpy\nimport neuroflow")) == [
        f"{blas_idle.TIMEOUT} 0 2^28 ticks (OpenBLAS's default)"]
    late = "import numpy\nfrom neuroflow import blas_idle\nprint(blas_idle.prepare())"
    assert _run(_SEEN.format(first=late))[0] == "False"
    child = ("import neuroflow, subprocess\n"
             "subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get(\"OPENBLAS_THREAD_TIMEOUT\"))'])")
    assert _run(_SEEN.format(first=child)) == [str(blas_idle.TIMEOUT), f"{blas_idle.TIMEOUT} {blas_idle.TIMEOUT} {spin}"]


def test_the_demo_prepares_before_anything_loads_numpy():
    # the demo's module loaded as a script loads it (its imports run; main() does not, outside __main__)
    demo = pathlib.Path(__file__).parents[2] / "examples" / "mnist_demo.py"
    first = f"import importlib.util\nspec = importlib.util.spec_from_file_location('demo', {str(demo)!r})\n" \
            "spec.loader.exec_module(importlib.util.module_from_spec(spec))"
    assert _run(_SEEN.format(first=first)) == [
        f"{blas_idle.TIMEOUT} {blas_idle.TIMEOUT} 2^{blas_idle.TIMEOUT} ticks (OPENBLAS_THREAD_TIMEOUT={blas_idle.TIMEOUT})"]
