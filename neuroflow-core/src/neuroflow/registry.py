"""Entry-point registries: backends, ops, allocators, models, datasets, losses, ONNX converters and plugins, loaded only when used."""

from __future__ import annotations

import os
import warnings
from importlib import metadata
from typing import Any

from neuroflow.errors import PluginLoadError, PluginWarning, UnknownNameError

CORE_DISTRIBUTION = "neuroflow-core"

#: The one table of names this project's distributions provide, so an error for a name that is not
#: installed can say what to install rather than only what is missing. tests/core/test_registry.py checks
#: it against the entry points the installed distributions declare.
KNOWN_PROVIDERS: dict[str, dict[str, str]] = {
    "neuroflow_backends": {"cuda": "neuroflow-cuda", "opencl": "neuroflow-opencl"},
    "neuroflow_ops": {
        **{name: "neuroflow-ops-vision" for name in (
            "Conv2d", "DepthwiseConv2d", "SeparableConv2d", "BatchNorm2d", "MaxPool2d", "AvgPool2d",
            "GlobalAvgPool2d", "SqueezeExcite", "Upsample", "ChannelConcat", "ConvertLayout", "BasicBlock", "ResNet",
            "YoloLite",
        )},
        **{name: "neuroflow-ops-recurrent" for name in ("Elman", "WaveletElman", "GRU", "LSTM")},
    },
    "neuroflow_models": {name: "neuroflow-ops-vision" for name in ("resnet18", "neuroflow_cnn", "yolo_lite")},
    "neuroflow_datasets": {"sunspots": "neuroflow-ops-recurrent", "digit_canvases": "neuroflow-ops-vision"},
    "neuroflow_losses": {"DetectionLoss": "neuroflow-ops-vision"},
    "neuroflow_allocators": {},
    "neuroflow_communicators": {"mpi": "neuroflow-distributed", "nccl": "neuroflow-distributed"},
    "neuroflow_plugins": {},
}


def autoload_disabled() -> bool:
    """True when ``NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD`` asks for the core's own entries only."""
    return os.environ.get("NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD", "") not in ("", "0", "false", "False")


