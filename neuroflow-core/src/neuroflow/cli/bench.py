"""``neuroflow bench``: time a training step on every runnable backend, as ``auto`` measures it.

The workload is the one ``NEUROFLOW_BACKEND=auto`` uses (an MLP
784-128-10, batch 64, SGD), so the table explains its choice; the side by
side benchmarks against PyTorch live in the repository's ``benchmarks/``.
"""

from __future__ import annotations

import argparse

from neuroflow import registry
from neuroflow.backends.auto import MARGIN, measure
from neuroflow.cli.table import format_table
from neuroflow.errors import ConfigError

HELP = "time a training step on every runnable backend (the workload NEUROFLOW_BACKEND=auto measures)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", action="append", metavar="NAME",
                        help="time only this backend (repeatable; default: every runnable one)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per backend after warm-up (default 20)")


def run(args: argparse.Namespace) -> int:
    if args.steps < 1:
        raise ConfigError(f"--steps must be at least 1; got {args.steps}")
    names = args.backend or [n for n in registry.backends.names() if registry.backends.get(n).is_available()]
    for name in names:
        registry.backends.get(name)  # unknown names fail here, listing what exists
    rows, timings = [], {}
    for name in names:
        try:
            timings[name] = measure(name, steps=args.steps)
            rows.append([name, f"{timings[name] * 1e3:.3f} ms/step"])
        except Exception as exc:  # one backend failing must not hide the others' figures
            rows.append([name, f"FAILED: {type(exc).__name__}: {exc}"])
    if "cpu" in timings:
        for row in rows:
            if row[0] in timings:
                row.append(f"{timings[row[0]] / timings['cpu']:.2f}× cpu")
    print("training step, MLP 784-128-10, batch 64 (median):")
    print(format_table(rows))
    if "cpu" in timings and len(timings) > 1:
        best = min(timings, key=lambda n: timings[n])
        chosen = best if best != "cpu" and timings[best] < MARGIN * timings["cpu"] else "cpu"
        print(f"auto would choose: {chosen}")
    return 0
