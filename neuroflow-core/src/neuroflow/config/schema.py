"""What a config file may hold: the keys of each table, their types, and the checks that name what is valid."""

from __future__ import annotations

import inspect
import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from neuroflow import registry
from neuroflow.errors import ConfigError, NeuroFlowError
from neuroflow.trainer.options import config_keys

if TYPE_CHECKING:
    from neuroflow.data.dataset import DatasetSource

#: Top-level keys: the Trainer's options (:class:`~neuroflow.trainer.TrainerOptions`), plus ``epochs`` for ``fit``
#: and ``validate`` (true: ``neuroflow train`` reports the held-out split's metrics after every epoch).
TRAINER_KEYS: dict[str, type] = {**config_keys(), "epochs": int, "validate": bool}
TABLES = ("model", "data", "loss", "optimizer", "scheduler", "lora", "output")
MODEL_KEYS: dict[str, type] = {"name": str, "layers": list, "from": str, "input_shape": list}
#: ``[data]`` with arrays from .npz files; with ``dataset = "<name>"`` the keys are the data set's own (``dataset_source``).
NPZ_KEYS: dict[str, type] = {"train": str, "test": str}
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


def is_path(hint: Any) -> bool:
    """Whether a parameter annotation asks for a file-system path (``os.PathLike``, ``Path``, or a union with one)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return any(is_path(a) for a in typing.get_args(hint))
    origin = typing.get_origin(hint) or hint
    return isinstance(origin, type) and issubclass(origin, os.PathLike)


def simple_type(hint: Any) -> type | None:
    """The one scalar type a parameter annotation asks for (``int``, ``float | None`` → float), else None.

    A path (``str | os.PathLike[str] | None``) is a string in a TOML file.
    """
    if is_path(hint):
        return str
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return simple_type(args[0]) if len(args) == 1 else None
    return hint if hint in (int, float, bool, str) else None


def _hints(factory: Any) -> dict[str, Any]:
    try:
        target = factory.__init__ if inspect.isclass(factory) else factory
        return typing.get_type_hints(target)
    except Exception:  # annotations naming types that only exist for type checkers
        return {}


def call_checked(where: str, factory: Any, kwargs: dict[str, Any], selector: str = "type") -> Any:
    """``factory(**kwargs)`` after checking the keys and scalar types against its signature.

    A ``*args`` parameter is given as an array under its name: ``Reshape(*shape)`` takes ``shape = [1, 28, 28]``.
    ``selector`` is the key that chose ``factory``, listed first among the valid keys.
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
        valid = [selector, *(p.name for p in named), *([star] if star else [])]
        for key in kwargs:
            if key not in valid and not takes_any:
                raise ConfigError(f"unknown key {key!r} in {where}; valid keys: {', '.join(valid)}")
        if star is not None and star in kwargs:
            check_type(where, star, kwargs[star], list)
            args = kwargs.pop(star)
        hints = _hints(factory)
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


def dataset_source(data: dict[str, Any], path: Callable[[str], Path] | None = None) -> DatasetSource:
    """The ``neuroflow_datasets`` entry ``[data] dataset`` names, built from the table's other keys.

    Its keys and their types are checked against the entry's constructor (a
    :class:`~neuroflow.data.dataset.DatasetSource`), which checks their values
    and reads no data. With ``path``, the path-typed keys are resolved by it
    (against the config file's directory); without, they stay as written (to
    check a config when it is read). Raises ConfigError.
    """
    name = data["dataset"]
    check_type("[data]", "dataset", name, str)
    try:
        source = registry.datasets.get(name)
    except NeuroFlowError as exc:
        raise ConfigError(f"[data] dataset: {exc}") from exc
    options = {key: value for key, value in data.items() if key != "dataset"}
    if path is not None:
        hints = _hints(source)
        options = {key: str(path(value)) if is_path(hints.get(key)) and isinstance(value, str) else value
                   for key, value in options.items()}
    return call_checked("[data]", source, options, selector="dataset")
