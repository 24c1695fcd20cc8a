"""The ``[loss]``, ``[optimizer]`` and ``[scheduler]`` tables: ``type = "..."`` named, built from the other keys.

A loss is a class of :mod:`neuroflow.losses` or one a plugin registers in the
``neuroflow_losses`` entry-point group (a detector's ``DetectionLoss``, in
neuroflow-ops-vision)::

    [project.entry-points.neuroflow_losses]
    DetectionLoss = "neuroflow_ops_vision.detection.loss:DetectionLoss"

A loss class with a ``for_model(model, **options)`` class method takes part of
its configuration from the model (a detector's anchors, stride and number of
classes): the config calls it with the model being trained and the table's
other keys, so the table holds only what the model does not say.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import typing
from typing import Any

from neuroflow import registry
from neuroflow.config.schema import COMPONENTS, call_checked, match_name
from neuroflow.errors import ConfigError, NeuroFlowError, UnknownNameError


def _core_classes(table: str) -> dict[str, Any]:
    module_name, bases = COMPONENTS[table]
    module = importlib.import_module(module_name)
    return {n: getattr(module, n) for n in getattr(module, "__all__", dir(module))
            if inspect.isclass(getattr(module, n, None)) and n not in bases}


def component_class(table: str, type_name: str) -> Any:
    """The class ``[table] type = type_name`` names (case aside); a loss may come from a plugin.

    Raises UnknownNameError listing the names available (and, for a known
    plugin loss that is not installed, the distribution to install).
    """
    classes = _core_classes(table)
    plugin_names = registry.losses.names() if table == "loss" else []
    name = match_name(type_name, [*classes, *plugin_names])
    if name is None:
        provider = registry.losses.provider(type_name) if table == "loss" else None
        raise UnknownNameError(f"[{table}] type", type_name, [*classes, *plugin_names], provider)
    if name in classes:
        return classes[name]
    try:
        return registry.losses.get(name)
    except NeuroFlowError as exc:
        raise ConfigError(f"[{table}] type: {exc}") from exc


def build_component(table: str, spec: dict[str, Any], model: Any = None) -> Any:
    """The object ``spec`` (a ``[table]`` with ``type``) describes; a loss with ``for_model`` is given ``model``."""
    cls = component_class(table, spec["type"])
    options = {key: value for key, value in spec.items() if key != "type"}
    where = f"[{table}] ({cls.__name__})"
    factory = getattr(cls, "for_model", None)
    if table == "loss" and callable(factory):
        if model is None:
            raise ConfigError(f"{where}: this loss is built from the model it trains (its for_model); "
                              "build the model first and pass it (Config.build_loss(model))")
        return call_checked(where, _bound(factory, model), options)
    return call_checked(where, cls, options)


def _bound(factory: Any, model: Any) -> Any:
    """``factory`` with ``model`` as its first argument, keeping the signature and annotations of the rest
    (so the table's keys are checked against them)."""
    bound = functools.partial(factory, model)
    try:
        hints = typing.get_type_hints(factory)
    except Exception:  # annotations naming types that only exist for type checkers
        hints = {}

    def build(**options: Any) -> Any:
        return bound(**options)

    build.__signature__ = inspect.signature(bound)  # type: ignore[attr-defined]
    build.__annotations__ = hints
    return build
