"""Errors a user of the opencl backend can hit: each says what was expected, what was given, what to do."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pytest

from neuroflow.backends.selection import get_backend
from neuroflow.errors import BackendUnavailableError


@pytest.fixture
def no_platform(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ICD loader that finds no OpenCL platform (all_devices is cached: patch the names that call it)."""
    import neuroflow_opencl.backend
    import neuroflow_opencl.device

    for module in (neuroflow_opencl.backend, neuroflow_opencl.device):
        monkeypatch.setattr(module, "all_devices", lambda: ())


def test_no_platform_says_how_to_install_a_driver(backend: Any, no_platform: None) -> None:
    from neuroflow_opencl import OpenclBackend
    from neuroflow_opencl.device import Device

    assert not OpenclBackend.is_available()
    assert "pip install 'neuroflow-opencl[pocl]'" in OpenclBackend.unavailable_reason()
    # an index never asked for before, so the selection cache cannot answer for it
    with pytest.raises(BackendUnavailableError, match=r"backend 'opencl' is installed but cannot run here: "
                                                      r"no OpenCL platform was found.*neuroflow-opencl\[pocl\]"):
        get_backend("opencl:7")
    with pytest.raises(BackendUnavailableError, match=r"intel-opencl-icd.*neuroflow-opencl\[pocl\]"):
        Device(0)


