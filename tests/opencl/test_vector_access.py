"""Vector loads and stores both ways: element-aligned vector pointers (pocl) and the standard vloadN/vstoreN
(every other driver). CI has only pocl, so the standard build is forced here on the same device; the two
builds read and write the same elements, so their results are identical."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import neuroflow as nf
from neuroflow_opencl.cdtypes import ELEMENT_ALIGNED_VECTORS, element_aligned_vectors, vector_types

from .test_fused_optim import _parameters, _train


@pytest.fixture(scope="module")
def standard(backend: Any) -> Any:
    """A second opencl:0 backend whose kernels are built without the element-aligned vectors."""
    from neuroflow_opencl import OpenclBackend

    other = OpenclBackend(backend.index)
    if other.cl_device._programs:
        raise RuntimeError("kernels were built before the build options could be changed")
    other.cl_device.build_options = []
    return other


def test_pocl_builds_with_element_aligned_vectors_and_other_drivers_do_not(backend: Any) -> None:
    platform = backend.cl_device.facts.platform
    assert (f"-D{ELEMENT_ALIGNED_VECTORS}" in backend.cl_device.build_options) == element_aligned_vectors(platform)
    assert element_aligned_vectors("Portable Computing Language")
    assert not element_aligned_vectors("Intel(R) OpenCL Graphics")
    source = vector_types("float", widths=(16,))
    assert "vload16(0, (__global const float*)(p))" in source and "vstore16((v), 0, (__global float*)(p))" in source


def test_products_agree(backend: Any, standard: Any) -> None:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((64, 784), dtype=np.float32), rng.standard_normal((140, 784), dtype=np.float32)
    g = rng.standard_normal((63, 140), dtype=np.float32)
    results = []
    for b in (backend, standard):  # Linear's forward at offsets, and its weight gradient
        dx, dw, dg = b.xp.asarray(x), b.xp.asarray(w), b.xp.asarray(g)
        results.append([b.xp.matmul(dx[1:], dw[rows].T).get() for rows in (slice(0, 128), slice(3, 131))]
                       + [b.xp.matmul(dg.T, dx[1:]).get()])
    for ours, theirs in zip(*results):
        np.testing.assert_array_equal(ours, theirs)
        assert np.isfinite(ours).all()


@pytest.mark.parametrize("make", [lambda: nf.optim.Adam(lr=1e-2), lambda: nf.optim.SGD(lr=0.1, momentum=0.9)],
                         ids=["adam", "momentum"])
def test_optimizer_updates_agree(backend: Any, standard: Any, make: Any) -> None:
    data, grads = _parameters(64 * 16 + 5)
    ours = _train(make(), backend.xp, data, grads, backend, lead=3)
    theirs = _train(make(), standard.xp, data, grads, standard, lead=3)
    assert not np.array_equal(ours["data"], data)
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name])


def test_transposing_copies_agree(backend: Any, standard: Any) -> None:
    host = np.random.default_rng(1).standard_normal((100, 37)).astype(np.float32)
    ours, theirs = (b.xp.asarray(host)[2:, 1:].T.copy().get() for b in (backend, standard))
    np.testing.assert_array_equal(ours, host[2:, 1:].T)
    np.testing.assert_array_equal(theirs, ours)