class Registry:
    """One entry-point group: names are read from metadata; an entry is imported on first ``get``."""

    def __init__(self, group: str, kind: str) -> None:
        self.group = group
        self.kind = kind
        self._entry_points: dict[str, metadata.EntryPoint] | None = None
        self._loaded: dict[str, Any] = {}
        self._local: dict[str, Any] = {}
        self._errors: dict[str, PluginLoadError] = {}
        self.failures: dict[str, str] = {}
        #: name -> the distributions refused it because another provides it (see :meth:`_discover`)
        self.conflicts: dict[str, list[str]] = {}

    def _discover(self) -> dict[str, metadata.EntryPoint]:
        """Each name's entry point; a name two distributions declare goes to the first provider: the core,
        then the distribution :data:`KNOWN_PROVIDERS` names for it, then the others by name. The rest are
        refused, recorded in :attr:`conflicts` and warned about, so installing a distribution can never
        replace (or break) a name another one provides."""
        if self._entry_points is None:
            disabled = autoload_disabled()
            declared: dict[str, list[metadata.EntryPoint]] = {}
            for ep in metadata.entry_points(group=self.group):
                if disabled and _dist(ep) != CORE_DISTRIBUTION:
                    continue
                declared.setdefault(ep.name, []).append(ep)
            found: dict[str, metadata.EntryPoint] = {}
            self.conflicts = {}
            for name, eps in declared.items():
                eps.sort(key=lambda ep: self._precedence(name, ep))
                found[name] = eps[0]
                keeper = _dist(eps[0])
                refused = sorted({_dist(ep) for ep in eps} - {keeper})  # one distribution seen twice is no conflict
                if refused:
                    self.conflicts[name] = refused
                    warnings.warn(f"{self.kind} {name!r} of {', '.join(refused)} is refused: {keeper} already "
                                  f"provides it (uninstall one; `neuroflow plugins` lists the conflicts)",
                                  PluginWarning, stacklevel=2)
            self._entry_points = found
        return self._entry_points

    def _precedence(self, name: str, ep: metadata.EntryPoint) -> tuple[int, str]:
        dist = _dist(ep)
        rank = 0 if dist == CORE_DISTRIBUTION else 1 if dist == self.provider(name) else 2
        return rank, dist

    def register(self, name: str, obj: Any) -> None:
        """Add an entry at run time (tests, notebooks); it shadows an entry point of the same name."""
        self._local[name] = obj

    def unregister(self, name: str) -> None:
        self._local.pop(name, None)
        self._loaded.pop(name, None)

    def registered_at_run_time(self, name: str) -> bool:
        """Whether ``name`` comes from ``register`` (a class another process cannot find by entry point)."""
        return name in self._local

    def names(self) -> list[str]:
        return sorted(set(self._discover()) | set(self._local))

    def distribution(self, name: str) -> str | None:
        """The distribution whose entry point provides ``name``; None for a name registered at run time."""
        ep = self._discover().get(name)
        return ep.dist.name if ep is not None and ep.dist is not None else None

    def provider(self, name: str) -> str | None:
        """The distribution to install for ``name`` when it is not installed, from :data:`KNOWN_PROVIDERS`."""
        return KNOWN_PROVIDERS.get(self.group, {}).get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._local or name in self._discover()

    def get(self, name: str) -> Any:
        """The object registered under ``name``, importing its distribution on first use."""
        if name in self._local:
            return self._local[name]
        if name in self._loaded:
            return self._loaded[name]
        ep = self._discover().get(name)
        if ep is None:
            provider = self.provider(name)
            available = [n for n in self.names() if n not in self.failures]
            raise UnknownNameError(self.kind, name, available, provider)
        if name in self._errors:  # imported once: a module that failed is not run again
            raise self._errors[name]
        try:
            obj = ep.load()
        except (Exception, SystemExit) as exc:  # a broken plugin (one calling sys.exit too) must not break the caller
            self.failures[name] = f"{type(exc).__name__}: {exc}"
            error = PluginLoadError(f"{self.kind} {name!r} from {_dist(ep)} failed to load: {type(exc).__name__}: {exc}")
            self._errors[name] = error
            raise error from exc
        self._loaded[name] = obj
        return obj

    def load_all(self) -> dict[str, Any]:
        """Import every entry, recording failures instead of raising (used by ``neuroflow plugins``)."""
        loaded = {}
        for name in self.names():
            try:
                loaded[name] = self.get(name)
            except PluginLoadError:
                continue
        return loaded

    def reset(self) -> None:
        """Forget discovered and loaded entries (tests that fake entry points call this)."""
        self._entry_points = None
        self._loaded.clear()
        self._errors.clear()
        self.failures.clear()
        self.conflicts.clear()


def _dist(ep: metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "?"


backends = Registry("neuroflow_backends", "backend")
ops = Registry("neuroflow_ops", "op")
allocators = Registry("neuroflow_allocators", "allocator")
models = Registry("neuroflow_models", "model")
datasets = Registry("neuroflow_datasets", "dataset")
#: losses beyond :mod:`neuroflow.losses` (a detector's), named by ``[loss] type`` in a config
losses = Registry("neuroflow_losses", "loss function")
onnx_converters = Registry("neuroflow_onnx", "ONNX converter")
#: data-parallel communicators (neuroflow-distributed's ``mpi`` and ``nccl``), named by ``Trainer(distributed=...)``
communicators = Registry("neuroflow_communicators", "communicator")
plugins = Registry("neuroflow_plugins", "plugin")

ALL = (backends, ops, allocators, models, datasets, losses, onnx_converters, communicators, plugins)
