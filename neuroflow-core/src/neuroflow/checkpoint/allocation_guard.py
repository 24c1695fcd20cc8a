"""One memory budget for rebuilding a model from a file's topology, charged before anything is allocated.

Rebuilding runs op constructors, and a constructor allocates what its config
asks for: a hostile file of a few bytes could say ``Linear(10**6, 10**6)`` or
``BatchNorm2d(10**9)``. A rebuild therefore runs under one
:class:`RebuildBudget`: :data:`BUDGET_FACTOR` times the bytes the file's
tensors declare, each value counted at 8 bytes (the widest float a rebuilt
model holds, so an INT8 or float16 file gets what its model will hold), plus
:data:`BUDGET_ALLOWANCE` for the small arrays every constructor makes. Two
hooks charge it, both before the memory exists:

* numpy's own allocator (:mod:`neuroflow.checkpoint.numpy_allocations`):
  every array numpy makes in the rebuilding thread, ``np.ones`` of a
  BatchNorm buffer as well as any array a plugin's constructor computes, is
  asked of the budget first; a refused one fails with MemoryError before a
  page is touched, and :func:`topology.build <neuroflow.checkpoint.topology.build>`
  reports it with the op's path and the size asked for.
* the process generator: ops initialise their parameters from
  :func:`neuroflow.random.generator`, which during a rebuild is a
  :class:`GuardedGenerator` charging each draw at its size.

Charges are never given back (an array freed in a constructor still counts),
which also bounds the work a constructor can be made to do.

Every parameter and buffer is overwritten from the file afterwards (the
loader checks that each one is), so the stand-in draws nothing for continuous
distributions: it returns a :class:`Placeholder`, one zero broadcast to the
requested shape (every stride 0), which holds no memory whatever its size, and
converting a placeholder (the usual ``rng.uniform(-b, b, shape).astype(dtype)``)
gives another placeholder instead of converting. A constructor therefore pays
neither for drawing nor for its weights' memory, not even for mapping it (an
anonymous mapping per draw and its release took half of the 19 µs that
``Linear(784, 128)`` took to rebuild); the loader then reads the file into
ordinary arrays and puts them in the placeholders' place (see :func:`is_placeholder`). Integer draws (seeds,
permutations) still come from a real generator with a fixed seed, and the
process generator the user seeded is left exactly where it was.
"""

from __future__ import annotations

import math
from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, cast

import numpy as np

from neuroflow import random as nf_random
from neuroflow.checkpoint import numpy_allocations
from neuroflow.checkpoint.errors import CheckpointError

#: A rebuild may allocate this many times the bytes its file's tensors declare (at 8 bytes a value), plus
#: this allowance. Initialisers may draw more than they keep (rejection sampling, the QR of a square draw),
#: and a parameter drawn in float64 and kept in float32 is charged for its draw only.
BUDGET_FACTOR, BUDGET_ALLOWANCE = 2, 16 << 20
_BYTES_PER_VALUE = 8
#: Position of the ``size`` argument of numpy Generator methods whose values are only initial guesses.
_CONTINUOUS = {
    "random": 0, "standard_normal": 0, "standard_exponential": 0, "standard_cauchy": 0,
    "uniform": 2, "normal": 2, "laplace": 2, "lognormal": 2, "gamma": 2, "beta": 2,
    "exponential": 1, "standard_gamma": 1, "standard_t": 1,
}
_DTYPE_FOLLOWS_SIZE = {"random", "standard_normal", "standard_exponential", "standard_gamma"}
#: The same for draws that keep their real values (seeds, shuffles, discrete distributions).
_DISCRETE = {"integers": 2, "choice": 1, "binomial": 2, "poisson": 1, "bytes": 0, "multivariate_normal": 2}
_INTEGERS = (int, np.integer)


#: What :attr:`Refusal.what` is for an array's data; otherwise it names the Generator method that drew.
_ARRAY = "array"


