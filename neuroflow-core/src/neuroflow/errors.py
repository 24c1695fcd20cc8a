"""Exceptions a user of NeuroFlow can meet, each saying what was expected and what to do."""

from __future__ import annotations

from typing import Any


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


class PluginHookError(NeuroFlowError, RuntimeError):
    """A plugin's hook implementation raised; names the plugin, its distribution and the hook, and chains the error."""

    def __init__(self, plugin: str, distribution: str | None, hook: str, error: BaseException):
        self.plugin, self.distribution, self.hook, self.error = plugin, distribution, hook, error
        where = f"distribution {distribution}" if distribution else "registered at run time"
        remedy = (f"fix or uninstall {distribution} (NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD=1 runs without plugins)"
                  if distribution else "fix the plugin or unregister it")
        super().__init__(f"plugin {plugin!r} ({where}) raised in {hook}: {type(error).__name__}: {error}; {remedy}")


class PluginWarning(UserWarning):
    """A plugin failed or was refused where raising would break the caller: a ``neuroflow_train_end`` hook that
    raised after training, a distribution refused a name another one already provides."""


class BackendUnavailableError(NeuroFlowError, RuntimeError):
    """A backend is installed but cannot run here (no driver, no device)."""


class NonFiniteLossError(NeuroFlowError, FloatingPointError):
    """Training produced a NaN or infinite loss; carries the step at which it happened.

    ``checkpoint`` is the checkpoint to resume from (the run's newest good
    one) when the trainer writes checkpoints, else None.
    """

    checkpoint: Any = None

    def __init__(self, step: int, loss: float, layer: str | None = None):
        self.step, self.loss, self.layer = step, loss, layer
        where = f" (first non-finite output in layer {layer})" if layer else ""
        super().__init__(
            f"loss became {loss} at step {step}{where}; training stopped. "
            "The batch's data are finite (NonFiniteDataError says when they are not): the model diverged. "
            "Lower the learning rate or enable gradient clipping (clip_grad_norm=1.0)."
        )

    def name_checkpoint(self, checkpoint: Any, directory: Any) -> None:
        """Add to the message the checkpoint to resume from (``checkpoint``, or that ``directory`` has no good one)."""
        if directory is None or self.checkpoint is not None:
            return
        self.checkpoint = checkpoint
        if checkpoint is None:
            note = (f"No checkpoint of this run in {directory} is good: the loss exploded from the first ones on "
                    "(neuroflow.checkpoint.divergence); start again with a lower lr.")
        else:
            note = (f"The newest good checkpoint is {checkpoint}: resume from it, with a lower lr, by "
                    f"trainer.resume({str(checkpoint)!r}) on a trainer built with the lower lr.")
        self.args = (f"{self.args[0]} {note}", *self.args[1:])


class NonFiniteDataError(NonFiniteLossError):
    """The loss is not finite because a training batch holds NaN or Inf: the data's fault, not a layer's.

    ``which`` is ``"inputs"`` or ``"targets"``; ``micro_batch`` counts from 0
    within the step (of ``micro_batches``); ``samples`` are the rows of that
    micro-batch holding a non-finite value, ``count`` how many values are not
    finite.
    """

    def __init__(self, step: int, loss: float, which: str, micro_batch: int, micro_batches: int,
                 samples: list[int], count: int, where: str | None = None):
        super().__init__(step, loss)
        self.which, self.micro_batch, self.micro_batches = which, micro_batch, micro_batches
        self.samples, self.count = samples, count
        if where is None:  # ``where`` names the rows' batch otherwise (a data-parallel rank's share of it)
            where = "the batch" if micro_batches == 1 else f"micro-batch {micro_batch} of {micro_batches}"
        rows = ", ".join(map(str, samples[:5])) + (", ..." if len(samples) > 5 else "")
        self.args = (
            f"loss became {loss} at step {step} because the training {which} hold NaN/Inf: {count} value(s), "
            f"in sample(s) {rows} of {where} (counting from 0); training stopped. The data are at fault, not a "
            f"layer: ~np.isfinite(data).reshape(len(data), -1).all(axis=1) finds the samples to fix or drop.",
        )


class ConfigError(NeuroFlowError, ValueError):
    """A configuration file or Trainer argument is invalid."""


class OutOfMemoryError(NeuroFlowError, MemoryError):
    """A memory pool or budget cannot hold what a training step needs."""


class TrainerInUseError(NeuroFlowError, RuntimeError):
    """A thread asked a Trainer to train (``fit``, ``train_step``, ``resume``, ``save_checkpoint``) while another
    thread is training it: one thread trains a trainer at a time."""
