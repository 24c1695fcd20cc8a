"""Exceptions a user of NeuroFlow can meet, each saying what was expected and what to do."""

from __future__ import annotations


class NeuroFlowError(Exception):
    """Base class of every error NeuroFlow raises on purpose."""


class ShapeError(NeuroFlowError, ValueError):
    """An operator got an input whose shape or dtype it cannot take."""


class UnknownNameError(NeuroFlowError, LookupError):
    """A backend, op, allocator or model name that no installed distribution provides."""

    def __init__(self, kind: str, name: str, available: list[str], provider: str | None = None):
        self.kind, self.name, self.available, self.provider = kind, name, available, provider
        message = f"unknown {kind} {name!r}; available: {', '.join(available) or 'none'}"
        if provider is not None:
            message = f"{kind} {name!r} is not installed; it comes with: pip install {provider}"
            message += f" (available: {', '.join(available) or 'none'})"
        super().__init__(message)

    def __str__(self) -> str:  # LookupError would otherwise quote the message
        return str(self.args[0])


class PluginLoadError(NeuroFlowError, ImportError):
    """A plugin's entry point was found but importing it failed."""


class BackendUnavailableError(NeuroFlowError, RuntimeError):
    """A backend is installed but cannot run here (no driver, no device)."""


class NonFiniteLossError(NeuroFlowError, FloatingPointError):
    """Training produced a NaN or infinite loss; carries the step at which it happened."""

    def __init__(self, step: int, loss: float, layer: str | None = None):
        self.step, self.loss, self.layer = step, loss, layer
        where = f" (first non-finite output in layer {layer})" if layer else ""
        super().__init__(
            f"loss became {loss} at step {step}{where}; training stopped. "
            "Lower the learning rate, enable gradient clipping (clip_grad_norm=1.0) "
            "or check the input data for NaN/Inf."
        )


class ConfigError(NeuroFlowError, ValueError):
    """A configuration file or Trainer argument is invalid."""


class OutOfMemoryError(NeuroFlowError, MemoryError):
    """A memory pool or budget cannot hold what a training step needs."""