@dataclass(frozen=True)
class Refusal:
    """An allocation a rebuild asked for and was refused: its size in bytes and what asked (``"array"`` or a draw)."""

    nbytes: int
    what: str


class RebuildBudget:
    """The bytes rebuilding the model of a file holding ``held`` values may allocate, all hooks together."""

    def __init__(self, held: int) -> None:
        self.held = held
        self.limit = BUDGET_FACTOR * _BYTES_PER_VALUE * held + BUDGET_ALLOWANCE
        self.left = self.limit
        #: The first request refused (a constructor may catch the MemoryError; the rebuild still fails).
        self.refused: Refusal | None = None

    def charge(self, nbytes: int, what: str) -> bool:
        """Take ``nbytes`` from the budget; False, and the request recorded, when they are not left."""
        if nbytes > self.left:
            if self.refused is None:
                self.refused = Refusal(nbytes, what)
            return False
        self.left -= nbytes
        return True

    def charge_array(self, nbytes: int) -> bool:
        """:meth:`charge` for the data of a numpy array (numpy's allocator calls it; it never raises)."""
        return self.charge(nbytes, _ARRAY)

    def refusal_message(self, source: str, where: str) -> str:
        """What was refused, for a CheckpointError naming ``where`` (the op whose constructor asked)."""
        refused = self.refused or Refusal(0, _ARRAY)
        what = "a numpy array" if refused.what == _ARRAY else f"random draws from {refused.what}"
        return (
            f"{source}: {where} asks for {refused.nbytes:,} bytes ({what}) with {self.left:,} left of the "
            f"{self.limit:,} a file of {self.held:,} values lets its model's rebuild allocate ({BUDGET_FACTOR} x "
            f"{_BYTES_PER_VALUE} bytes a value + {BUDGET_ALLOWANCE >> 20} MiB); the file is corrupt or hostile, "
            "refusing to allocate them"
        )


def _count(size: Any) -> int:
    """How many values a draw of ``size`` gives: 0 for a negative size, 1 for one numpy will refuse anyway."""
    if size is None:
        return 1
    if isinstance(size, _INTEGERS):
        return max(int(size), 0)
    if type(size) is tuple:  # the usual size: counted without converting each dimension
        for dim in size:
            if type(dim) is not int or dim < 0:
                break
        else:
            return math.prod(size)
    try:
        dims = [int(s) for s in size]
    except (TypeError, ValueError):
        return 1  # not a size numpy accepts either; let numpy raise its own error
    return math.prod(dims) if min(dims, default=0) >= 0 else 0


class Placeholder(np.ndarray):
    """A zero standing in for a random draw while a model is rebuilt, broadcast to the draw's shape.

    All its elements are one element (every stride is 0). A ufunc writing
    only into placeholders (``w *= 3``) does nothing: numpy would buffer the
    whole shape to write one element, and the values are the file's to give.
    ``astype`` returns a new placeholder of the new dtype instead of
    converting. Arithmetic into a new array gives an ordinary array (of the
    full size). A parameter or buffer still holding a placeholder after
    the rebuild is one the loader replaces with an ordinary array read from
    the file, so none outlives the load.
    """

    def astype(  # type: ignore[override]
        self, dtype: Any, order: Any = "K", casting: Any = "unsafe", subok: bool = True, copy: bool = True
    ) -> np.ndarray:
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return placeholder(self.shape, dtype)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        if out and all(isinstance(x, Placeholder) for x in out):
            return out[0] if len(out) == 1 else out
        inputs = tuple(_plain(x) for x in inputs)
        if out:
            kwargs["out"] = tuple(_plain(x) for x in out)
        return getattr(ufunc, method)(*inputs, **kwargs)


def placeholder(size: Any, dtype: Any) -> Placeholder:
    """A :class:`Placeholder` of ``size`` (an int or a shape): one zero of ``dtype`` with every stride 0."""
    dtype = np.dtype(dtype)
    shape = (size,) if isinstance(size, _INTEGERS) else tuple(size)
    return Placeholder(shape, dtype, bytearray(dtype.itemsize), 0, (0,) * len(shape))


