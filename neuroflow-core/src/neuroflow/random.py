"""Seeding: one process-wide generator that parameter initialisers and seeded ops draw from."""

from __future__ import annotations

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
