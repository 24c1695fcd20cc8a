"""The array namespace ops see as ``backend.xp`` on the opencl backend: numpy's names over ClArray.

Only what NeuroFlow's core, vision and recurrent ops call is here; a
missing name raises AttributeError naming the namespace, so an op that needs
more fails at once with a clear message rather than on the host.

This is the top of the array layers (views, array, then the kernel modules,
then this one): importing it installs the kernels ClArray's own methods run
(``ClArray.kernels``; array.py knows no kernel module).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from neuroflow_opencl import elementwise, reduction
from neuroflow_opencl.array import ArrayKernels, ClArray, empty, is_array
from neuroflow_opencl.device import Device
from neuroflow_opencl.elementwise import arange
from neuroflow_opencl.gemm import matmul
from neuroflow_opencl.indexing import gather, scatter, take_along_axis
from neuroflow_opencl.transfer import from_host, to_host, write
from neuroflow_opencl.views import normalize_shape


class Namespace:
    """numpy-like functions bound to one device."""

    newaxis = None
    float32, float64, int32, int64, uint8, bool_ = np.float32, np.float64, np.int32, np.int64, np.uint8, np.bool_
    ndarray = ClArray

    def __init__(self, device: Device) -> None:
        self.device = device
        self.lib = SimpleNamespace(stride_tricks=SimpleNamespace(as_strided=self.as_strided))

    @classmethod
    def of(cls, device: Device) -> Namespace:
        """The one namespace over ``device``'s arrays (``backend.xp``): made on first use, kept by the device."""
        namespace = device.namespace
        if namespace is None:
            namespace = device.namespace = cls(device)
        return namespace

    def __repr__(self) -> str:
        return f"<neuroflow_opencl namespace for {self.device!r}>"

    # ------------------------------------------------------------------ creation
    def empty(self, shape: Any, dtype: Any = np.float32) -> ClArray:
        return empty(self.device, normalize_shape(shape), dtype)

    def full(self, shape: Any, value: Any, dtype: Any = None) -> ClArray:
        out = self.empty(shape, dtype if dtype is not None else np.asarray(value).dtype)
        out.fill(value)
        return out

    def zeros(self, shape: Any, dtype: Any = np.float32) -> ClArray:
        return self.full(shape, 0, dtype)

    def ones(self, shape: Any, dtype: Any = np.float32) -> ClArray:
        return self.full(shape, 1, dtype)

    def empty_like(self, a: Any, dtype: Any = None) -> ClArray:
        return self.empty(a.shape, dtype or a.dtype)

    def zeros_like(self, a: Any, dtype: Any = None) -> ClArray:
        return self.zeros(a.shape, dtype or a.dtype)

    def ones_like(self, a: Any, dtype: Any = None) -> ClArray:
        return self.ones(a.shape, dtype or a.dtype)

    def asarray(self, a: Any, dtype: Any = None) -> ClArray:
        if is_array(a):
            if a.device is not self.device:
                raise ValueError(f"array lives on {a.device!r}, not on {self.device!r}; copy it through the host")
            return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
        return from_host(self.device, np.asarray(a), dtype)

    def array(self, a: Any, dtype: Any = None, copy: bool = True) -> ClArray:
        out = self.asarray(a, dtype)
        return out.copy() if copy and is_array(a) and out is a else out

    def ascontiguousarray(self, a: Any, dtype: Any = None) -> ClArray:
        out = self.asarray(a, dtype)
        return out if out.is_contiguous else out.copy()

    def arange(self, start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> ClArray:
        return arange(self.device, start, stop, step, dtype)

    def as_strided(self, x: ClArray, shape: Any = None, strides: Any = None, writeable: bool = True) -> ClArray:
        return x.as_strided(tuple(shape if shape is not None else x.shape),
                            tuple(strides if strides is not None else x.strides))

    # ------------------------------------------------------------------ copies
    def copyto(self, dst: ClArray, src: Any) -> None:
        dst.assign(src)

    def concatenate(self, arrays: Any, axis: int = 0, out: ClArray | None = None) -> ClArray:
        arrays = [self.asarray(a) for a in arrays]
        if not arrays:
            raise ValueError("need at least one array to concatenate")
        axis = axis % arrays[0].ndim
        sizes = [a.shape[axis] for a in arrays]
        shape = (*arrays[0].shape[:axis], sum(sizes), *arrays[0].shape[axis + 1:])
        for a in arrays:
            if a.ndim != len(shape) or a.shape[:axis] + a.shape[axis + 1:] != shape[:axis] + shape[axis + 1:]:
                raise ValueError(f"all the input array dimensions except for the concatenation axis must match; "
                                 f"got {[a.shape for a in arrays]}")
        if out is None:
            out = self.empty(shape, np.result_type(*(a.dtype for a in arrays)))
        elif out.shape != shape:
            raise ValueError(f"concatenate: output has shape {out.shape}; expected {shape}")
        start = 0
        for a, n in zip(arrays, sizes):
            index = (slice(None),) * axis + (slice(start, start + n),)
            out[index] = a
            start += n
        return out

    # ------------------------------------------------------------------ products and reductions
    def matmul(self, a: ClArray, b: ClArray, out: ClArray | None = None) -> ClArray:
        return matmul(a, b, out)

    def dot(self, a: ClArray, b: ClArray, out: ClArray | None = None) -> ClArray:
        if a.ndim == 1 and b.ndim == 1:
            return self.einsum("i,i->", a, b) if out is None else self._contract_into("i,i->", (a, b), out)
        return matmul(a, b, out)

    def einsum(self, spec: str, *operands: ClArray, out: ClArray | None = None) -> ClArray:
        inputs, _, output = spec.replace(" ", "").partition("->")
        terms = inputs.split(",")
        if not _ or "." in spec or len(terms) != len(operands):
            raise ValueError(f"the opencl backend's einsum takes explicit 'ab,bc->ac' specs; got {spec!r}")
        sizes: dict[str, int] = {}
        for term, op in zip(terms, operands):
            if len(term) != op.ndim or len(set(term)) != len(term):
                raise ValueError(f"einsum term {term!r} does not fit an operand of shape {op.shape}")
            for letter, n in zip(term, op.shape):
                known = sizes.setdefault(letter, n)
                if known != n and 1 not in (known, n):
                    raise ValueError(f"einsum: size of label {letter!r} is {n} for one operand and "
                                     f"{known} for another")
                sizes[letter] = max(known, n)  # a size-1 axis broadcasts, as in numpy
        if out is None:
            out = self.empty(tuple(sizes[c] for c in output), np.result_type(*(op.dtype for op in operands)))
        return self._contract_into(spec, operands, out)

    def _contract_into(self, spec: str, operands: Any, out: ClArray) -> ClArray:
        inputs, _, output = spec.replace(" ", "").partition("->")
        terms = inputs.split(",")
        sizes = {c: n for term, op in zip(terms, operands) for c, n in zip(term, op.shape) if n != 1}
        for term in terms:
            sizes.update({c: 1 for c in term if c not in sizes})
        summed = [c for c in dict.fromkeys("".join(terms)) if c not in output]
        order = list(output) + summed
        shape = tuple(sizes[c] for c in order)
        views = []
        for term, op in zip(terms, operands):
            strides = tuple(op.estrides[term.index(c)] if c in term and op.shape[term.index(c)] != 1 else 0
                            for c in order)
            views.append(op.view_at(op.offset, shape, strides))
        expr = " * ".join(f"a{i}" for i in range(len(views)))
        reduction.contract(views, expr, "sum", len(output), out)
        return out

    def sum(self, a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return reduction.reduce("sum", a, axis, keepdims, out, dtype)

    def mean(self, a: Any, axis: Any = None, dtype: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return reduction.reduce("mean", a, axis, keepdims, out, dtype)

    def max(self, a: Any, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return reduction.reduce("max", a, axis, keepdims, out)

    def min(self, a: Any, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return reduction.reduce("min", a, axis, keepdims, out)

    def any(self, a: Any, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return reduction.reduce("any", a, axis, keepdims, out)

    def all(self, a: Any, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return reduction.reduce("all", a, axis, keepdims, out)

    def argmax(self, a: Any, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return reduction.arg_reduce("argmax", a, axis, out, keepdims)

    def argmin(self, a: Any, axis: Any = None, out: Any = None, keepdims: bool = False) -> ClArray:
        return reduction.arg_reduce("argmin", a, axis, out, keepdims)

    def count_nonzero(self, a: ClArray) -> int:
        out = self.empty((), np.int64)
        reduction.contract([a.reshape(-1)], "(a0 != 0)", "sum", 0, out)
        return int(out)

    def flatnonzero(self, a: ClArray) -> ClArray:
        # a data-dependent size: computed on the host (one read), as gradient compression's packing needs it
        return from_host(self.device, np.flatnonzero(a.get()))

    def take_along_axis(self, a: ClArray, indices: ClArray, axis: int) -> ClArray:
        return take_along_axis(a, indices, axis)

    def clip(self, a: Any, lo: Any, hi: Any, out: ClArray | None = None) -> ClArray:
        return elementwise.apply("clip", a, lo, hi, out=out)

    def where(self, condition: Any, x: Any, y: Any) -> ClArray:
        return elementwise.apply("where", condition, x, y)


def _ufunc(name: str) -> Any:
    def call(self: Namespace, *operands: Any, out: ClArray | None = None, dtype: Any = None) -> ClArray:
        operands = tuple(from_host(self.device, op) if isinstance(op, np.ndarray) and op.ndim else op
                         for op in operands)
        return elementwise.apply(name, *operands, out=out, dtype=dtype)

    call.__name__ = name
    call.__doc__ = f"numpy.{name} on device arrays."
    return call


for _name in elementwise.UFUNCS:
    if _name not in ("clip", "copy"):
        setattr(Namespace, _name, _ufunc(_name))
Namespace.abs = Namespace.absolute  # type: ignore[attr-defined]

ClArray.kernels = ArrayKernels(
    apply=elementwise.apply, reduce=reduction.reduce, arg_reduce=reduction.arg_reduce, matmul=matmul,
    gather=gather, scatter=scatter, from_host=from_host, write=write, to_host=to_host, namespace=Namespace.of,
)
