"""ClArray: an n-dimensional view of an OpenCL buffer — (buffer, offset, shape, strides, dtype).

Views never create sub-buffers (their alignment rules break a planner's
offsets on real drivers): the offset travels to every kernel as an argument.
The class implements the part of numpy's ndarray that NeuroFlow's ops use.
It knows no kernel: its arithmetic, reductions, host copies and integer-array
indexing go through ``ClArray.kernels``, an ``ArrayKernels`` that
``neuroflow_opencl.namespace`` (above every kernel module) installs when it is
imported. Nothing here waits for the device except reading values back to the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from neuroflow_opencl.cdtypes import c_type
from neuroflow_opencl.views import (
    Shape,
    basic_index,
    contiguous_strides,
    is_contiguous,
    normalize_shape,
    reshape_strides,
)

if TYPE_CHECKING:
    from neuroflow_opencl.device import Device


@dataclass(frozen=True)
class ArrayKernels:
    """The device work behind ClArray's methods, one function each (the modules that hold them sit above
    this one; ``neuroflow_opencl.namespace`` installs the one instance as ``ClArray.kernels``)."""

    apply: Callable[..., ClArray]  # elementwise.apply(name, *operands, out=None, dtype=None)
    reduce: Callable[..., ClArray]  # reduction.reduce(kind, a, axis, keepdims, out, dtype)
    arg_reduce: Callable[..., ClArray]  # reduction.arg_reduce(kind, a, axis, out, keepdims)
    matmul: Callable[[ClArray, Any], ClArray]
    gather: Callable[[ClArray, Any], ClArray]  # a[key] for an integer-array key
    scatter: Callable[[ClArray, Any, Any], None]  # a[key] = value for an integer-array key
    from_host: Callable[[Device, np.ndarray], ClArray]
    write: Callable[[ClArray, np.ndarray], None]  # a host array into a device array, in place
    to_host: Callable[[ClArray], np.ndarray]
    namespace: Callable[[Device], Any]  # the one namespace (backend.xp) over a device's arrays


class ClArray:
    """A device array; ``offset`` and ``strides`` count elements of ``dtype``, not bytes."""

    __array_priority__ = 100  # numpy defers binary operators with a ClArray on the right to us
    kernels: ClassVar[ArrayKernels]

    def __init__(self, device: Device, buffer: Any, shape: Shape, dtype: Any, offset: int = 0,
                 strides: Shape | None = None, base: ClArray | None = None, address: int = 0) -> None:
        self.device = device
        self.buffer = buffer
        self.shape = tuple(map(int, shape))
        self.dtype = np.dtype(dtype)
        self.offset = int(offset)
        self.estrides = contiguous_strides(self.shape) if strides is None else tuple(strides)
        self.base = base
        # OpenCL gives no addresses; a per-device virtual one lets the memory tracer tell buffers apart.
        self.address = address

    # ------------------------------------------------------------------ attributes
    @property
    def strides(self) -> Shape:
        """Strides in bytes, as numpy gives them; kernels use ``estrides`` (in elements)."""
        return tuple(s * self.dtype.itemsize for s in self.estrides)

    @property
    def data(self) -> Any:
        """``data.ptr``: a virtual address of the first element, unique across this device's buffers."""
        return _Pointer(self.address + self.offset * self.dtype.itemsize)

    @property
    def flags(self) -> Any:
        return _Flags(self.is_contiguous)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def is_contiguous(self) -> bool:
        return is_contiguous(self.shape, self.estrides)

    @property
    def T(self) -> ClArray:  # noqa: N802 - numpy's name
        if len(self.shape) == 2:  # a weight's transpose, several per step: no axis bookkeeping
            return self.view_at(self.offset, self.shape[::-1], self.estrides[::-1])
        return self.transpose()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __array_namespace__(self, api_version: str | None = None) -> Any:
        return self.kernels.namespace(self.device)

    def __repr__(self) -> str:
        return f"ClArray({self.get()!r}, device=opencl:{self.device.index})"

    # ------------------------------------------------------------------ views
    def view_at(self, offset: int, shape: Shape, strides: Shape, dtype: Any = None) -> ClArray:
        """A view of this array's buffer from element ``offset`` with ``shape`` and ``strides`` (in elements of
        ``dtype``, by default this array's)."""
        return ClArray(self.device, self.buffer, shape, dtype or self.dtype, offset, strides,
                       self if self.base is None else self.base, self.address)

    def reshape(self, *shape: Any, order: str = "C") -> ClArray:
        if order != "C":
            raise NotImplementedError("the opencl backend reshapes in C order only")
        if len(shape) == 1 and not isinstance(shape[0], int):
            shape = tuple(shape[0])
        if shape == self.shape:  # ops reshape outputs to the shape they have: no stride arithmetic for that
            return self.view_at(self.offset, self.shape, self.estrides)
        new_shape = normalize_shape(shape, self.size)
        strides = reshape_strides(self.shape, self.estrides, new_shape)
        if strides is None:
            return self.copy().reshape(new_shape)
        return self.view_at(self.offset, new_shape, strides)

    def ravel(self) -> ClArray:
        return self.reshape(-1)

    def transpose(self, *axes: Any) -> ClArray:
        if len(axes) == 1 and axes[0] is not None and not isinstance(axes[0], int):
            axes = tuple(axes[0])
        order = tuple(reversed(range(self.ndim))) if not axes or axes == (None,) else tuple(
            a % self.ndim for a in axes)
        if sorted(order) != list(range(self.ndim)):
            raise ValueError(f"axes {axes} don't match array of {self.ndim} dimensions")
        return self.view_at(self.offset, tuple(self.shape[a] for a in order), tuple(self.estrides[a] for a in order))

    def swapaxes(self, a: int, b: int) -> ClArray:
        order = list(range(self.ndim))
        order[a], order[b] = order[b], order[a]
        return self.transpose(order)

    def view(self, dtype: Any) -> ClArray:
        """Reinterpret a dense array's bytes as ``dtype`` (the arena hands out typed views of a byte block)."""
        new = np.dtype(dtype)
        if new == self.dtype:
            return self.view_at(self.offset, self.shape, self.estrides)
        if not self.is_contiguous or not self.ndim:
            raise ValueError("only a dense array with at least one dimension can change dtype in place")
        byte_offset, nbytes = self.offset * self.itemsize, self.shape[-1] * self.itemsize
        if byte_offset % new.itemsize or nbytes % new.itemsize:
            raise ValueError(f"a view at byte offset {byte_offset} of {nbytes} bytes cannot be read as {new}")
        shape = (*self.shape[:-1], nbytes // new.itemsize)
        return self.view_at(byte_offset // new.itemsize, shape, contiguous_strides(shape), new)

    def as_strided(self, shape: Shape, strides_bytes: Shape) -> ClArray:
        """numpy.lib.stride_tricks.as_strided on the device: strides in bytes, as numpy takes them."""
        if any(s % self.itemsize for s in strides_bytes):
            raise ValueError(f"strides {strides_bytes} are not multiples of the item size {self.itemsize}")
        return self.view_at(self.offset, tuple(shape), tuple(s // self.itemsize for s in strides_bytes))

    def __getitem__(self, key: Any) -> ClArray:
        if _is_advanced(key):
            return self.kernels.gather(self, key)
        delta, shape, strides = basic_index(self.shape, self.estrides, key)
        return self.view_at(self.offset + delta, shape, strides)

    def __setitem__(self, key: Any, value: Any) -> None:
        if _is_advanced(key):
            self.kernels.scatter(self, key, value)
            return
        target = self[key] if key is not Ellipsis else self
        target.assign(value)

    def assign(self, value: Any) -> None:
        """Copy ``value`` (device array, host array or scalar, broadcast) into this view."""
        if isinstance(value, (np.ndarray, list, tuple)):
            value = np.asarray(value)
            if value.ndim:
                value = self.kernels.from_host(self.device, value)
        self.kernels.apply("copy", value, out=self, dtype=self.dtype)

    # ------------------------------------------------------------------ copies and host
    def copy(self) -> ClArray:
        out = empty(self.device, self.shape, self.dtype)
        out.assign(self)
        return out

    def astype(self, dtype: Any, copy: bool = True) -> ClArray:
        if np.dtype(dtype) == self.dtype and not copy:
            return self
        out = empty(self.device, self.shape, dtype)
        self.kernels.apply("copy", self, out=out, dtype=out.dtype)
        return out

    def partition(self, kth: int) -> None:
        """numpy's in-place partition of a 1-D array, done on the host (one round trip): a selection has
        no fixed-shape kernel here, and its only user (gradient compression's top-k) runs once per step."""
        if self.ndim != 1:
            raise ValueError("the opencl backend partitions 1-D arrays only")
        host = self.get()
        host.partition(kth)
        self.kernels.write(self, host)

    def fill(self, value: Any) -> None:
        self.assign(value)

    def get(self) -> np.ndarray:
        """A host copy (waits for the queued work that writes this array)."""
        return self.kernels.to_host(self)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        host = self.get()
        return host if dtype is None else host.astype(dtype)

    def item(self) -> Any:
        if self.size != 1:
            raise ValueError("can only convert an array of size 1 to a Python scalar")
        return self.get().reshape(()).item()

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.dtype.kind not in "iu":
            raise TypeError("only integer arrays can be used as an index")
        return int(self.item())

    def __bool__(self) -> bool:
        return bool(self.item())

    def tolist(self) -> Any:
        return self.get().tolist()

    # ------------------------------------------------------------------ reductions
    def sum(self, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return self.kernels.reduce("sum", self, axis, keepdims, out, dtype)

    def mean(self, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return self.kernels.reduce("mean", self, axis, keepdims, out, dtype)

    def max(self, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return self.kernels.reduce("max", self, axis, keepdims, out)

    def min(self, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return self.kernels.reduce("min", self, axis, keepdims, out)

    def any(self, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return self.kernels.reduce("any", self, axis, keepdims, out)

    def all(self, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return self.kernels.reduce("all", self, axis, keepdims, out)

    def argmax(self, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return self.kernels.arg_reduce("argmax", self, axis, out, keepdims)

    def argmin(self, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return self.kernels.arg_reduce("argmin", self, axis, out, keepdims)

    # ------------------------------------------------------------------ operators
    def _binary(self, name: str, other: Any, reflected: bool = False) -> Any:
        kernels = self.kernels
        if isinstance(other, np.ndarray) and other.ndim:
            other = kernels.from_host(self.device, other)
        return kernels.apply(name, other, self) if reflected else kernels.apply(name, self, other)

    def _inplace(self, name: str, other: Any) -> ClArray:
        kernels = self.kernels
        if isinstance(other, np.ndarray) and other.ndim:
            other = kernels.from_host(self.device, other)
        kernels.apply(name, self, other, out=self)
        return self

    def __add__(self, o: Any) -> Any: return self._binary("add", o)
    def __radd__(self, o: Any) -> Any: return self._binary("add", o, True)
    def __sub__(self, o: Any) -> Any: return self._binary("subtract", o)
    def __rsub__(self, o: Any) -> Any: return self._binary("subtract", o, True)
    def __mul__(self, o: Any) -> Any: return self._binary("multiply", o)
    def __rmul__(self, o: Any) -> Any: return self._binary("multiply", o, True)
    def __truediv__(self, o: Any) -> Any: return self._binary("divide", o)
    def __rtruediv__(self, o: Any) -> Any: return self._binary("divide", o, True)
    def __pow__(self, o: Any) -> Any: return self._binary("power", o)
    def __gt__(self, o: Any) -> Any: return self._binary("greater", o)  # type: ignore[override]
    def __ge__(self, o: Any) -> Any: return self._binary("greater_equal", o)  # type: ignore[override]
    def __lt__(self, o: Any) -> Any: return self._binary("less", o)  # type: ignore[override]
    def __le__(self, o: Any) -> Any: return self._binary("less_equal", o)  # type: ignore[override]
    def __eq__(self, o: Any) -> Any: return self._binary("equal", o)  # type: ignore[override]
    def __ne__(self, o: Any) -> Any: return self._binary("not_equal", o)  # type: ignore[override]
    def __iadd__(self, o: Any) -> ClArray: return self._inplace("add", o)
    def __isub__(self, o: Any) -> ClArray: return self._inplace("subtract", o)
    def __imul__(self, o: Any) -> ClArray: return self._inplace("multiply", o)
    def __itruediv__(self, o: Any) -> ClArray: return self._inplace("divide", o)

    def __neg__(self) -> ClArray:
        return self.kernels.apply("negative", self)

    def __matmul__(self, other: Any) -> ClArray:
        return self.kernels.matmul(self, other)

    __hash__ = None  # type: ignore[assignment]


class _Pointer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class _Flags:
    def __init__(self, contiguous: bool) -> None:
        self.c_contiguous = self.contiguous = contiguous
        self.writeable = True


def is_array(value: Any) -> bool:
    return isinstance(value, ClArray)


def overlaps(a: ClArray, b: ClArray) -> bool:
    """Whether ``a`` may read bytes that writing ``b`` changes (the same view twice is safe: each element reads itself)."""
    if a.buffer is not b.buffer or not a.size or not b.size:
        return False
    if (a.offset * a.itemsize, a.dtype, a.shape, a.estrides) == (b.offset * b.itemsize, b.dtype, b.shape, b.estrides):
        return False
    (a_lo, a_hi), (b_lo, b_hi) = _byte_extent(a), _byte_extent(b)
    return a_lo < b_hi and b_lo < a_hi


def _byte_extent(x: ClArray) -> tuple[int, int]:
    lo = hi = x.offset
    for n, s in zip(x.shape, x.estrides):
        lo, hi = lo + min(0, (n - 1) * s), hi + max(0, (n - 1) * s)
    return lo * x.itemsize, (hi + 1) * x.itemsize


def empty(device: Device, shape: Any, dtype: Any = np.float32) -> ClArray:
    """A new dense device array; its buffer comes from the device's pool (reused, not re-created)."""
    shape = normalize_shape(shape)
    dtype = np.dtype(dtype)
    c_type(dtype)  # refuse dtypes without kernels here, not deep inside a kernel build
    if dtype == np.float64 and not device.facts.fp64:
        raise TypeError(f"{device.facts.name} has no double precision (cl_khr_fp64); use float32")
    nbytes = math.prod(shape) * dtype.itemsize
    return ClArray(device, device.allocate(nbytes), shape, dtype, address=device.reserve_address(nbytes))


def _is_advanced(key: Any) -> bool:
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (ClArray, np.ndarray, list)) for k in keys)
