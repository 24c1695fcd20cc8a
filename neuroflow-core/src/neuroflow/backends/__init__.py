"""Backends: array namespace, host/device copies, synchronisation and memory counters."""

from neuroflow.backends.base import Backend
from neuroflow.backends.selection import available_backends, get_backend

__all__ = ["Backend", "available_backends", "get_backend"]
