"""MaxPool2d on numba's compiled kernels (NHWC on numpy): the numpy code's outputs, taps and gradients bit for bit
in every geometry, NaN and ties included, at any thread count; numpy wherever the kernels do not apply or numba
cannot be had."""

from __future__ import annotations

import importlib
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from neuroflow.backends import cpu_parallel
from neuroflow_ops_vision import MaxPool2d, compiled

from .conftest import HAS_NUMBA, on_numpy

pytestmark = pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed: pip install 'neuroflow-ops-vision[numba]'")


@pytest.fixture(autouse=True)
def numba_loaded() -> None:
    """The max-pool kernels never load numba themselves (compiled.RIDERS): these tests load it first."""
    importlib.import_module("numba")


#: (kernel, stride, padding, dilation, ceil_mode): tiling, overlapping, padded, dilated, ragged edges
GEOMETRIES = [
    (2, 2, 0, 1, False),
    (3, 2, 1, 1, False),
    (3, 1, 1, 1, False),
    (2, 1, 0, 1, False),
    (3, 2, 0, 2, False),
    (3, 2, 1, 1, True),
    ((2, 3), (1, 2), (1, 0), 1, True),
]


def step(pool: MaxPool2d, x: np.ndarray, gy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    y = pool.forward(x).copy()
    taps = pool._argmax.copy()
    return y, taps, pool.backward(gy).copy()


def hostile(shape: tuple[int, ...], dtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Values with ties (a coarse grid), −inf, +inf and NaN among them."""
    x = np.round(rng.standard_normal(shape) * 2) / 2
    flat = x.reshape(-1)
    picks = rng.choice(flat.size, size=3 * max(1, flat.size // 50), replace=False)
    third = len(picks) // 3
    flat[picks[:third]] = -np.inf
    flat[picks[third:2 * third]] = np.inf
    flat[picks[2 * third:]] = np.nan
    return x.astype(dtype)


def assert_same(got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...]) -> None:
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("geometry", GEOMETRIES, ids=str)
def test_the_numpy_codes_outputs_taps_and_gradients(geometry: tuple[Any, ...], activation: str | None, dtype: Any,
                                                    rng: np.random.Generator) -> None:
    kernel, stride, padding, dilation, ceil_mode = geometry
    x = hostile((3, 11, 10, 5), dtype, rng)

    def made() -> MaxPool2d:
        return MaxPool2d(kernel, stride, padding, dilation, ceil_mode, layout="NHWC", activation=activation)

    pool = made()
    out_shape = pool.forward(x).shape
    gy = rng.standard_normal(out_shape).astype(dtype)
    gy.reshape(-1)[::7] = -0.0
    assert_same(step(pool, x, gy), on_numpy(lambda: step(made(), x, gy)))


def test_a_kernel_of_more_than_255_taps_keeps_its_taps_in_int32(rng: np.random.Generator) -> None:
    x = rng.standard_normal((2, 17, 17, 3)).astype(np.float32)
    gy = rng.standard_normal((2, 1, 1, 3)).astype(np.float32)
    got = step(MaxPool2d(16, layout="NHWC"), x, gy)
    assert got[1].dtype == np.int32
    assert_same(got, on_numpy(lambda: step(MaxPool2d(16, layout="NHWC"), x, gy)))
    win = x[:, :16, :16].reshape(2, 256, 3).argmax(axis=1)
    np.testing.assert_array_equal(got[1].reshape(2, 3), win)


def test_the_kernels_run_an_nhwc_forward_and_backward(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator) -> None:
    """Both kernels are called by an NHWC forward and backward (and the numpy passes are not); an NCHW pool runs
    numpy."""
    kernels = compiled.kernels("pooling_numba", np, np.float32)  # compiled now: its warm-up calls are not counted
    assert kernels is not None
    called: list[str] = []
    for name in ("max_forward", "max_backward"):
        real = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, lambda *a, _real=real, _name=name: (called.append(_name), _real(*a))[1])
    x = rng.standard_normal((4, 6, 6, 8)).astype(np.float32)
    pool = MaxPool2d(2, layout="NHWC", activation="relu")
    monkeypatch.setattr(pool, "_scatter", lambda *a: pytest.fail("the numpy scatter ran"))
    pool.backward(pool.forward(x).copy())
    assert called == ["max_forward", "max_backward"]
    nchw = MaxPool2d(2)
    nchw.backward(nchw.forward(x.transpose(0, 3, 1, 2).copy()).copy())
    assert called == ["max_forward", "max_backward"]


def test_results_do_not_depend_on_the_thread_count(rng: np.random.Generator, every_size_splits: None) -> None:
    x = hostile((9, 20, 20, 16), np.float32, rng)
    gy = rng.standard_normal((9, 11, 11, 16)).astype(np.float32)
    results = []
    for threads in (1, 2, 3):
        cpu_parallel.set_threads(threads)
        try:
            results.append(step(MaxPool2d(3, 2, 1, layout="NHWC", activation="relu", ceil_mode=True), x, gy))
        finally:
            cpu_parallel.set_threads(None)
    for other in results[1:]:
        assert_same(other, results[0])


def test_a_gradient_in_another_memory_order_takes_the_numpy_code(monkeypatch: pytest.MonkeyPatch,
                                                                 rng: np.random.Generator) -> None:
    kernels = compiled.kernels("pooling_numba", np, np.float64)
    assert kernels is not None
    monkeypatch.setattr(kernels, "max_backward", lambda *a: pytest.fail("the kernel got a Fortran-ordered gradient"))
    x = rng.standard_normal((2, 8, 8, 4))
    gy = np.asfortranarray(rng.standard_normal((2, 4, 4, 4)))
    want = on_numpy(lambda: step(MaxPool2d(2, layout="NHWC", activation="relu"), x, gy))
    assert_same(step(MaxPool2d(2, layout="NHWC", activation="relu"), x, gy), want)


def test_a_max_pool_alone_does_not_load_numba() -> None:
    """numba costs ~110 MB of RSS; a model of convolutions and max pools runs its pools on numpy rather than load it,
    and gets the numpy code's results."""
    code = ("import sys, numpy as np; from neuroflow_ops_vision import MaxPool2d; "
            "x = np.random.default_rng(0).standard_normal((2, 6, 6, 3)).astype(np.float32); "
            "pool = MaxPool2d(2, layout='NHWC', activation='relu'); y = pool.forward(x); gx = pool.backward(y); "
            "print('numba' in sys.modules, float(gx.sum()))")
    alone = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert alone[0] == "False"
    loaded = subprocess.run([sys.executable, "-c", "import numba; " + code], capture_output=True, text=True,
                            check=True).stdout.split()
    assert loaded == ["True", alone[1]]
