"""Depthwise convolution on numba's compiled loops: the same results as the numpy code and the direct loops, every
geometry, any thread count; the numpy code wherever the loops do not apply or numba cannot be had."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from neuroflow.backends import cpu_parallel
from neuroflow.testing import gradcheck
from neuroflow_ops_vision import DepthwiseConv2d, conv_depthwise

from .conftest import HAS_NUMBA
from .reference import conv2d, conv2d_grads

needs_numba = pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed: pip install 'neuroflow-ops-vision[numba]'")

GEOMETRIES: list[dict[str, Any]] = [
    dict(kernel_size=3, padding=1),
    dict(kernel_size=3),
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(3, 2), stride=(1, 2), padding=(2, 0), dilation=(2, 1)),
    dict(kernel_size=5, stride=3, padding=2, dilation=2, bias=False),
    dict(kernel_size=1, stride=2),
    dict(kernel_size=3, padding=3),  # padding wider than the kernel's reach: some rows see no input at all
]


def run(op: DepthwiseConv2d, x: np.ndarray, gy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    op.zero_grad()
    y = op.forward(x).copy()
    gx = op.backward(gy).copy()
    return y, gx, op.weight.grad.copy()


@pytest.mark.parametrize("channels", [3, 32])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_matches_the_direct_loops_on_both_paths(geometry: dict[str, Any], channels: int, depthwise_path: str,
                                                rng: np.random.Generator) -> None:
    op = DepthwiseConv2d(channels, **geometry, layout="NHWC", dtype=np.float64)
    x = rng.standard_normal((2, 7, 6, channels))
    y = op.forward(x)
    gy = rng.standard_normal(y.shape)
    y, gx, gw = run(op, x, gy)
    nchw = x.transpose(0, 3, 1, 2)
    args = (op.stride, op.padding, op.dilation, channels)
    bias = op.bias.data if op.has_bias else None
    np.testing.assert_allclose(y.transpose(0, 3, 1, 2), conv2d(nchw, op.weight.data, bias, *args), atol=1e-12)
    want_gx, want_gw = conv2d_grads(nchw, op.weight.data, gy.transpose(0, 3, 1, 2), *args)
    np.testing.assert_allclose(gx.transpose(0, 3, 1, 2), want_gx, atol=1e-12)
    np.testing.assert_allclose(gw, want_gw, atol=1e-12)


@needs_numba
def test_forward_and_backward_run_the_compiled_loops(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    kernels = conv_depthwise.load_numba_kernels()
    calls: list[str] = []
    for name in ("forward_rows", "weight_gradient_blocks", "input_gradient_rows"):
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _real=real, _name=name: (calls.append(_name), _real(*a)))
    op = DepthwiseConv2d(8, 3, padding=1, layout="NHWC")
    x = rng.standard_normal((2, 6, 6, 8)).astype(np.float32)
    op.backward(op.forward(x))
    assert sorted(set(calls)) == ["forward_rows", "input_gradient_rows", "weight_gradient_blocks"]


@needs_numba
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("geometry", GEOMETRIES[:5], ids=str)
def test_gradcheck_on_the_compiled_loops(geometry: dict[str, Any], layout: str, rng: np.random.Generator) -> None:
    op = DepthwiseConv2d(4, **geometry, layout=layout)
    assert conv_depthwise.numba_kernels(np, 1, np.float64) is not None
    x = rng.standard_normal((2, 4, 7, 6) if layout == "NCHW" else (2, 7, 6, 4))
    gradcheck(op, x)


@needs_numba
@pytest.mark.parametrize("geometry", GEOMETRIES[:3], ids=str)
def test_float32_agrees_with_the_numpy_code(geometry: dict[str, Any], rng: np.random.Generator) -> None:
    """At the detector's first depthwise map: forward bit for bit the numpy tap loops' (the same products added in
    the same order), gradients within float32 rounding of them."""
    op = DepthwiseConv2d(16, **geometry, layout="NHWC")
    x = rng.standard_normal((4, 48, 48, 16)).astype(np.float32)
    gy = rng.standard_normal(op.forward(x).shape).astype(np.float32)
    compiled = run(op, x, gy)
    conv_depthwise.use_numba(False)
    try:
        reference = run(op, x, gy)
    finally:
        conv_depthwise.use_numba(True)
    np.testing.assert_array_equal(compiled[0], reference[0])
    for got, want in zip(compiled[1:], reference[1:], strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())


@needs_numba
def test_results_do_not_depend_on_the_thread_count(rng: np.random.Generator, every_size_splits: None) -> None:
    op = DepthwiseConv2d(32, 3, stride=2, padding=1, layout="NHWC")
    x = rng.standard_normal((9, 40, 40, 32)).astype(np.float32)  # enough work to split between threads
    gy = rng.standard_normal(op.forward(x).shape).astype(np.float32)
    results = []
    for count in (1, 2, 3):
        cpu_parallel.set_threads(count)
        try:
            results.append(run(op, x, gy))
        finally:
            cpu_parallel.set_threads(None)
    for other in results[1:]:
        for got, want in zip(other, results[0], strict=True):
            np.testing.assert_array_equal(got, want)


@needs_numba
def test_memory_declaration_lists_the_compiled_loops_buffers() -> None:
    op = DepthwiseConv2d(8, 3, stride=2, padding=1, layout="NHWC")
    declared = op.memory_declaration((4, 10, 10, 8)).workspace
    # taps; the weight gradient's sums over 5 blocks of 4 of the 4·5 output rows (and each block's row being summed)
    assert (3, 3, 8) in declared and (5, 2, 3, 3, 8) in declared
    assert (4, 12, 12, 8) not in declared  # no padded copy of the input
    conv_depthwise.use_numba(False)
    try:
        assert (4, 12, 12, 8) in op.memory_declaration((4, 10, 10, 8)).workspace
    finally:
        conv_depthwise.use_numba(True)


def test_the_numpy_code_runs_where_the_loops_do_not_apply() -> None:
    assert conv_depthwise.numba_kernels(np, 2, np.float32) is None  # depth multiplier 2
    assert conv_depthwise.numba_kernels(np, 1, np.float16) is None
    assert conv_depthwise.numba_kernels(object(), 1, np.float32) is None  # another backend's arrays
    conv_depthwise.use_numba(False)
    try:
        assert conv_depthwise.numba_kernels(np, 1, np.float32) is None
    finally:
        conv_depthwise.use_numba(True)


@pytest.fixture
def fresh_kernel_lookup() -> Iterator[None]:
    conv_depthwise.forget_numba_kernels()
    yield
    conv_depthwise.forget_numba_kernels()


def test_without_numba_the_numpy_code_runs(monkeypatch: pytest.MonkeyPatch, fresh_kernel_lookup: None,
                                           rng: np.random.Generator) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "numba" else real(name, *a))
    assert conv_depthwise.numba_kernels(np, 1, np.float32) is None
    op = DepthwiseConv2d(3, 3, padding=1, layout="NHWC", dtype=np.float64)
    x = rng.standard_normal((2, 5, 5, 3))
    want = conv2d(x.transpose(0, 3, 1, 2), op.weight.data, op.bias.data, op.stride, op.padding, op.dilation, 3)
    np.testing.assert_allclose(op.forward(x).transpose(0, 3, 1, 2), want, atol=1e-12)


@pytest.mark.parametrize("error", [ImportError("Numba needs NumPy 2.3 or less"),
                                   RuntimeError("cannot cache function 'forward_rows': no locator available")],
                         ids=["numpy-too-new", "read-only-install"])
def test_numba_kernels_that_fail_to_load_are_reported_once_and_numpy_runs(
        error: Exception, monkeypatch: pytest.MonkeyPatch, fresh_kernel_lookup: None, rng: np.random.Generator) -> None:
    real = importlib.import_module

    def refuse(name: str, *args: Any) -> Any:
        if name.endswith("conv_depthwise_numba"):
            raise error
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", refuse)
    op = DepthwiseConv2d(3, 3, padding=1, layout="NHWC", dtype=np.float64)
    x = rng.standard_normal((2, 5, 5, 3))
    with pytest.warns(RuntimeWarning, match=f"numba's kernels could not be loaded \\({type(error).__name__}: "):
        y = op.forward(x)
    want = conv2d(x.transpose(0, 3, 1, 2), op.weight.data, op.bias.data, op.stride, op.padding, op.dilation, 3)
    np.testing.assert_allclose(y.transpose(0, 3, 1, 2), want, atol=1e-12)
    assert conv_depthwise.numba_kernels(np, 1, np.float32) is None  # the answer is kept: no second warning


@needs_numba
def test_kernels_that_fail_to_compile_are_reported_and_numpy_runs(monkeypatch: pytest.MonkeyPatch,
                                                                 fresh_kernel_lookup: None) -> None:
    kernels = conv_depthwise.load_numba_kernels()

    def fail(dtype: Any) -> None:
        raise RuntimeError("LLVM ERROR: cannot select")

    monkeypatch.setattr(kernels, "ready", fail)
    with pytest.warns(RuntimeWarning, match="numba's <f4 kernels could not be compiled \\(RuntimeError: LLVM"):
        assert conv_depthwise.numba_kernels(np, 1, np.float32) is None


def test_the_environment_variable_turns_the_loops_off_and_import_neuroflow_does_not_load_numba() -> None:
    code = ("import sys, numpy as np, neuroflow as nf; from neuroflow_ops_vision import conv_depthwise, "
            "DepthwiseConv2d; DepthwiseConv2d(4, 3, layout='NHWC').forward(np.ones((1, 5, 5, 4), np.float32)); "
            "print(conv_depthwise.numba_kernels(np, 1, np.float32) is None, 'numba' in sys.modules)")
    off = subprocess.run([sys.executable, "-c", code], env={**os.environ, "NEUROFLOW_NUMBA": "0"}, capture_output=True,
                         text=True, check=True)
    assert off.stdout.split() == ["True", "False"], off.stderr


def test_strided_input_and_gradient_arrays(depthwise_path: str, rng: np.random.Generator) -> None:
    """An NHWC map that is a strided view (a slice of a wider map) and a gradient in another memory order: the same
    results as contiguous copies give."""
    op = DepthwiseConv2d(5, 3, stride=2, padding=1, layout="NHWC", dtype=np.float64)
    x = rng.standard_normal((2, 9, 14, 5))[:, :, ::2, :]
    gy = np.asfortranarray(rng.standard_normal(op.forward(np.ascontiguousarray(x)).shape))
    want = run(op, np.ascontiguousarray(x), np.ascontiguousarray(gy))
    assert not x.flags.c_contiguous and not gy.flags.c_contiguous
    for got, expected in zip(run(op, x, gy), want, strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-13)
