"""NeuroFlow: a memory-aware neural-network training runtime for ordinary hardware.

Submodules load on first use so ``import neuroflow`` stays fast. Imported
before numpy (as the spec's snippet does), it shortens how long OpenBLAS's
idle threads spin (:mod:`neuroflow.blas_idle`), unless the user set that.
"""

from __future__ import annotations

import importlib
from typing import Any

from neuroflow import blas_idle
from neuroflow.version import __version__ as __version__

blas_idle.prepare()  # numpy is not imported by this module: OpenBLAS reads the setting if numpy loads after it

_ATTRIBUTES = {
    "Tensor": "neuroflow.tensor",
    "Operator": "neuroflow.operator",
    "Sequential": "neuroflow.composites",
    "Residual": "neuroflow.composites",
    "Concat": "neuroflow.composites",
    "Trainer": "neuroflow.trainer",
    "manual_seed": "neuroflow.random",
    "get_backend": "neuroflow.backends.selection",
    "save": "neuroflow.checkpoint",
    "load": "neuroflow.checkpoint",
}
_SUBMODULES = {
    "ops", "losses", "optim", "schedulers", "data", "memory", "testing", "backends",
    "allocators", "registry", "errors", "hookspecs", "plugins", "debug", "lora", "checkpoint", "export",
}

__all__ = sorted([*_ATTRIBUTES, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    if name in _ATTRIBUTES:
        value = getattr(importlib.import_module(_ATTRIBUTES[name]), name)
        globals()[name] = value
        return value
    if name in _SUBMODULES:
        module = importlib.import_module(f"neuroflow.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'neuroflow' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
