"""The opencl backend's kernel set, built and run once on a device and checked against numpy.

``OpenclBackend.self_test`` runs this in the qualification child (``python -m neuroflow.probe``): every
GEMM kernel (``rows`` at each vector width, k-blocked, with a fused bias, transposed, with row sums;
``dots``, ``scalar``, ``pack`` and ``tiled``), the tiled transpose, elementwise kernels on dense and strided
views, and the reductions, in float32 and (where the device has it) float64. The fused optimizer, loss and
activation kernels run in the training check that follows it. Each stage is reported before it starts, so
that a driver crash is blamed on a kernel family and dtype.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from neuroflow_opencl.gemm import matmul, matmul_and_row_sums

#: (m, k, n) of the products checked: both vector widths and one vector of accumulators, a short row block,
#: a k-blocked product (B larger than 1 MiB), a GEMV and products narrower than a vector.
PRODUCTS = ((16, 40, 64), (9, 33, 24), (64, 600, 512), (1, 50, 40), (8, 20, 5), (5, 7, 3))
TOLERANCE = {np.dtype(np.float32): 1e-4, np.dtype(np.float64): 1e-11}


def run(backend: Any, report: Callable[[str], None]) -> None:
    """Raise ``AssertionError`` naming the kernel whose result disagrees with numpy."""
    dtypes = [np.float32] + ([np.float64] if backend.cl_device.facts.fp64 else [])
    rng = np.random.default_rng(0)
    for dtype in map(np.dtype, dtypes):
        name = dtype.name
        report(f"gemm rows {name} (vectors of {backend.cl_device.vector_bytes} bytes)")
        _products(backend, rng, dtype, None)
        for variant in ("dots", "scalar", "tiled"):
            report(f"gemm {variant} {name}")
            _products(backend, rng, dtype, variant)
        report(f"transpose {name}")
        _transposes(backend, rng, dtype)
        report(f"elementwise {name}")
        _elementwise(backend, rng, dtype)
        report(f"reductions {name}")
        _reductions(backend, rng, dtype)


def _close(what: str, got: Any, want: np.ndarray, dtype: np.dtype) -> None:
    got = np.asarray(got)
    scale = max(1.0, float(np.max(np.abs(want)))) if want.size else 1.0
    error = float(np.max(np.abs(got.astype(np.float64) - want))) / scale if want.size else 0.0
    if got.shape != want.shape or not error <= TOLERANCE.get(dtype, 1e-4) * 10:
        raise AssertionError(f"{what}: result differs from numpy (relative error {error:.3g}, shape {got.shape})")


def _products(backend: Any, rng: np.random.Generator, dtype: np.dtype, variant: str | None) -> None:
    xp, synchronize = backend.xp, backend.synchronize
    saved = os.environ.get("NEUROFLOW_OPENCL_GEMM")
    synchronize()  # pocl spawns its linker with the environment: change it only while the device is idle
    if variant is None:
        os.environ.pop("NEUROFLOW_OPENCL_GEMM", None)
    else:
        os.environ["NEUROFLOW_OPENCL_GEMM"] = variant
    try:
        for m, k, n in PRODUCTS:
            a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
            da, db = xp.asarray(a), xp.asarray(b)
            label = f"gemm {variant or 'rows'} {dtype.name} {m}x{k}x{n}"
            _close(label, backend.to_host(xp.matmul(da, db)), a.astype(np.float64) @ b, dtype)
            out = xp.empty((n, m), dtype)  # C transposed, A's columns and B's rows read as Bᵀ Aᵀ
            matmul(db.T, da.T, out=out)
            _close(label + " transposed", backend.to_host(out), (a.astype(np.float64) @ b).T, dtype)
            bt = xp.asarray(np.ascontiguousarray(b.T))  # x @ W.T: B packed or read by dots
            _close(label + " with B transposed", backend.to_host(xp.matmul(da, bt.T)), a.astype(np.float64) @ b, dtype)
            if variant is None:
                bias = rng.standard_normal(n).astype(dtype)
                out = xp.empty((m, n), dtype)
                matmul(da, db, out=out, bias=xp.asarray(bias))
                _close(label + " with a bias", backend.to_host(out), a.astype(np.float64) @ b + bias, dtype)
                sums = xp.empty((m,), dtype)
                out = xp.empty((m, n), dtype)
                matmul_and_row_sums(da, db, out, sums)
                _close(label + " with row sums", backend.to_host(out), a.astype(np.float64) @ b, dtype)
                _close(label + " row sums", backend.to_host(sums), a.astype(np.float64).sum(axis=1), dtype)
        batched = rng.standard_normal((3, 6, 10)).astype(dtype), rng.standard_normal((3, 10, 20)).astype(dtype)
        got = xp.matmul(xp.asarray(batched[0]), xp.asarray(batched[1]))
        _close(f"gemm {variant or 'rows'} {dtype.name} batched", backend.to_host(got),
               batched[0].astype(np.float64) @ batched[1], dtype)
    finally:
        synchronize()
        if saved is None:
            os.environ.pop("NEUROFLOW_OPENCL_GEMM", None)
        else:
            os.environ["NEUROFLOW_OPENCL_GEMM"] = saved


def _transposes(backend: Any, rng: np.random.Generator, dtype: np.dtype) -> None:
    xp = backend.xp
    for shape in ((40, 70), (16, 16), (130, 33)):
        x = rng.standard_normal(shape).astype(dtype)
        _close(f"transpose {dtype.name} {shape}", backend.to_host(xp.ascontiguousarray(xp.asarray(x).T)),
               np.ascontiguousarray(x.T).astype(np.float64), dtype)


def _elementwise(backend: Any, rng: np.random.Generator, dtype: np.dtype) -> None:
    xp = backend.xp
    x = rng.standard_normal((33, 20)).astype(dtype)
    y = rng.standard_normal((20,)).astype(dtype)
    dx, dy = xp.asarray(x), xp.asarray(y)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    checks = {
        "add (broadcast row)": (xp.add(dx, dy), x64 + y64),
        "multiply by a scalar": (xp.multiply(dx, 3.0), x64 * 3.0),
        "exp": (xp.exp(dx), np.exp(x64)),
        "tanh": (xp.tanh(dx), np.tanh(x64)),
        "sqrt of |x|": (xp.sqrt(xp.absolute(dx)), np.sqrt(np.abs(x64))),
        "log of 1 + x²": (xp.log(xp.add(xp.multiply(dx, dx), 1.0)), np.log(x64 * x64 + 1.0)),
        "maximum": (xp.maximum(dx, 0.0), np.maximum(x64, 0.0)),
        "where": (xp.where(xp.greater(dx, 0.0), dx, 0.5), np.where(x64 > 0, x64, 0.5)),
        "strided view": (xp.multiply(dx[::2, 1::3], 2.0), x64[::2, 1::3] * 2.0),
    }
    for what, (got, want) in checks.items():
        _close(f"elementwise {dtype.name} {what}", backend.to_host(got), want, dtype)


def _reductions(backend: Any, rng: np.random.Generator, dtype: np.dtype) -> None:
    xp = backend.xp
    x = rng.standard_normal((37, 130)).astype(dtype)
    dx, x64 = xp.asarray(x), x.astype(np.float64)
    for axis in (None, 0, 1):
        _close(f"sum {dtype.name} axis={axis}", backend.to_host(xp.sum(dx, axis=axis)), np.asarray(x64.sum(axis=axis)), dtype)
        _close(f"max {dtype.name} axis={axis}", backend.to_host(xp.max(dx, axis=axis)), np.asarray(x64.max(axis=axis)), dtype)
    got = backend.to_host(xp.argmax(dx, axis=1))
    if not np.array_equal(got, x.argmax(axis=1)):
        raise AssertionError(f"argmax {dtype.name} axis=1: indices differ from numpy")
