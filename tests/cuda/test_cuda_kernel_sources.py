"""The fused kernels' CUDA C compiles with NVRTC (no GPU needed) wherever CuPy and NVRTC are installed.

CPU CI has neither and skips the compile; the dtype, name and registration checks run everywhere, and so do
the Python wrappers of Linear's kernels, against a numpy stand-in for CuPy that runs each kernel's C
signature in numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

from neuroflow.backends import kernels
from neuroflow_cuda import fused
from neuroflow_cuda.kernels import activation, linear, optim, softmax_xent

FAMILIES = [activation.FAMILY, softmax_xent.FAMILY, linear.FAMILY, optim.FAMILY]


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
    with pytest.raises(ValueError, match="unknown kernels \\['adamw'\\]; known: adam_update, sgd_update"):
        fused.bind(object(), frozenset({"adamw"}))


def test_disabled_kernels_are_left_to_the_generic_path() -> None:
    bound = fused.bind(object(), frozenset({"adam_update"}))
    assert "adam_update" not in bound and "sgd_update" in bound
    assert set(bound) | {"adam_update"} == {kernel.name for kernel in fused.KERNELS}


def test_every_declared_kernel_is_registered_with_the_declared_parameters() -> None:
    """The names the ops ask for (linear and linear_weight_grad included), each against its declaration."""
    assert set(fused.bind(object())) == set(kernels.DECLARED)
    assert all(kernels.DECLARED[kernel.name] is kernel for kernel in fused.KERNELS)


class NumpyCupy:
    """Just enough of CuPy for the Linear kernels' wrappers: numpy's matmul, and RawModule functions that run
    each kernel's C signature (the grid and block are ignored) in numpy."""

    matmul = staticmethod(np.matmul)

    class RawModule:
        def __init__(self, code: str, options: tuple[str, ...]) -> None:
            assert "typedef" in code and "add_bias_rows" in code and "column_sums" in code

        def get_function(self, name: str) -> object:
            return getattr(self, name)

        @staticmethod
        def add_bias_rows(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[object, ...]) -> None:
            out, bias, total, c = args
            flat = out.reshape(-1)
            flat[:total] += bias[np.arange(total) % c]

        @staticmethod
        def column_sums(grid: tuple[int, ...], block: tuple[int, ...], args: tuple[object, ...]) -> None:
            g, out, rows, c, row_stride, col_stride = args
            assert grid == ((c + 31) // 32,) and block == (32, 32)
            base = np.lib.stride_tricks.as_strided(g, (rows, c), (row_stride * g.itemsize, col_stride * g.itemsize))
            out[...] = base.sum(axis=0)


@pytest.fixture
def numpy_cupy(monkeypatch: pytest.MonkeyPatch) -> NumpyCupy:
    monkeypatch.setattr(linear.FAMILY, "_modules", {})  # compiled modules are cached per dtype
    return NumpyCupy()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_linear_wrappers_compute_what_the_core_linear_does(numpy_cupy: NumpyCupy, dtype: type) -> None:
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(dtype) for s in ((37, 5), (3, 5), (3,)))
    out = np.empty((37, 3), dtype)
    assert linear.linear(numpy_cupy, x, w, b, out) is out
    np.testing.assert_array_equal(out, x @ w.T + b)
    wide = rng.standard_normal((37, 8)).astype(dtype)
    g = wide[:, 2:5]  # a slice of a wider gradient: strided rows
    gw, gb = np.empty((3, 5), dtype), np.empty(3, dtype)
    linear.linear_weight_grad(numpy_cupy, g, x, gw, gb)
    np.testing.assert_allclose(gw, g.T @ x, rtol=1e-6)
    np.testing.assert_allclose(gb, g.sum(axis=0), rtol=1e-6)


def test_linear_wrappers_refuse_a_bias_of_the_wrong_length(numpy_cupy: NumpyCupy) -> None:
    with pytest.raises(ValueError, match=r"fused kernel linear: bias has shape \(4,\); expected \(3,\)"):
        linear.linear(numpy_cupy, np.ones((2, 5)), np.ones((3, 5)), np.ones(4), np.empty((2, 3)))
