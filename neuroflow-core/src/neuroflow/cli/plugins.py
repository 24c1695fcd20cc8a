"""``neuroflow plugins`` and ``neuroflow backends``: what each registry found, what failed and why."""

from __future__ import annotations

import argparse
from importlib import metadata

from neuroflow import registry
from neuroflow.cli.table import format_table
from neuroflow.plugins import plugin_manager

HELP = "list the installed backends, ops, allocators, models and plugins, and any that failed to load"
BACKENDS_HELP = "list the installed backends and whether each can run here"


def configure(parser: argparse.ArgumentParser) -> None:
    """Neither command takes arguments."""


def distribution(reg: registry.Registry, name: str) -> str:
    """``name-version`` of the distribution providing ``name``, or how it got into the registry."""
    dist = reg.distribution(name)
    if dist is None:
        return "(registered at run time)"
    try:
        return f"{dist} {metadata.version(dist)}"
    except metadata.PackageNotFoundError:
        return dist


def rows(reg: registry.Registry) -> list[list[str]]:
    """One row per entry: name, distribution, load status (failures with their reason)."""
    reg.load_all()
    return [
        [name, distribution(reg, name), f"FAILED: {reg.failures[name]}" if name in reg.failures else "ok"]
        for name in reg.names()
    ]


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
    summary = f"{len(table)} found" + (f", {failed} failed" if failed else "")
    print(f"{title} ({summary})")
    print(format_table(table) if table else "  (none)")


def run(args: argparse.Namespace) -> int:
    plugin_manager()  # registers hook plugins, recording those pluggy rejects among the failures
    for reg in registry.ALL:
        table = _backend_rows() if reg is registry.backends else rows(reg)
        _section(f"{reg.kind}s [{reg.group}]", table)
    if registry.autoload_disabled():
        print("NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD is set: only neuroflow-core's own entries are listed")
    return 0


def run_backends(args: argparse.Namespace) -> int:
    _section(f"backends [{registry.backends.group}]", _backend_rows())
    return 0
