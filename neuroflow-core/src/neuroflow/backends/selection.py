"""Choosing a backend by name: ``cpu``, ``cuda:0``, ``opencl:1``, ``auto``, or a third party's."""

from __future__ import annotations

import os
from functools import cache

from neuroflow import registry
from neuroflow.backends.auto import choose
from neuroflow.backends.base import Backend
from neuroflow.backends.qualification import resolve
from neuroflow.errors import BackendUnavailableError, ConfigError
from neuroflow.plugins import plugin_manager

ENV_VAR = "NEUROFLOW_BACKEND"


def parse_device(spec: str) -> tuple[str, int]:
    """Split ``"cuda:1"`` into ``("cuda", 1)``; a bare name means device 0."""
    name, _, index = spec.strip().partition(":")
    if not name:
        raise ConfigError(f"empty device name in {spec!r}; expected e.g. 'cpu', 'cuda:0', 'opencl:1'")
    if index and not index.isdigit():
        raise ConfigError(f"device index in {spec!r} must be a non-negative integer")
    return name, int(index or 0)


def available_backends() -> list[str]:
    return registry.backends.names()


@cache
def _instance(name: str, index: int) -> Backend:
    cls = registry.backends.get(name)
    if not cls.is_available():
        reason = cls.unavailable_reason()
        raise BackendUnavailableError(
            f"backend {name!r} is installed but cannot run here: {reason or 'no usable device'}. "
            "Run `neuroflow doctor` for details."
        )
    # name:index counts the qualified devices; a child process has trained on this one, so a driver that
    # crashes has crashed there, not here
    backend = cls(resolve(name, index))
    backend.selected_as = f"{name}:{index}"
    return backend


def cpu_backend() -> Backend:
    """The cpu backend, the default for operators used on their own."""
    return _instance("cpu", 0)


def get_backend(spec: str | Backend | None = None) -> Backend:
    """The backend for ``spec``; ``None`` reads ``NEUROFLOW_BACKEND`` and falls back to cpu."""
    if isinstance(spec, Backend):
        return spec
    if spec is None:
        spec = os.environ.get(ENV_VAR) or "cpu"
    name, index = parse_device(spec)
    if name == "auto":
        chosen = plugin_manager().hook.neuroflow_select_backend(available=available_backends())
        if chosen is None:
            chosen, _ = choose(available_backends())
        name = chosen
    return _instance(name, index)
