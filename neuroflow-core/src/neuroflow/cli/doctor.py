"""``neuroflow doctor``: versions, platform, backends, plugins and data, for bug reports and setup checks.

Every section is guarded: a broken plugin shows up as a line in the report,
never as a crash of the report itself.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from collections.abc import Callable
from importlib import metadata

import neuroflow
from neuroflow import data, registry
from neuroflow.backends import qualification
from neuroflow.backends.auto import cache_path, cached_choice
from neuroflow.cli.plugins import distribution, rows
from neuroflow.cli.table import format_table
from neuroflow.plugins import plugin_manager

HELP = "report versions, platform, backends (availability, devices), plugins and whether MNIST is found"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requalify", action="store_true",
                        help="forget every device's cached qualification and run it again (in child processes)")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def _environment() -> list[list[str]]:
    return [
        ["python", f"{platform.python_version()} ({sys.executable})"],
        ["platform", platform.platform()],
        ["cpu count", str(os.cpu_count())],
        ["neuroflow", f"{neuroflow.__version__} (neuroflow-core {_version('neuroflow-core')})"],
        # numba: the vision ops' compiled loops (neuroflow-ops-vision[numba]); NEUROFLOW_NUMBA=0 turns them off
        *([name, _version(name)] for name in ("numpy", "pluggy", "tqdm", "safetensors", "numba")),
        *([var, os.environ[var]] for var in ("NEUROFLOW_BACKEND", "NEUROFLOW_ALLOCATOR", "NEUROFLOW_DATA", "NEUROFLOW_NUMBA",
                                             "NEUROFLOW_DISABLE_PLUGIN_AUTOLOAD", "NEUROFLOW_CACHE_DIR",
                                             qualification.TIMEOUT_VAR, "NEUROFLOW_OPENCL_VECTOR_BYTES",
                                             "OCL_ICD_VENDORS", "CUDA_VISIBLE_DEVICES") if var in os.environ),
    ]


def _backends() -> list[list[str]]:
    table = []
    for name in registry.backends.names():
        where = distribution(registry.backends, name)
        try:
            cls = registry.backends.get(name)
            if not cls.is_available():
                reason = cls.unavailable_reason()
                table.append([name, where, "not available here", reason or ""])
                continue
            if not cls.needs_qualification:
                for index in range(cls.device_count()):
                    facts = cls(index).describe()
                    table.append([f"{name}:{index}", where, "available", " ".join(f"{k}={v}" for k, v in facts.items())])
                continue
            known = qualification.cached()
            waiting = sum(qualification.key(cls, i) not in known for i in range(cls.device_count()))
            if waiting:
                print(f"  (qualifying {waiting} {name} device(s) in child processes: seconds each, a minute or more "
                      "while a driver's kernel cache is empty)", file=sys.stderr, flush=True)
            offered = 0
            for raw, verdict in qualification.offered(name):  # qualifies, in a child process, what is not yet
                if verdict.ok:  # only a qualified device is opened in this process
                    facts = cls(raw).describe()
                    table.append([f"{name}:{offered}", where, verdict.explain(),
                                  " ".join(f"{k}={v}" for k, v in facts.items())])
                    offered += 1
                else:
                    hint = cls.driver_help(raw) if verdict.drivers_fault else ""
                    table.append([f"{name} (refused, device {raw})", where, verdict.explain(),
                                  verdict.device + (f". {hint}" if hint else "")])
        except Exception as exc:  # a backend plugin failing to import or probe is what doctor is for
            table.append([name, where, f"FAILED: {type(exc).__name__}: {exc}"])
    table.append(_auto_row())
    return table


def _auto_row() -> list[str]:
    record = cached_choice()
    if not record:
        return ["auto", "", "not measured yet", f"first use of NEUROFLOW_BACKEND=auto measures and caches in {cache_path()}"]
    timings = ", ".join(f"{k} {v * 1e3:.2f} ms/step" for k, v in record.get("step_seconds", {}).items())
    # a driver's reason can be a multi-line build log: each reason is one line here, as every row of the table is
    failures = "".join(f"; {k} not chosen: {' '.join(str(v).split())}" for k, v in record.get("failures", {}).items())
    return ["auto", "", f"-> {record.get('choice')}", f"{timings} (measured {record.get('measured_at', '?')}){failures}"]


def _plugins() -> list[list[str]]:
    plugin_manager()
    table = []
    for reg in registry.ALL:
        entries = rows(reg)
        failed = [f"{row[0]} ({row[2]})" for row in entries if row[2] != "ok"]
        table.append([reg.group, f"{len(entries) - len(failed)} loaded", "; ".join(failed) or "no failures"])
    return table


def _data() -> list[list[str]]:
    table = []
    for name in ("mnist", "fashion_mnist"):
        try:
            found = getattr(data, name)("test")
            table.append([name, f"found ({len(found)} test samples)"])
        except FileNotFoundError as exc:
            hint = next((line for line in str(exc).splitlines() if line.startswith("To get them")), "")
            table.append([name, f"not found. {hint}".strip()])
    return table


SECTIONS: list[tuple[str, Callable[[], list[list[str]]]]] = [
    ("environment", _environment),
    ("backends", _backends),
    ("plugins", _plugins),
    ("data", _data),
]


def run(args: argparse.Namespace) -> int:
    if getattr(args, "requalify", False):
        qualification.forget()
    for title, section in SECTIONS:
        print(f"{title}:")
        try:
            print(format_table(section()) or "  (none)")
        except Exception as exc:  # one broken section must not hide the others
            print(f"  FAILED: {type(exc).__name__}: {exc}")
    return 0
