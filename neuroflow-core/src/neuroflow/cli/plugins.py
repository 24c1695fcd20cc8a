"""``neuroflow plugins`` and ``neuroflow backends``: what each registry found, what failed and why."""

from __future__ import annotations

import argparse
import warnings
from importlib import metadata

from neuroflow import registry
from neuroflow.cli.table import format_table
from neuroflow.errors import PluginWarning
from neuroflow.plugins import display_name, hook_failures, plugin_manager

HELP = "list the installed backends, ops, allocators, models and plugins, and any that failed to load"
BACKENDS_HELP = "list the installed backends and whether each can run here"


def configure(parser: argparse.ArgumentParser) -> None:
    """Neither command takes arguments."""


def distribution(reg: registry.Registry, name: str) -> str:
    """``name-version`` of the distribution providing ``name``, or how it got into the registry."""
    dist = reg.distribution(name)
    return "(registered at run time)" if dist is None else _version(dist)


def _version(dist: str) -> str:
    try:
        return f"{dist} {metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return dist


def rows(reg: registry.Registry) -> list[list[str]]:
    """One row per entry: name, distribution, status: "ok", "FAILED: why" (at import, or in a hook in this
    process), or "REFUSED: ..." for a distribution refused a name another one already provides."""
    reg.load_all()
    table = [[name, distribution(reg, name), _status(reg, name)] for name in reg.names()]
    if reg is registry.plugins:  # hook plugins registered at run time (tests, notebooks) have hooks that can fail
        listed = set(reg.names())
        table += [[shown, "(registered at run time)", _hook_status(shown)]
                  for shown in sorted(display_name(name, plugin) for name, plugin in plugin_manager().list_name_plugin())
                  if shown not in listed]
    for name, refused in sorted(reg.conflicts.items()):
        table += [[name, _version(dist), f"REFUSED: {reg.distribution(name)} already provides {name!r}"]
                  for dist in refused]
    return table


def _status(reg: registry.Registry, name: str) -> str:
    if name in reg.failures:
        return f"FAILED: {reg.failures[name]}"
    return _hook_status(name) if reg is registry.plugins else "ok"


def _hook_status(name: str) -> str:
    failures = hook_failures.get(name)
    return f"FAILED in {'; '.join(failures)}" if failures else "ok"


def _backend_rows() -> list[list[str]]:
    table = rows(registry.backends)
    for row in table:
        if row[2] == "ok":
            try:
                available = bool(registry.backends.get(row[0]).is_available())
            except Exception as exc:  # a plugin's availability probe may fail in its own way
                available, row[2] = False, f"ok; is_available() raised {type(exc).__name__}: {exc}"
            row.append("available" if available else "not available here")
    return table


def _section(title: str, table: list[list[str]]) -> None:
    failed = sum(1 for row in table if row[2].startswith("FAILED"))
    refused = sum(1 for row in table if row[2].startswith("REFUSED"))
    summary = (f"{len(table) - refused} found" + (f", {failed} failed" if failed else "")
               + (f", {refused} refused" if refused else ""))
    print(f"{title} ({summary})")
    print(format_table(table) if table else "  (none)")


def run(args: argparse.Namespace) -> int:
    plugin_manager()  # registers hook plugins, recording those pluggy rejects among the failures
    with warnings.catch_warnings():  # the table shows the conflicts the registries warn about
        warnings.simplefilter("ignore", PluginWarning)
        for reg in registry.ALL:
            table = _backend_rows() if reg is registry.backends else rows(reg)
            _section(f"{reg.kind}s [{reg.group}]", table)
    if registry.autoload_disabled():
        print("NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD is set: only neuroflow-core's own entries are listed")
    return 0


def run_backends(args: argparse.Namespace) -> int:
    _section(f"backends [{registry.backends.group}]", _backend_rows())
    return 0
