"""Argument types shared by several commands."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An argparse type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number; got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number; got {text}")
    return value


def sample_shape_arg(text: str) -> tuple[int, ...]:
    """An argparse type: one sample's shape as comma-separated positive integers (``3,32,32``)."""
    try:
        shape = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas (3,32,32); got {text!r}") from None
    if any(s < 1 for s in shape):
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas (3,32,32); got {text!r}")
    return shape
