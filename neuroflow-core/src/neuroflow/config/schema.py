"""What a config file may hold: the keys of each table, their types, and the checks that name what is valid."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

from neuroflow.errors import ConfigError, NeuroFlowError

#: Top-level keys: the Trainer's keyword arguments, plus ``epochs`` for ``fit``.
TRAINER_KEYS: dict[str, type] = {
    "device": str,
    "batch_size": int,
    "epochs": int,
    "gradient_accumulation_steps": int,
    "clip_grad_norm": float,
    "seed": int,
    "shuffle": bool,
    "debug": bool,
    "allocator": str,
    "enable_async_unload": bool,
    "memory_pool_size_mb": float,
    "memory_budget_mb": float,
    "checkpoint_dir": str,
    "checkpoint_every": int,
    "keep_checkpoints": int,
    "lora_fusion": bool,
    "gradient_compression": str,
    "compression_ratio": float,
    "compression_threshold": float,
    "update_in_backward": bool,
}
#: Keys the memory runtime adds to the Trainer; passed on only when the Trainer accepts them.
MEMORY_RUNTIME_KEYS = frozenset({"enable_async_unload", "memory_pool_size_mb", "memory_budget_mb",
                                 "gradient_compression", "compression_ratio", "compression_threshold",
                                 "update_in_backward"})
TABLES = ("model", "data", "loss", "optimizer", "scheduler", "lora", "output")
MODEL_KEYS: dict[str, type] = {"name": str, "layers": list, "from": str, "input_shape": list}
DATA_KEYS: dict[str, type] = {"dataset": str, "flat": bool, "normalize": bool, "path": str, "train": str, "test": str,
                              "window": int, "horizon": int, "split": float}
IMAGE_DATASETS = ("mnist", "fashion_mnist")
SERIES_DATASETS = ("sunspots",)
DATASETS = IMAGE_DATASETS + SERIES_DATASETS
IMAGE_KEYS = ("flat", "normalize", "path")
SERIES_KEYS = ("window", "horizon", "split")
LORA_KEYS: dict[str, type] = {"rank": int, "alpha": float, "dropout": float, "targets": list}
OUTPUT_KEYS: dict[str, type] = {"save": str, "fuse": bool, "quantize": str}

#: Where ``type = ...`` of each component table is looked up, and the base classes that are not choices.
COMPONENTS: dict[str, tuple[str, frozenset[str]]] = {
    "loss": ("neuroflow.losses", frozenset({"Loss"})),
    "optimizer": ("neuroflow.optim", frozenset({"Optimizer"})),
    "scheduler": ("neuroflow.schedulers", frozenset({"Scheduler"})),
}

_TYPE_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               list: "an array", dict: "a table"}


def check_type(where: str, key: str, value: Any, expected: type) -> None:
    """Raise ConfigError unless ``value`` is a TOML value of ``expected`` (an integer is a valid number)."""
    if expected is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise ConfigError(f"{where}: {key!r} must be {_TYPE_NAMES[expected]}; got {value!r}")


def check_keys(where: str, table: dict[str, Any], valid: dict[str, type]) -> None:
    for key, value in table.items():
        if key not in valid:
            raise ConfigError(f"unknown key {key!r} in {where}; valid keys: {', '.join(valid)}")
        check_type(where, key, value, valid[key])


def simple_type(hint: Any) -> type | None:
    """The one scalar type a parameter annotation asks for (``int``, ``float | None`` → float), else None."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return simple_type(args[0]) if len(args) == 1 else None
    return hint if hint in (int, float, bool, str) else None


def call_checked(where: str, factory: Any, kwargs: dict[str, Any]) -> Any:
    """``factory(**kwargs)`` after checking the keys and scalar types against its signature.

    A ``*args`` parameter is given as an array under its name: ``Reshape(*shape)`` takes ``shape = [1, 28, 28]``.
    """
    args: list[Any] = []
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        params = None
    if params is not None:
        kwargs = dict(kwargs)
        named = [p for p in params.values() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        star = next((p.name for p in params.values() if p.kind is p.VAR_POSITIONAL), None)
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        valid = ["type", *(p.name for p in named), *([star] if star else [])]
        for key in kwargs:
            if key not in valid and not takes_any:
                raise ConfigError(f"unknown key {key!r} in {where}; valid keys: {', '.join(valid)}")
        if star is not None and star in kwargs:
            check_type(where, star, kwargs[star], list)
            args = kwargs.pop(star)
        try:
            target = factory.__init__ if inspect.isclass(factory) else factory
            hints = typing.get_type_hints(target)
        except Exception:  # annotations naming types that only exist for type checkers
            hints = {}
        for key, value in kwargs.items():
            expected = simple_type(hints.get(key))
            if expected is not None:
                check_type(where, key, value, expected)
        missing = [p.name for p in named if p.default is p.empty and p.name not in kwargs]
        if missing:
            raise ConfigError(f"{where}: missing required key(s) {', '.join(map(repr, missing))}")
    try:
        return factory(*args, **kwargs)
    except (NeuroFlowError, ValueError, TypeError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc


def match_name(name: str, available: list[str]) -> str | None:
    """``name`` itself, or the one available name equal to it ignoring case."""
    if name in available:
        return name
    matches = [a for a in available if a.lower() == name.lower()]
    return matches[0] if len(matches) == 1 else None
