"""The numba kernels' shared loading (neuroflow_ops_vision.compiled): a cache numba cannot read is rebuilt, for every
kernel module."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HAS_NUMBA

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