def test_a_broken_opencl_install_is_reported_not_raised(backend: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import neuroflow_opencl.backend
    from neuroflow_opencl import OpenclBackend

    def broken() -> tuple[Any, ...]:
        raise RuntimeError("clGetPlatformIDs failed: ICD not loadable")

    monkeypatch.setattr(neuroflow_opencl.backend, "all_devices", broken)
    assert OpenclBackend.is_available() is False
    reason = OpenclBackend.unavailable_reason()
    assert reason.startswith("OpenCL could not be initialised (RuntimeError: clGetPlatformIDs failed")
    assert "neuroflow-opencl[pocl]" in reason


def test_a_device_index_that_does_not_exist_lists_the_devices(backend: Any) -> None:
    name = backend.cl_device.facts.name
    with pytest.raises(BackendUnavailableError, match=r"there is no opencl device 99 that qualified \(\d of \d did\); "
                                                      r"found opencl:0 = ") as info:
        get_backend("opencl:99")
    assert name in str(info.value)
    with pytest.raises(BackendUnavailableError, match=r"there is no OpenCL device 99; found opencl:0 = "):
        type(backend)(99)  # the raw index, as the qualification child opens it


def test_float16_is_refused_with_a_message(backend: Any, xp: Any) -> None:
    with pytest.raises(TypeError, match="no float16 kernels; convert to float32 first"):
        xp.asarray(np.zeros(3, np.float16))
    with pytest.raises(TypeError, match="no float16 kernels"):
        backend.from_host(np.zeros(3, np.float16))
    with pytest.raises(TypeError, match=r"no kernels for dtype float16; supported: .*float32"):
        xp.zeros((2,), np.float16)
    with pytest.raises(TypeError, match="no kernels for dtype complex64"):
        xp.empty((2,), np.complex64)


def test_float64_on_a_device_without_double_precision(backend: Any, xp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    device = backend.cl_device
    monkeypatch.setattr(device, "facts", dataclasses.replace(device.facts, fp64=False))
    message = re.escape(f"{device.facts.name} has no double precision (cl_khr_fp64); use float32")
    with pytest.raises(TypeError, match=message):
        backend.from_host(np.zeros(3))
    with pytest.raises(TypeError, match=message):
        xp.asarray(np.zeros(3))
    with pytest.raises(TypeError, match=message):
        xp.zeros((2, 2), np.float64)
    with pytest.raises(TypeError, match=message):
        xp.asarray(np.arange(4, dtype=np.int64)).mean()  # numpy's mean of integers is float64
    # float32 work, and its sums (accumulated in float32 without fp64), go on as before
    x = np.linspace(0, 1, 5000, dtype=np.float32)
    assert float(xp.asarray(x).sum()) == pytest.approx(float(x.sum(dtype=np.float64)), rel=1e-5)


def test_an_array_of_another_device_is_refused(backend: Any, xp: Any) -> None:
    from neuroflow_opencl.device import Device
    from neuroflow_opencl.namespace import Namespace

    index = backend.cl_device.index
    other = Device(index)  # a second context on the same hardware is another device to OpenCL
    foreign = Namespace.of(other).asarray(np.ones(3, np.float32))
    with pytest.raises(ValueError, match=f"array lives on <opencl:{index} .*>, not on <opencl:{index} .*>; copy it "
                                         "through the host"):
        xp.asarray(foreign)
    np.testing.assert_array_equal(xp.asarray(foreign.get()).get(), np.ones(3))


@pytest.mark.parametrize(("spec", "shapes", "message"), [
    ("ij,jk", [(2, 3), (3, 4)], "explicit 'ab,bc->ac' specs; got 'ij,jk'"),
    ("...i,i->...", [(2, 3), (3,)], "explicit 'ab,bc->ac' specs"),
    ("ii->i", [(3, 3)], r"einsum term 'ii' does not fit an operand of shape \(3, 3\)"),
    ("ij,jk->ik", [(2, 3), (4, 5)], "einsum: size of label 'j' is 4 for one operand and 3 for another"),
    ("ij->ij", [(2, 3, 4)], r"einsum term 'ij' does not fit an operand of shape \(2, 3, 4\)"),
])
def test_unsupported_or_wrong_einsum_specs(xp: Any, spec: str, shapes: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        xp.einsum(spec, *(xp.zeros(s) for s in shapes))


def test_matmul_shape_errors_read_like_numpys(xp: Any) -> None:
    with pytest.raises(ValueError, match=r"matmul: mismatch in core dimension.*\(size 4 is different from 5\)"):
        xp.matmul(xp.zeros((3, 4)), xp.zeros((5, 2)))
    with pytest.raises(ValueError, match="input operand does not have enough dimensions"):
        xp.matmul(xp.zeros(()), xp.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"output operand has shape \(3, 3\); expected \(3, 2\)"):
        xp.matmul(xp.zeros((3, 4)), xp.zeros((4, 2)), out=xp.zeros((3, 3)))
    with pytest.raises(TypeError, match="needs floating-point arrays; got int64 and int64"):
        xp.matmul(xp.zeros((2, 2), np.int64), xp.zeros((2, 2), np.int64))


def test_out_of_the_wrong_shape_or_kind(xp: Any) -> None:
    a = xp.ones((3, 4))
    with pytest.raises(ValueError, match=r"non-broadcastable output operand with shape \(4,\) doesn't match "
                                         r"the broadcast shape \(3, 4\)"):
        xp.add(a, 1, out=xp.zeros((4,)))
    with pytest.raises(TypeError, match="cannot cast add output from float32 to int64 with casting rule 'same_kind'"):
        xp.add(a, 1, out=xp.zeros((3, 4), np.int64))
    with pytest.raises(ValueError, match=r"output parameter has shape \(3,\); the reduction gives \(4,\)"):
        xp.sum(a, axis=0, out=xp.zeros((3,)))
    with pytest.raises(ValueError, match=r"operands could not be broadcast together with shapes \(3, 4\) \(3,\)"):
        a + xp.ones((3,))
    with pytest.raises(ValueError, match="cannot reshape array of size 12 into shape"):
        a.reshape(5, -1)
    with pytest.raises(ValueError, match="axis 2 is out of bounds for array of dimension 2"):
        a.sum(axis=2)
    with pytest.raises(TypeError, match="cannot mix device arrays with str"):
        a + "1"


def test_index_arrays_must_be_integers_in_range(xp: Any) -> None:
    a = xp.zeros((3, 4))
    with pytest.raises(IndexError, match="arrays used as indices must be of integer type"):
        a[np.array([0.0, 1.0])]
    with pytest.raises(IndexError, match="arrays used as indices must be of integer type"):
        a[xp.asarray(np.array([0.0, 1.0])), xp.asarray(np.array([1, 2]))]
    with pytest.raises(IndexError, match="index out of bounds for axis 1 with size 4"):
        a[np.array([0, 1]), np.array([1, 4])]
    with pytest.raises(IndexError, match="index out of bounds for axis 0 with size 3"):
        a[[-4]]
    with pytest.raises(IndexError, match="too many indices: array is 2-dimensional, but 3 were indexed"):
        a[np.array([0]), np.array([0]), np.array([0])]
    with pytest.raises(IndexError, match="index 3 is out of bounds for axis 0 with size 3"):
        a[3]
