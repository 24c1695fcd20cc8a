"""The pluggy plugin manager, loading ``neuroflow_plugins`` entry points on first use."""

from __future__ import annotations

import sys

import pluggy

from neuroflow import hookspecs, registry
from neuroflow.errors import PluginLoadError

_manager: pluggy.PluginManager | None = None


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager; a plugin that fails to load is reported and skipped."""
    global _manager
    if _manager is None:
        manager = pluggy.PluginManager("neuroflow")
        manager.add_hookspecs(hookspecs)
        for name in registry.plugins.names():
            try:
                manager.register(registry.plugins.get(name), name=name)
            except PluginLoadError as exc:
                print(f"neuroflow: skipping plugin {name!r}: {exc}", file=sys.stderr)
            except ValueError as exc:  # pluggy rejects hook implementations that match no spec
                registry.plugins.failures[name] = str(exc)
                print(f"neuroflow: skipping plugin {name!r}: {exc}", file=sys.stderr)
        _manager = manager
    return _manager


def reset_plugin_manager() -> None:
    """Forget the manager so the next use rediscovers plugins (tests)."""
    global _manager
    _manager = None
