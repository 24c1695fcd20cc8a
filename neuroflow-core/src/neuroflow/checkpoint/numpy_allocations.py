"""Every array numpy makes in a block, asked of a callback before its memory exists (numpy's NEP 49 hook).

numpy lets a program choose the allocator of array data through a context
variable (``PyDataMem_SetHandler``, public C API since numpy 1.22). While a
block of :func:`charged_to` runs, the current context's handler is one whose
``malloc``, ``calloc`` and ``realloc`` first ask ``charge(bytes)``; a refusal
returns NULL, which numpy raises as ``MemoryError`` before it touches a page.
This catches every array, whoever makes it and however: ``np.ones`` in an op
constructor, ``np.eye``, ``np.arange``, arithmetic results, a third-party
plugin's own calls. Being a context variable, it changes nothing for other
threads, which allocate as before.

Granted requests are served by numpy's default allocator, and the handler's
``free`` *is* the default one (a C function): an array made in the block and
freed at any later time, interpreter shutdown included, never calls back into
Python. The handler and the callbacks are made once and never released,
since each array made in the block refers to the handler for as long as it lives.

numpy offers the hook through its C API only, reached here with ctypes. Where
it cannot be found (another Python implementation, a numpy without the API),
:func:`charged_to` does nothing and :data:`AVAILABLE` is False.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from contextlib import AbstractContextManager
from contextvars import ContextVar
from types import TracebackType
from typing import Any

try:
    import numpy._core._multiarray_umath as umath
except ImportError:  # numpy 1.x
    import numpy.core._multiarray_umath as umath  # type: ignore[no-redef]

#: Slots of numpy's C API table (``__multiarray_api.h``), the same from numpy 1.22 on.
_SET_HANDLER, _DEFAULT_HANDLER = 304, 306
_CAPSULE_NAME = b"mem_handler"

_MALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_CALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
_REALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
_FREE = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)


class _Allocator(ctypes.Structure):  # PyDataMemAllocator
    _fields_ = [("ctx", ctypes.c_void_p), ("malloc", _MALLOC), ("calloc", _CALLOC), ("realloc", _REALLOC),
                ("free", _FREE)]


class _Handler(ctypes.Structure):  # PyDataMem_Handler, version 1
    _fields_ = [("name", ctypes.c_char * 127), ("version", ctypes.c_uint8), ("allocator", _Allocator)]


#: The callback of the innermost :func:`charged_to` block of this context, None outside any.
_charge: ContextVar[Callable[[int], bool] | None] = ContextVar("neuroflow_numpy_charge", default=None)


def _c_api(name: str, result: Any, *arguments: Any) -> Any:
    """The CPython C function ``name``, called with the GIL held."""
    return ctypes.PYFUNCTYPE(result, *arguments)((name, ctypes.pythonapi))


def _numpy_api() -> ctypes.Array[ctypes.c_void_p] | None:
    """numpy's C API table, found as numpy's own ``import_array()`` finds it (its ``_ARRAY_API`` capsule)."""
    table = _c_api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(umath._ARRAY_API, None)
    return (ctypes.c_void_p * (_DEFAULT_HANDLER + 1)).from_address(table) if table else None


def _held(prototype: Any, function: Any) -> Any:
    """The C allocator function ``function`` (a ctypes function pointer), to be called with the GIL held.

    numpy's default allocator releases the GIL around a large ``calloc`` itself, so it must be entered with it.
    """
    address = ctypes.cast(function, ctypes.c_void_p).value or 0  # never 0: _make_handler checked
    return ctypes.PYFUNCTYPE(prototype._restype_, *prototype._argtypes_)(address)


def _make_handler() -> tuple[Callable[[Any], Any], Any] | None:
    """numpy's ``PyDataMem_SetHandler`` and a handler capsule charging :data:`_charge`; None without the API."""
    table = _numpy_api() if hasattr(ctypes, "pythonapi") else None
    set_at, default_at = (table[_SET_HANDLER], table[_DEFAULT_HANDLER]) if table is not None else (None, None)
    default_handler = ctypes.c_void_p.from_address(default_at).value if default_at else None
    if not set_at or not default_handler:
        return None
    default = ctypes.cast(default_handler, ctypes.py_object).value
    if not _c_api("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(default, _CAPSULE_NAME):
        return None
    get_pointer = _c_api("PyCapsule_GetPointer", ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)
    given = _Handler.from_address(get_pointer(default, _CAPSULE_NAME))
    plain = given.allocator
    if given.version != 1 or not (plain.malloc and plain.calloc and plain.realloc and plain.free):
        return None
    # The callbacks read only these locals: they may run while the interpreter tears modules down.
    current = _charge.get
    plain_malloc, plain_calloc = _held(_MALLOC, plain.malloc), _held(_CALLOC, plain.calloc)
    plain_realloc = _held(_REALLOC, plain.realloc)

    def malloc(ctx: int, size: int) -> Any:
        charge = current()
        return None if charge is not None and not charge(size) else plain_malloc(ctx, size)

    def calloc(ctx: int, count: int, size: int) -> Any:
        charge = current()
        return None if charge is not None and not charge(count * size) else plain_calloc(ctx, count, size)

    def realloc(ctx: int, pointer: int, size: int) -> Any:
        charge = current()
        return None if charge is not None and not charge(size) else plain_realloc(ctx, pointer, size)

    handler = _Handler(b"neuroflow_charged", 1, _Allocator(plain.ctx, _MALLOC(malloc), _CALLOC(calloc),
                                                           _REALLOC(realloc), plain.free))
    name = ctypes.create_string_buffer(_CAPSULE_NAME)  # a capsule keeps the pointer to its name, not a copy
    capsule = _c_api("PyCapsule_New", ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
        ctypes.addressof(handler), name, None)
    # Never released: each array made in a block refers to the handler until it dies.
    _c_api("Py_IncRef", None, ctypes.py_object)((handler, name, capsule))
    set_handler = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object)(set_at)
    return set_handler, capsule


_HANDLER = _make_handler()
#: Whether numpy's allocations can be charged here (CPython with numpy >= 1.22).
AVAILABLE = _HANDLER is not None


class _Charged:
    """The block of :func:`charged_to` (a class: a generator-based context would cost as much as the swap)."""

    def __init__(self, charge: Callable[[int], bool]) -> None:
        self._charge = charge
        self._token: Any = None
        self._previous: Any = None

    def __enter__(self) -> None:
        if _HANDLER is None:
            return
        set_handler, capsule = _HANDLER
        self._token = _charge.set(self._charge)
        self._previous = set_handler(capsule)

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._token is None or _HANDLER is None:
            return
        _HANDLER[0](self._previous)
        _charge.reset(self._token)
        self._token = self._previous = None


def charged_to(charge: Callable[[int], bool]) -> AbstractContextManager[None]:
    """Within the block, this thread's numpy asks ``charge(nbytes)`` before allocating array data; False refuses.

    A refused allocation raises numpy's ``MemoryError`` where it was asked for.
    ``charge`` must not raise (it runs inside numpy's allocator, which can only
    fail); record what it refuses instead. Blocks nest.
    """
    return _Charged(charge)
