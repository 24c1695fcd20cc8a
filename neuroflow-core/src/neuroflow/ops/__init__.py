"""Operators, resolved by name through the ``neuroflow_ops`` entry points.

``ops.Linear`` is the core's; ``ops.Conv2d`` is found once neuroflow-ops-vision
is installed, without importing it here. A missing op names the distribution
that provides it.
"""

from __future__ import annotations

from typing import Any

from neuroflow import registry
from neuroflow.errors import UnknownNameError


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return registry.ops.get(name)
    except UnknownNameError as exc:
        raise AttributeError(str(exc)) from exc


def __dir__() -> list[str]:
    return registry.ops.names()
