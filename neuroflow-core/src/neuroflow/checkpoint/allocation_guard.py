"""A stand-in for the process generator while a model is rebuilt from a file's topology.

Rebuilding runs op constructors, and a constructor allocates what its config
asks for: a hostile file of a few bytes could say ``Linear(10**6, 10**6)``.
Ops initialise their parameters from :func:`neuroflow.random.generator`, so
while a topology is rebuilt that generator is replaced by :class:`GuardedGenerator`,
which counts the values requested and refuses a request that would exceed the
budget (a small multiple of what the file actually holds) *before* the array
exists.

Every parameter and buffer is overwritten from the file afterwards (the
loader checks that each one is), so the stand-in returns zeros instead of
random numbers for continuous distributions: rebuilding a model then costs a
fraction of a random initialisation. Integer draws (seeds, permutations) still
come from a real generator with a fixed seed, and the process generator the
user seeded is left exactly where it was.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from neuroflow.checkpoint.errors import CheckpointError

#: Position of the ``size`` argument of numpy Generator methods whose values are only initial guesses.
_CONTINUOUS = {
    "random": 0, "standard_normal": 0, "standard_exponential": 0, "standard_cauchy": 0,
    "uniform": 2, "normal": 2, "laplace": 2, "lognormal": 2, "gamma": 2, "beta": 2,
    "exponential": 1, "standard_gamma": 1, "standard_t": 1,
}
_DTYPE_FOLLOWS_SIZE = {"random", "standard_normal", "standard_exponential", "standard_gamma"}
#: Initialisers may draw more than they keep (rejection sampling, QR of a square draw): the budget is this
#: many times the values the file holds, plus a fixed allowance.
_BUDGET_FACTOR, _BUDGET_ALLOWANCE = 2, 1 << 20
#: The same for draws that keep their real values (seeds, shuffles, discrete distributions).
_DISCRETE = {"integers": 2, "choice": 1, "binomial": 2, "poisson": 1, "bytes": 0, "multivariate_normal": 2}


def _count(size: Any) -> int:
    if size is None:
        return 1
    if isinstance(size, int | np.integer):
        return max(int(size), 0)
    try:
        return math.prod(max(int(s), 0) for s in size)
    except (TypeError, ValueError):
        return 1  # not a size numpy accepts either; let numpy raise its own error


class GuardedGenerator:
    """Looks like a ``numpy.random.Generator``; refuses draws far beyond the ``held`` values a file holds."""

    def __init__(self, held: int, source: str) -> None:
        self._inner: np.random.Generator | None = None  # made on the first draw: creating one costs 0.1 ms
        self._held = held
        self._left = _BUDGET_FACTOR * held + _BUDGET_ALLOWANCE
        self._source = source

    def _charge(self, method: str, count: int) -> None:
        self._left -= count
        if self._left < 0:
            raise CheckpointError(
                f"{self._source}: the topology asks for {count} more initial values ({method}) than a file holding "
                f"{self._held} values can fill; the file is corrupt or hostile, refusing to allocate them"
            )

    def _real(self, name: str) -> Any:
        if self._inner is None:
            self._inner = np.random.default_rng(0)
        return getattr(self._inner, name)

    def __getattr__(self, name: str) -> Any:
        if name in _CONTINUOUS:
            return self._zeros(name, _CONTINUOUS[name])
        attribute = self._real(name)
        if not callable(attribute):
            return attribute
        position = _DISCRETE.get(name)

        def draw(*args: Any, **kwargs: Any) -> Any:
            if name == "permutation" and args and isinstance(args[0], int | np.integer):
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
                self._charge(name, int(out.size))
                out[...] = 0
                return out
            if size is None:  # a scalar or a draw shaped by array arguments: small, keep it real
                return self._real(name)(*args, **kwargs)
            self._charge(name, _count(size))
            dtype = kwargs.get("dtype")
            if dtype is None and name in _DTYPE_FOLLOWS_SIZE and len(args) > position + 1:
                dtype = args[position + 1]
            return np.zeros(size, dtype=np.float64 if dtype is None else dtype)

        return draw


@contextmanager
def limit_random_draws(held: int, source: str) -> Iterator[GuardedGenerator]:
    """Within the block, :func:`neuroflow.random.generator` is a :class:`GuardedGenerator` for a file of ``held`` values.

    Not thread-safe: another thread drawing from the process generator meanwhile draws from the stand-in.
    """
    from neuroflow import random as nf_random

    saved = nf_random._generator
    guard = GuardedGenerator(held, source)
    nf_random._generator = guard  # type: ignore[assignment]
    try:
        with np.errstate(all="ignore"):  # initialisers dividing by norms of zeros: the values are discarded
            yield guard
    finally:
        nf_random._generator = saved
