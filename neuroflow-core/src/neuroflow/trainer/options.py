"""TrainerOptions: every setting of a Trainer, typed and checked in one place.

``Trainer(model, batch_size=32, ...)``, a TOML config's top-level keys and
the command line's flags all become one ``TrainerOptions``; the config
schema reads its fields (name, type, whether a config may set it) from here.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from neuroflow.errors import ConfigError


def _setting(default: Any, *, in_config: bool = True) -> Any:
    """A field; ``in_config=False`` for what only Python can give (a callable, an object)."""
    return field(default=default, metadata={"in_config": in_config})


@dataclass(frozen=True)
class TrainerOptions:
    """What a Trainer is asked to do; see :class:`neuroflow.Trainer` for what each setting means.

    ``batch_size`` and ``gradient_accumulation_steps`` are what was asked:
    a memory budget may choose others, which the trainer reports as its own
    ``batch_size`` and ``gradient_accumulation_steps``.
    """

    device: Any = _setting(None)
    batch_size: int = _setting(64)
    gradient_accumulation_steps: int = _setting(1)
    clip_grad_norm: float | None = _setting(None)
    seed: int | None = _setting(None)
    shuffle: bool = _setting(True)
    debug: bool = _setting(False)
    progress: bool = _setting(True, in_config=False)
    allocator: str | None = _setting(None)
    memory_budget_mb: float | None = _setting(None)
    memory_pool_size_mb: float | None = _setting(None)
    enable_async_unload: bool = _setting(False)
    checkpoint_dir: str | os.PathLike[str] | None = _setting(None)
    checkpoint_every: int | None = _setting(None)
    keep_checkpoints: int = _setting(3)
    lora_fusion: bool = _setting(False)
    augment: Any = _setting(None, in_config=False)
    gradient_compression: Any = _setting(None)
    compression_ratio: float | None = _setting(None)
    compression_threshold: float | None = _setting(None)
    update_in_backward: bool = _setting(False)
    #: a steady step of a model whose ops can say which array calls they made (Linear, ReLU, Tanh, Sigmoid,
    #: Flatten, chains of them; CrossEntropy, MSE) is recorded, and later steps of the same shapes run those
    #: calls alone, bit for bit the same (neuroflow.replay); False: the ops run every step
    replay_steps: bool = _setting(True)
    #: optimisation steps a ``fit`` takes in all (as many epochs as that needs); None: ``epochs`` decides
    max_steps: int | None = _setting(None)
    #: data-parallel training: a communicator ("mpi", "nccl"; neuroflow-distributed), or "auto" (the launcher's)
    distributed: str | None = _setting(None)
    #: the gradient buckets allreduced during backward, in MiB (default: neuroflow.trainer.data_parallel's)
    bucket_mb: float | None = _setting(None)
    #: BatchNorm's batch statistics over every rank's rows (PyTorch's SyncBatchNorm); False: each rank's own
    sync_batchnorm: bool = _setting(False)

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(TrainerOptions)
        for option in dataclasses.fields(self):
            value = getattr(self, option.name)
            if not _matches(hints[option.name], value):
                raise ConfigError(f"{option.name} must be {_describe(hints[option.name])}; "
                                  f"got {value!r} ({type(value).__name__})")
        for name in ("batch_size", "gradient_accumulation_steps", "keep_checkpoints"):
            value = getattr(self, name)
            if value < 1:
                raise ConfigError(f"{name} must be a positive integer; got {value!r}")
        every = self.checkpoint_every
        if every is not None and every < 1:
            raise ConfigError(f"checkpoint_every must be a positive integer (steps); got {every!r}")
        if every is not None and self.checkpoint_dir is None:
            raise ConfigError("checkpoint_every needs checkpoint_dir: where to write the checkpoints")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be a positive integer (optimisation steps); got {self.max_steps!r}")
        for name in ("clip_grad_norm", "memory_budget_mb", "memory_pool_size_mb", "bucket_mb"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"{name} must be a positive finite number; got {value!r}")
        if self.augment is not None and not callable(self.augment):
            raise ConfigError(f"augment must be callable (a batch of inputs -> augmented inputs); got {self.augment!r}")

    @classmethod
    def from_arguments(cls, arguments: dict[str, Any]) -> TrainerOptions:
        """Options from keyword arguments; an unknown one is named with the valid ones."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(arguments) - names)
        if unknown:
            raise TypeError(f"Trainer got unknown argument(s) {', '.join(map(repr, unknown))}; "
                            f"valid: {', '.join(sorted(names))}")
        return cls(**arguments)

    @property
    def allocator_name(self) -> str:
        """The allocator asked for: the option, else ``NEUROFLOW_ALLOCATOR``, else the planned arena."""
        return self.allocator or os.environ.get("NEUROFLOW_ALLOCATOR") or "arena"


def _matches(hint: Any, value: Any) -> bool:
    """Whether ``value`` is what the type hint says: ``bool`` is not an ``int``, a string is not a number."""
    if hint is Any:
        return True
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(_matches(arg, value) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:  # an int is a float too (PEP 484's numeric tower), numpy's float32 as well
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, typing.get_origin(hint) or hint)


def _describe(hint: Any) -> str:
    """A type hint in words, for an error: ``int | None`` -> "an integer or None"."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " or ".join(_describe(arg) for arg in typing.get_args(hint))
    names = {type(None): "None", bool: "True or False", int: "an integer", float: "a number", str: "a string",
             os.PathLike: "a path"}
    return names.get(typing.get_origin(hint) or hint, getattr(hint, "__name__", str(hint)))


def config_keys() -> dict[str, type]:
    """The options a config file (or a command-line flag) may set, with the TOML type each takes."""
    hints = typing.get_type_hints(TrainerOptions)
    keys: dict[str, type] = {}
    for option in dataclasses.fields(TrainerOptions):
        if option.metadata.get("in_config", True):
            keys[option.name] = _toml_type(hints[option.name])
    return keys


def _toml_type(hint: Any) -> type:
    """``int | None`` -> int; a path or a free choice (device, compression) is written as a string."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
    return hint if hint in (bool, int, float) else str
