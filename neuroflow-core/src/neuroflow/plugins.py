"""The pluggy plugin manager, loading ``neuroflow_plugins`` entry points on first use, and the calls of their hooks.

A hook is called through :func:`call_hook`, so an implementation that
raises is named (plugin, distribution, hook) in a :class:`PluginHookError`
and recorded in :data:`hook_failures` for ``neuroflow plugins``.
"""

from __future__ import annotations

import sys
import warnings
from types import TracebackType
from typing import Any

import pluggy

from neuroflow import hookspecs, registry
from neuroflow.errors import PluginHookError, PluginLoadError, PluginWarning

_manager: pluggy.PluginManager | None = None

#: What each plugin's hooks raised in this process (plugin name -> "hook: Error: message", each once), for
#: ``neuroflow plugins``.
hook_failures: dict[str, list[str]] = {}


def plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager; a plugin that fails to load is reported and skipped."""
    global _manager
    if _manager is None:
        manager = pluggy.PluginManager("neuroflow")
        manager.add_hookspecs(hookspecs)
        for name in registry.plugins.names():
            try:
                manager.register(registry.plugins.get(name), name=name)
            except PluginLoadError as exc:  # the registry has recorded it
                print(f"neuroflow: skipping plugin {name!r}: {exc}", file=sys.stderr)
            except Exception as exc:  # pluggy refuses hooks that match no spec or take arguments the spec has not
                registry.plugins.failures[name] = f"{type(exc).__name__}: {exc}"
                print(f"neuroflow: skipping plugin {name!r}: {exc}", file=sys.stderr)
        _manager = manager
    return _manager


def reset_plugin_manager() -> None:
    """Forget the manager and the hook failures so the next use rediscovers plugins (tests)."""
    global _manager
    _manager = None
    hook_failures.clear()


def display_name(name: str, plugin: object) -> str:
    """How a plugin is named to a user: its entry-point name, else (registered without one) its module or class."""
    if name != str(id(plugin)):  # pluggy names a plugin registered without a name by its id
        return name
    return getattr(plugin, "__name__", None) or type(plugin).__name__


def hook_failed(name: str, plugin: object, hook: str, error: BaseException) -> PluginHookError:
    """The error for ``plugin``'s ``hook`` raising ``error``; recorded in :data:`hook_failures`."""
    shown = display_name(name, plugin)
    failures, failure = hook_failures.setdefault(shown, []), f"{hook}: {type(error).__name__}: {error}"
    if failure not in failures:  # each build of the CLI calls neuroflow_register_commands again
        failures.append(failure)
    return PluginHookError(shown, registry.plugins.distribution(name), hook, error)


def call_hook(hook: str, **arguments: Any) -> Any:
    """Call ``hook`` (pluggy's call: every implementation, in pluggy's order); one that raises is named.

    The error is a :class:`PluginHookError` chained to what the plugin raised.
    """
    caller = getattr(plugin_manager().hook, hook)
    if not caller.get_hookimpls():  # what pluggy's call gives when nothing implements it, without its work
        return None if caller.spec is not None and caller.spec.opts.get("firstresult") else []
    try:
        return caller(**arguments)
    except Exception as exc:
        impl = _raised_in(caller.get_hookimpls(), exc.__traceback__)
        if impl is None:  # not a plugin's code (pluggy's own check of the arguments)
            raise
        raise hook_failed(impl.plugin_name, impl.plugin, hook, exc) from exc


def _raised_in(impls: list[Any], tb: TracebackType | None) -> Any:
    """The implementation an exception came from: the outermost frame of its traceback running one's code."""
    by_code: dict[Any, list[Any]] = {}
    for impl in impls:
        code = getattr(impl.function, "__code__", None)
        if code is not None:
            by_code.setdefault(code, []).append(impl)
    while tb is not None:
        candidates = by_code.get(tb.tb_frame.f_code)
        if candidates:  # one class's method registered twice: the instance the frame ran on
            owner = tb.tb_frame.f_locals.get("self")
            return next((impl for impl in candidates if impl.plugin is owner), candidates[0])
        tb = tb.tb_next
    return None


def end_training(trainer: Any, history: Any, failure: BaseException | None = None) -> None:
    """Call ``neuroflow_train_end`` without letting a plugin's failure replace how the run ended.

    ``failure`` is what stopped training, if anything; the caller raises it
    on. A hook that raises is warned about (:class:`PluginWarning`) and kept
    in ``history.hook_errors``, so the finished run's History is still
    returned; after a training error it is also added to that error as a note.
    """
    try:
        call_hook("neuroflow_train_end", trainer=trainer, history=history)
    except Exception as error:
        history.hook_errors.append(error)
        warnings.warn(str(error), PluginWarning, stacklevel=2)
        if failure is not None:
            failure.add_note(f"then, as training ended: {error}")
