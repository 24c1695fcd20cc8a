"""The numba kernels' shared loading (neuroflow_ops_vision.compiled), for every kernel module: a cache numba cannot read
is rebuilt; kernels that cannot be loaded are reported once and the op runs its numpy code."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from neuroflow.operator import Operator
from neuroflow_ops_vision import BatchNorm2d, MaxPool2d, compiled

from .conftest import HAS_NUMBA, on_numpy

#: (kernel module, a program that runs its kernels forward and backward and prints a gradient's sum)
PROGRAMS = {
    "conv_depthwise_numba": ("import numpy as np; from neuroflow_ops_vision import DepthwiseConv2d; "
                             "op = DepthwiseConv2d(4, 3, padding=1, layout='NHWC'); x = np.arange(100.0, "
                             "dtype=np.float32).reshape(1, 5, 5, 4) / 100; y = op.forward(x); op.backward(y); "
                             "print(float(op.weight.grad.sum()))"),
    "batchnorm_numba": ("import numpy as np; from neuroflow_ops_vision import BatchNorm2d; "
                        "bn = BatchNorm2d(4, activation='relu', layout='NHWC'); x = np.arange(100.0, "
                        "dtype=np.float32).reshape(1, 5, 5, 4) / 100; y = bn.forward(x); bn.backward(y); "
                        "print(float(bn.weight.grad.sum()))"),
    "pooling_numba": ("import numba, numpy as np; from neuroflow_ops_vision import MaxPool2d; "
                      "op = MaxPool2d(2, layout='NHWC', activation='relu'); x = np.arange(100.0, "
                      "dtype=np.float32).reshape(1, 5, 5, 4) / 100 - 0.5; y = op.forward(x); "
                      "print(float(op.backward(y).sum()))"),
}


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed: pip install 'neuroflow-ops-vision[numba]'")
@pytest.mark.parametrize("module", list(PROGRAMS))
def test_a_cache_numba_cannot_read_is_rebuilt(module: str, tmp_path: Path) -> None:
    """A crash mid-write or a hostile file in numba's cache made every later run raise inside numba; the kernels
    now delete such a cache and compile again."""
    code = PROGRAMS[module]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=env, capture_output=True,
                           text=True, check=True).stdout
    written = [p for p in tmp_path.rglob(f"{module}.*") if p.suffix in (".nbi", ".nbc")]
    assert written
    for path in written:
        path.write_bytes(b"\x80\x04garbage")
    again = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=env, capture_output=True,
                           text=True)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout == first


#: (kernel module, an NHWC float64 op that runs its kernels, the warning's words for what falls back to numpy);
#: test_conv_depthwise_numba.py has the depthwise kernels' own, with more ways to fail
FALLBACKS: dict[str, tuple[Callable[[], Operator], str]] = {
    "batchnorm_numba": (lambda: BatchNorm2d(3, activation="relu", layout="NHWC", dtype=np.float64),
                        "batch normalisations"),
    "pooling_numba": (lambda: MaxPool2d(2, layout="NHWC", activation="relu"), "max poolings"),
}


@pytest.fixture
def fresh_kernel_lookup() -> Iterator[None]:
    compiled.forget()
    yield
    compiled.forget()


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed: pip install 'neuroflow-ops-vision[numba]'")
@pytest.mark.parametrize("module", list(FALLBACKS))
def test_kernels_that_fail_to_load_are_reported_once_and_numpy_runs(module: str, monkeypatch: pytest.MonkeyPatch,
                                                                    fresh_kernel_lookup: None) -> None:
    made, what = FALLBACKS[module]
    real = importlib.import_module
    real("numba")  # loaded, as the kernels that only ride on a loaded numba need (compiled.RIDERS)

    def refuse(name: str, *args: Any) -> Any:
        if name.endswith(module):
            raise ImportError("Numba needs NumPy 2.3 or less")
        return real(name, *args)

    monkeypatch.setattr(importlib, "import_module", refuse)
    x = np.random.default_rng(0).standard_normal((2, 4, 4, 3))
    op = made()
    with pytest.warns(RuntimeWarning, match=f"{what} run on numpy alone: numba's kernels could not be loaded"):
        y = op.forward(x).copy()
    np.testing.assert_array_equal(y, on_numpy(lambda: made().forward(x).copy()))
    assert compiled.kernels(module, np, np.float64) is None  # the answer is kept: no second warning
