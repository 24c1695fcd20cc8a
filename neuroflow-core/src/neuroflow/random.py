"""Seeding: one process-wide generator that parameter initialisers and seeded ops draw from."""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType

import numpy as np

_generator = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Make parameter initialisation, dropout masks and shuffling reproducible from ``seed``."""
    global _generator
    _generator = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    """The process-wide generator (seeded with 0 until ``manual_seed`` is called)."""
    return _generator


def child_seed() -> int:
    """A fresh seed for a component that keeps its own generator (Dropout, DataLoader)."""
    return int(_generator.integers(0, 2**63 - 1))


def using_generator(gen: np.random.Generator) -> AbstractContextManager[np.random.Generator]:
    """Within the block, :func:`generator` returns ``gen``; the process generator comes back after, also on an error.

    ``gen`` is anything with ``numpy.random.Generator``'s methods (the checkpoint loader's stand-in, which
    refuses hostile allocations). Not thread-safe: another thread drawing from the process generator
    meanwhile draws from ``gen``.
    """
    return _UsingGenerator(gen)


class _UsingGenerator:
    """The block of :func:`using_generator` (a class: the loader enters one per rebuild, and a generator-based
    context would cost as much as the swap)."""

    def __init__(self, gen: np.random.Generator) -> None:
        self.gen = gen
        self.saved: np.random.Generator | None = None

    def __enter__(self) -> np.random.Generator:
        global _generator
        self.saved, _generator = _generator, self.gen
        return self.gen

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        global _generator
        if self.saved is not None:
            _generator, self.saved = self.saved, None
