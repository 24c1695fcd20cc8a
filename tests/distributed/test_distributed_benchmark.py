"""benchmarks/distributed.py runs end to end under mpiexec and prints its table (timings are never asserted)."""

from __future__ import annotations

import subprocess
import sys

from cli_runs import REPO, TIMEOUT_S, environment


def test_the_distributed_benchmark_prints_its_table():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "distributed.py"), "--quick", "--models", "mlp",
                           "--frameworks", "neuroflow"], capture_output=True, text=True, timeout=TIMEOUT_S,
                          env=environment(), cwd=REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    table = [line for line in done.stdout.splitlines() if line.startswith("|")]
    header, _, first = ([cell.strip() for cell in line.strip("|").split("|")] for line in table[:3])
    assert header[:6] == ["model", "framework", "1 rank samples/s", "2 ranks samples/s", "efficiency", "vs 2 alone"]
    cells = first
    assert cells[:2] == ["MLP 784-128-64-10", "NeuroFlow (mpi)"]
    assert float(cells[2]) > 0 and float(cells[3]) > 0 and 0 < float(cells[4])
    assert header[-3:] == ["exposed ms (overlapped / after backward)", "waiting for the slower rank ms",
                           "allreduce hidden"]
    # the engine's timers: the communication left after backward, with and without the overlap, and the share hidden
    exposed, whole = (float(v) for v in cells[-3].split(" / "))
    assert 0 <= exposed and 0 <= whole and float(cells[-2]) >= 0
    assert cells[-1] == "-" or cells[-1].endswith("%")
