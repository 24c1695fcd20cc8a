"""Every OpenCL driver found qualifies (in a child process), and the kernels are written for the CPU its
compiler targets: pocl 3.0's LLVM 14 compiles for AMD Zen 4 as ``znver3``, without AVX-512, and crashed on
the 64-byte vectors our kernels handed its builtins."""

from __future__ import annotations

import numpy as np
import pytest

from .conftest import DEVICES

pytest.importorskip("pyopencl")


@pytest.mark.parametrize("index", [index for index, _ in DEVICES], ids=[name for _, name in DEVICES])
def test_every_opencl_driver_qualifies(index: int) -> None:
    """One test per driver: a refused driver fails here with its name and what went wrong (signal, stage),
    and its other tests skip instead of taking the suite down."""
    from neuroflow_opencl import OpenclBackend

    if not OpenclBackend.is_available():
        pytest.skip(OpenclBackend.unavailable_reason() or "no OpenCL device")
    from neuroflow.backends import qualification

    verdict = qualification.verdict("opencl", index)
    if not verdict.ok and verdict.stage == "open device":
        # Nothing of NeuroFlow's ran: the driver could not open the device or compile for this CPU (PoCL 3.0's
        # LLVM 14 calls a Zen 5 'generic', a target it then rejects). The device is refused with this reason,
        # and the machine's other drivers are tested; a failure in our kernels or training still fails here.
        pytest.skip(f"{verdict.device}: {verdict.explain()}")
    assert verdict.ok, f"{verdict.device}: {verdict.explain()}"
    assert verdict.stage == "train mlp adam"  # the child ran the kernel set and both training checks


def test_vectors_are_as_wide_as_the_compiler_target_allows(backend) -> None:
    device = backend.cl_device
    features = device.target_features()
    version = device.device.version
    if "znver3" in version:  # pocl's LLVM 14 on Zen 4: AVX2, no AVX-512
        assert features & 2 and not features & 4
    if "skylake-avx512" in version:
        assert features & 4
    expected = 32 if features & 1 and not features & 4 else 64
    assert device.vector_bytes == expected


def test_no_builtin_call_is_made_on_a_vector_the_target_splits() -> None:
    """The GEMM's loads of its own dtype are used as they are (an identity ``convert_float16`` was the call
    LLVM 14 crashed on); another dtype is converted."""
    from neuroflow_opencl.gemm_source import dots_source, rows_source

    f32, f64 = np.dtype(np.float32), np.dtype(np.float64)
    fixed = (32, 1, 64, 1, 64, 1, 0, 0, 0, 8, 64, 32)
    same = rows_source(f32, f32, f32, 8, 16, 2, fixed=fixed)
    assert "convert_" not in same and "NF_LOAD_float16(b + p * b_sk + 0)" in same
    mixed = dots_source(f64, f32, f64, (True,) * 6, 4, 4, 8)
    assert "convert_double8(NF_LOAD_float8(" in mixed and "convert_double8(NF_LOAD_double8" not in mixed


def test_a_driver_crash_is_caught_in_the_child_with_its_stage(backend, tmp_path, monkeypatch) -> None:
    """On a device whose compiler targets no AVX-512 (the wheel's pocl on AMD Zen 4), forcing 64-byte vectors
    brings back the LLVM 14 crash this project hit: the child dies of a signal in a named stage, the device is
    refused with the driver's name, and this process goes on."""
    device = backend.cl_device
    features = device.target_features()
    if not (features & 1 and not features & 4):
        pytest.skip(f"{device.facts.name} compiles for AVX-512: 64-byte vectors are its own width")
    from neuroflow.backends import qualification

    monkeypatch.setenv("NEUROFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("NEUROFLOW_OPENCL_VECTOR_BYTES", "64")
    verdict = qualification.verdict("opencl", device.index)
    if verdict.ok:
        pytest.skip(f"{verdict.device} now compiles 64-byte builtin calls: the crash is gone from this driver")
    assert verdict.status == "crashed" and "the child died of SIG" in verdict.detail
    assert verdict.stage.startswith(("gemm", "transpose", "elementwise", "reductions", "train mlp"))
    assert verdict.identity["vector bytes"] == "64" and "LLVM" in verdict.device