def _plain(array: Any) -> Any:
    return array.view(np.ndarray) if isinstance(array, Placeholder) else array


def is_placeholder(array: Any) -> bool:
    """Whether ``array`` is a :class:`Placeholder` that a rebuilt model's loader must replace."""
    return isinstance(array, Placeholder)



class GuardedGenerator:
    """Looks like a ``numpy.random.Generator``; charges each draw to ``budget`` and refuses one beyond it."""

    def __init__(self, budget: RebuildBudget, source: str) -> None:
        self._inner: np.random.Generator | None = None  # made on the first draw: creating one costs 0.1 ms
        self._budget = budget
        self._source = source

    def _charge(self, method: str, count: int, dtype: Any = np.float64) -> None:
        if not self._budget.charge(count * np.dtype(dtype).itemsize, method):
            raise CheckpointError(self._budget.refusal_message(self._source, "the topology"))

    def _real(self, name: str) -> Any:
        if self._inner is None:
            self._inner = np.random.default_rng(0)
        return getattr(self._inner, name)

    def __getattr__(self, name: str) -> Any:
        if name in _CONTINUOUS:
            zeros = self._zeros(name, _CONTINUOUS[name])
            self.__dict__[name] = zeros  # found directly from now on: constructors draw often
            return zeros
        attribute = self._real(name)
        if not callable(attribute):
            return attribute
        position = _DISCRETE.get(name)

        def draw(*args: Any, **kwargs: Any) -> Any:
            if name == "permutation" and args and isinstance(args[0], _INTEGERS):
                self._charge(name, int(args[0]))
            elif position is not None:
                self._charge(name, _count(kwargs.get("size", args[position] if len(args) > position else None)))
            return attribute(*args, **kwargs)

        return draw

    def _zeros(self, name: str, position: int) -> Any:
        def draw(*args: Any, **kwargs: Any) -> Any:
            out = kwargs.get("out")
            size = kwargs.get("size", args[position] if len(args) > position else None)
            if out is not None:
                self._charge(name, int(out.size), out.dtype)
                out[...] = 0
                return out
            if size is None:  # a scalar or a draw shaped by array arguments: small, keep it real
                return self._real(name)(*args, **kwargs)
            dtype = kwargs.get("dtype")
            if dtype is None and name in _DTYPE_FOLLOWS_SIZE and len(args) > position + 1:
                dtype = args[position + 1]
            dtype = np.float64 if dtype is None else dtype
            self._charge(name, _count(size), dtype)
            return placeholder(size, dtype)

        return draw


class _Limit:
    """The block of :func:`limit_allocations` (a class: a generator-based context costs as much as the swaps)."""

    def __init__(self, budget: RebuildBudget, source: str) -> None:
        self._guard = GuardedGenerator(budget, source)
        self._swap = nf_random.using_generator(cast(np.random.Generator, self._guard))  # it has the same methods
        self._arrays = numpy_allocations.charged_to(budget.charge_array)
        self._errors = np.errstate(all="ignore")  # initialisers dividing by norms of zeros: the values are discarded

    def __enter__(self) -> GuardedGenerator:
        self._swap.__enter__()
        self._errors.__enter__()
        self._arrays.__enter__()
        return self._guard

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        try:
            self._arrays.__exit__(kind, error, traceback)
            self._errors.__exit__(kind, error, traceback)
        finally:
            self._swap.__exit__(kind, error, traceback)


def limit_allocations(budget: RebuildBudget, source: str) -> AbstractContextManager[GuardedGenerator]:
    """Within the block, every array numpy makes in this thread and every random draw is charged to ``budget``.

    :func:`neuroflow.random.generator` is a :class:`GuardedGenerator` (in this
    thread only), and numpy refuses an array the budget cannot pay with
    MemoryError; ``budget.refused`` says what was refused. ``source`` names the
    file in the errors.
    """
    return _Limit(budget, source)
