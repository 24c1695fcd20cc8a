"""The fused kernels' CUDA C compiles with NVRTC (no GPU needed) wherever CuPy and NVRTC are installed.

CPU CI has neither and skips the compile; the dtype and name checks run everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest

from neuroflow_cuda import fused
from neuroflow_cuda.kernels import activation, batchnorm, im2col, optim, softmax_xent

FAMILIES = [activation.FAMILY, softmax_xent.FAMILY, batchnorm.FAMILY, im2col.FAMILY, optim.FAMILY]


def nvrtc_module():  # type: ignore[no-untyped-def]
    pytest.importorskip("cupy")
    from cupy.cuda import nvrtc

    try:
        nvrtc.getVersion()
    except Exception as exc:  # the NVRTC library is a separate wheel (nvidia-cuda-nvrtc-cu12)
        pytest.skip(f"NVRTC is not loadable here: {exc}")
    return nvrtc


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_kernel_compiles_and_exports_its_functions(family: fused.Any, dtype: type) -> None:
    nvrtc = nvrtc_module()
    program = nvrtc.createProgram(family.code(dtype), f"{family.name}.cu", [], [])
    try:
        nvrtc.compileProgram(program, ["-arch=compute_75", "--std=c++14"])
    except Exception:
        pytest.fail(nvrtc.getProgramLog(program))
    ptx = nvrtc.getPTX(program)
    ptx = ptx.decode() if isinstance(ptx, bytes) else ptx
    assert [f for f in family.functions if f".entry {f}" not in ptx] == []


def test_a_non_float_dtype_is_refused_with_the_supported_ones() -> None:
    with pytest.raises(TypeError, match="take float32 or float64 arrays; got int32"):
        optim.FAMILY.code(np.int32)


def test_disabling_an_unknown_kernel_lists_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown kernels \\['adamw'\\]; known: bias_activation"):
        fused.bind(object(), frozenset({"adamw"}))


def test_disabled_kernels_are_left_to_the_generic_path() -> None:
    bound = fused.bind(object(), frozenset({"adam_update"}))
    assert "adam_update" not in bound and "sgd_update" in bound
    assert set(bound) | {"adam_update"} == set(fused.KERNELS)
