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


def _benchmark_module():
    import importlib.util

    sys.path.insert(0, str(REPO / "benchmarks"))  # it imports its sibling harness.py
    try:
        spec = importlib.util.spec_from_file_location("distributed_benchmark", REPO / "benchmarks" / "distributed.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    return module


def test_contenders_take_turns_by_blocks_of_consecutive_steps():
    """Most timed steps follow a step of the same model (as in training), and every contender gets its count."""
    bench = _benchmark_module()
    order: list[str] = []
    after: list[str] = []
    times = bench.interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, warmup=1, count=7,
                              block=3, after=after.append)
    assert order == ["a", "b"] + ["a"] * 3 + ["b"] * 3 + ["a"] * 3 + ["b"] * 3 + ["a", "b"]
    assert after == order[2:] and {name: len(t) for name, t in times.items()} == {"a": 7, "b": 7}


def test_rounds_combine_into_the_median_of_each_time():
    bench = _benchmark_module()
    runs = [{"alone": 1.0, "dp": 3.0, "buckets": 4}, {"alone": 5.0, "dp": 1.0, "buckets": 4},
            {"alone": 2.0, "dp": 2.0, "buckets": 4}]
    assert bench.median_run(runs) == {"alone": 2.0, "dp": 2.0, "buckets": 4}


def test_the_distributed_benchmark_refuses_no_rounds():
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "distributed.py"), "--rounds", "0"],
                          capture_output=True, text=True, timeout=TIMEOUT_S, env=environment(), cwd=REPO)
    assert done.returncode == 2 and "--rounds must be at least 1" in done.stderr
