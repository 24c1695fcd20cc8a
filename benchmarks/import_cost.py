"""What NeuroFlow costs before it does anything: import time, import RSS, and the core wheel's size.

Each import is timed inside a fresh interpreter (interpreter start-up excluded), median over several
processes, alternating the two variants: a bare ``import neuroflow``, and one that also resolves
``ops.Linear`` (entry-point lookup, numpy and the op module). The wheel is built from a copy of
``neuroflow-core`` so no build files land in the repository.

    python benchmarks/import_cost.py [--quick] [--runs N] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
from typing import Any

import harness

ROOT = pathlib.Path(__file__).resolve().parent.parent
VARIANTS = {
    "import neuroflow": "import neuroflow",
    "import neuroflow; ops.Linear": "import neuroflow\nfrom neuroflow import ops\nops.Linear",
}
TARGET_SECONDS, TARGET_RSS_BYTES, TARGET_WHEEL_BYTES = 0.3, 60e6, 200e3

# Runs in the fresh interpreter: only sys and time are loaded before the measured statements.
CHILD = """
import time
def rss_kb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
before = rss_kb()
start = time.perf_counter()
{statements}
seconds = time.perf_counter() - start
print(repr(seconds), rss_kb() - before)
"""


def measure_once(statements: str) -> tuple[float, int]:
    """Seconds and RSS rise (bytes) of ``statements`` in a fresh interpreter."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD.format(statements=statements)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"importing failed:\n{done.stderr}")
    seconds, rss_kb = done.stdout.split()
    return float(seconds), int(rss_kb) * 1024


def measure_imports(runs: int) -> dict[str, dict[str, Any]]:
    samples: dict[str, dict[str, list[float]]] = {name: {"seconds": [], "rss_bytes": []} for name in VARIANTS}
    for _ in range(runs):
        for name, statements in VARIANTS.items():
            seconds, rss = measure_once(statements)
            samples[name]["seconds"].append(seconds)
            samples[name]["rss_bytes"].append(rss)
    return {
        name: {"time": harness.summarise(s["seconds"]), "rss": harness.summarise(s["rss_bytes"]), "samples": s}
        for name, s in samples.items()
    }


def slowest_imports(statements: str, top: int) -> list[tuple[float, str]]:
    """The ``top`` modules with the largest cumulative import time (``python -X importtime``), in seconds."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statements], capture_output=True, text=True, check=True
    )
    rows = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]) / 1e6, parts[2].rstrip()))
    return sorted(rows, reverse=True)[:top]


def wheel_bytes() -> tuple[int, str]:
    """Size and name of the neuroflow-core wheel, built with pip from a clean copy of the source."""
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / "neuroflow-core"
        shutil.copytree(
            ROOT / "neuroflow-core", source, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info", "__pycache__")
        )
        command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(pathlib.Path(tmp) / "dist")]
        try:
            import setuptools  # noqa: F401
        except ImportError:
            pass  # pip fetches a build backend into an isolated environment
        else:
            command.append("--no-build-isolation")  # same wheel, without fetching setuptools again
        subprocess.run([*command, str(source)], check=True, capture_output=True, text=True)
        (wheel,) = (pathlib.Path(tmp) / "dist").glob("neuroflow_core-*.whl")
        return wheel.stat().st_size, wheel.name


def report_table(imports: dict[str, dict[str, Any]], wheel: tuple[int, str] | None, runs: int) -> str:
    rows: list[list[object]] = []
    for name, result in imports.items():
        t, rss = result["time"], result["rss"]
        rows.append([f"`{name}` time", f"{t['median']:.3f} s (IQR {t['q1']:.3f}–{t['q3']:.3f})",
                     f"≤ {TARGET_SECONDS:g} s", _verdict(t["median"] <= TARGET_SECONDS)])
        rows.append([f"`{name}` RSS rise", f"{rss['median'] / 1e6:.1f} MB",
                     f"≤ {TARGET_RSS_BYTES / 1e6:g} MB", _verdict(rss["median"] <= TARGET_RSS_BYTES)])
    if wheel is not None:
        size, name = wheel
        rows.append([f"core wheel `{name}`", f"{size / 1e3:.1f} KB", f"≤ {TARGET_WHEEL_BYTES / 1e3:g} KB",
                     _verdict(size <= TARGET_WHEEL_BYTES)])
    return harness.markdown_table(["what", f"measured (median of {runs} fresh processes)", "target", "meets"], rows)


def _verdict(ok: bool) -> str:
    return "yes" if ok else "NO"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 processes per variant instead of 15")
    parser.add_argument("--runs", type=int, help="fresh processes per variant (default 15; 5 with --quick)")
    parser.add_argument("--top", type=int, default=8, help="list the N slowest imports behind ops.Linear (0: none)")
    parser.add_argument("--no-wheel", action="store_true", help="skip building the wheel")
    parser.add_argument("--json", metavar="FILE", help="write every sample and the table to FILE")
    args = parser.parse_args(argv)
    runs = args.runs or (5 if args.quick else 15)
    if runs < 1:
        parser.error("--runs must be at least 1")

    load_before = harness.machine_load()
    imports = measure_imports(runs)
    wheel = None if args.no_wheel else wheel_bytes()
    table = report_table(imports, wheel, runs)
    print(f"code {harness.source_version(str(ROOT))}, python {sys.version.split()[0]}; load average before {load_before}, after {harness.machine_load()}; "
          "MB = 10⁶ bytes, KB = 10³ bytes\n")
    print(table)
    slowest = slowest_imports(VARIANTS["import neuroflow; ops.Linear"], args.top) if args.top > 0 else []
    if slowest:
        print("\nSlowest imports behind `ops.Linear` (cumulative, one process, python -X importtime):\n")
        print(harness.markdown_table(["module", "seconds"], [[m.strip(), f"{s:.3f}"] for s, m in slowest]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": runs, "imports": imports, "wheel_bytes": wheel and wheel[0], "table": table,
                       "slowest_imports": slowest}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
