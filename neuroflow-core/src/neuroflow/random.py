"""Seeding: one process-wide generator that parameter initialisers and seeded ops draw from."""

from __future__ import annotations

from contextlib import AbstractContextManager
from contextvars import ContextVar, Token
from types import TracebackType

import numpy as np

_generator = np.random.default_rng(0)
#: The generator of the innermost :func:`using_generator` block of this thread (context), None outside any.
_stand_in: ContextVar[np.random.Generator | None] = ContextVar("neuroflow_generator", default=None)


def manual_seed(seed: int) -> None:
    """Make parameter initialisation, dropout masks and shuffling reproducible from ``seed``."""
    global _generator
    _generator = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    """The process-wide generator (seeded with 0 until ``manual_seed`` is called), or this thread's stand-in."""
    stand_in = _stand_in.get()
    return _generator if stand_in is None else stand_in


def child_seed() -> int:
    """A fresh seed for a component that keeps its own generator (Dropout, DataLoader)."""
    return int(generator().integers(0, 2**63 - 1))


def using_generator(gen: np.random.Generator) -> AbstractContextManager[np.random.Generator]:
    """Within the block, :func:`generator` returns ``gen`` in this thread; the process generator comes back after.

    ``gen`` is anything with ``numpy.random.Generator``'s methods (the checkpoint loader's stand-in, which
    refuses hostile allocations). Other threads keep drawing from the process generator meanwhile.
    """
    return _UsingGenerator(gen)


class _UsingGenerator:
    """The block of :func:`using_generator` (a class: the loader enters one per rebuild, and a generator-based
    context would cost as much as the swap)."""

    def __init__(self, gen: np.random.Generator) -> None:
        self.gen = gen
        self.token: Token[np.random.Generator | None] | None = None

    def __enter__(self) -> np.random.Generator:
        self.token = _stand_in.set(self.gen)
        return self.gen

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.token is not None:
            _stand_in.reset(self.token)
            self.token = None
