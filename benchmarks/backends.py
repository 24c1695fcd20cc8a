"""OpenCL (pocl on this CPU) against the cpu backend: MLP and small-CNN training steps, and SGEMM GFLOP/s.

Training steps: the MLP 784-128-64-10 (Adam, as ``mlp.py`` builds it) and the small CNN (SGD with
momentum, as ``cnn.py`` builds it), batch 64, float32, through ``nf.Trainer(..., device=...)`` as a user
calls it, the same weights and batches on both backends (their first losses must agree). SGEMM: C = A @ B
on dense float32 matrices, ``xp.matmul(a, b, out=c)`` with the opencl namespace against ``numpy.matmul``
(OpenBLAS), a block of ``REPEATS`` products followed by one device synchronisation. Every contender runs
in its own fresh worker process (pocl's worker threads keep cores busy after a kernel and would slow numpy
in the same process), with the BLAS/OpenMP thread variables set before numpy loads; the parent times
blocks interleaved round by round and reports medians, the opencl/cpu ratio and the spread.

    .venv/bin/python benchmarks/backends.py              # a few minutes
    .venv/bin/python benchmarks/backends.py --quick      # smoke test; not a measurement
    .venv/bin/python benchmarks/backends.py --json out.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import harness

BACKENDS = ("cpu", "opencl")
GEMM_SIZES = ((64, 784, 128), (256, 256, 256), (512, 512, 512), (4096, 27, 32))  # (M, K, N); the last is im2col-like
REPEATS = 8  # products per GEMM step, then one synchronisation


def mlp_stepper(device: str) -> Callable[[], float]:
    import mlp
    import neuroflow as nf
    from neuroflow import ops

    weights = mlp.initial_weights()
    layers: list[Any] = []
    for i, (w, b) in enumerate(weights):
        linear = ops.Linear(w.shape[1], w.shape[0])
        linear.weight.data[...] = w
        linear.bias.data[...] = b
        layers += [linear, ops.ReLU()] if i < len(weights) - 1 else [linear]
    trainer = nf.Trainer(nf.Sequential(*layers), nf.losses.CrossEntropy(), nf.optim.Adam(lr=mlp.LR),
                         device=device, batch_size=64, progress=False, seed=0)
    data = itertools.cycle(mlp.batch_data(64))
    return lambda: trainer.train_step(*next(data))


def cnn_stepper(device: str) -> Callable[[], float]:
    import cnn
    import convnet_bench
    import neuroflow as nf

    nf.manual_seed(0)
    trainer = nf.Trainer(cnn.build_neuroflow(), nf.losses.CrossEntropy(),
                         nf.optim.SGD(lr=convnet_bench.LR, momentum=convnet_bench.MOMENTUM),
                         device=device, batch_size=cnn.CASE.batch, progress=False, seed=0)
    x, y = convnet_bench.batch_data(cnn.CASE)
    return lambda: trainer.train_step(x, y)


def gemm_stepper(device: str, size: tuple[int, int, int]) -> Callable[[], object]:
    m, k, n = size
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    if device == "cpu":
        c = np.empty((m, n), np.float32)
        return lambda: [np.matmul(a, b, out=c) for _ in range(REPEATS)]
    from neuroflow.backends.selection import get_backend

    backend = get_backend(device)
    xp = backend.xp
    da, db = xp.asarray(a), xp.asarray(b)
    dc = xp.matmul(da, db)
    if not np.allclose(dc.get(), a @ b, rtol=1e-4, atol=1e-3):
        raise RuntimeError(f"opencl matmul {size} disagrees with numpy")

    def step() -> None:
        for _ in range(REPEATS):
            xp.matmul(da, db, out=dc)
        backend.synchronize()

    return step


# ---------------------------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> None:
    if args.task == "gemm":
        size = tuple(int(s) for s in args.size.split("x"))
        step = gemm_stepper(args.backend, size)  # type: ignore[arg-type]
        info: dict[str, Any] = {"first_losses": []}
    else:
        step = (mlp_stepper if args.task == "mlp" else cnn_stepper)(args.backend)
        info = {"first_losses": [float(step()) for _ in range(3)]}
    for _ in range(args.warmup):
        step()
    info["openblas_threads"] = harness.openblas_threads()
    print(json.dumps(info), flush=True)
    harness.serve_blocks(step)


def measure(task: str, size: str, args: argparse.Namespace) -> dict[str, Any]:
    workers: dict[str, harness.Worker] = {}
    steps = args.steps if task == "mlp" else max(1, args.steps // 4)
    try:
        for name in BACKENDS:
            workers[name] = harness.Worker(
                [__file__, "--child", "--task", task, "--backend", name, "--size", size, "--warmup", str(args.warmup)],
                env=harness.thread_env(args.threads),
            )
        losses = {name: w.info["first_losses"] for name, w in workers.items()}
        for (a, b) in zip(losses["opencl"], losses["cpu"], strict=True):
            if abs(a - b) > 1e-3 * abs(b):
                raise RuntimeError(f"{task}: opencl losses {losses['opencl']} differ from cpu {losses['cpu']}")
        samples = harness.interleave({name: functools.partial(w.run, steps) for name, w in workers.items()},
                                     args.rounds, args.pause)
    finally:
        for w in workers.values():
            w.close()
    return {"task": task, "size": size, "samples_s": samples, "losses": losses,
            "summary_s": {name: harness.summarise(s) for name, s in samples.items()},
            "paired_ratio": harness.paired_ratio(samples["opencl"], samples["cpu"])}


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    load_before = harness.machine_load()
    results = [measure(task, "-", args) for task in ("mlp", "cnn")]
    results += [measure("gemm", "x".join(map(str, s)), args) for s in GEMM_SIZES]
    report = {"settings": {"rounds": args.rounds, "steps_per_block": args.steps, "warmup": args.warmup,
                           "threads": args.threads, "gemm_repeats": REPEATS},
              "source": harness.source_version(os.path.dirname(os.path.abspath(__file__))),
              "load_average_before": load_before, "load_average_after": harness.machine_load(),
              "results": results}
    rows = []
    for r in results:
        med = {name: r["summary_s"][name]["median"] for name in BACKENDS}
        spread = max(s["spread"] for s in r["summary_s"].values())
        if r["task"] == "gemm":
            m, k, n = (int(s) for s in r["size"].split("x"))
            flops = 2 * m * k * n * REPEATS
            rows.append([f"SGEMM {r['size']} (GFLOP/s)", f"{flops / med['cpu'] / 1e9:.1f}",
                         f"{flops / med['opencl'] / 1e9:.1f}", f"{med['opencl'] / med['cpu']:.2f}×",
                         f"{r['paired_ratio']:.2f}×", f"{spread * 100:.0f}%"])
        else:
            rows.append([f"{r['task'].upper()} train step (ms)", f"{med['cpu'] * 1e3:.2f}", f"{med['opencl'] * 1e3:.2f}",
                         f"{med['opencl'] / med['cpu']:.2f}×", f"{r['paired_ratio']:.2f}×", f"{spread * 100:.0f}%"])
    report["table"] = harness.markdown_table(
        ["what", "cpu / numpy", "opencl", "opencl/cpu time", "paired", "spread"], rows)
    return report


def print_report(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(f"opencl (pocl) vs cpu backend / numpy, one process per contender, {s['threads']} BLAS threads: median of "
          f"{s['rounds']} interleaved rounds; code {report['source']}; load average before "
          f"{report['load_average_before']}, after {report['load_average_after']}; paired = median of per-round "
          "ratios; spread = largest interquartile range / median\n")
    print(report["table"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds: a smoke test, not a measurement")
    parser.add_argument("--json", metavar="FILE", help="write settings, every sample and the table to FILE")
    parser.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP threads of every worker (default 2)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 15; 3 with --quick)")
    parser.add_argument("--steps", type=int, help="MLP steps per block, a quarter for the others (default 12; 4 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed steps per worker (default 5; 1 with --quick)")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds idle before each block (default 0.05)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--task", choices=("mlp", "cnn", "gemm"), help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--size", default="-", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    harness.fill_defaults(args, {"rounds": (3, 15), "steps": (4, 12), "warmup": (1, 5)})
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        worker(args)
        return 0
    import importlib.util

    if importlib.util.find_spec("neuroflow_opencl") is None:
        print("neuroflow-opencl is not installed; nothing to compare")
        return 0
    from neuroflow_opencl import OpenclBackend

    reason = OpenclBackend.unavailable_reason()
    if reason:
        print(f"the opencl backend is unavailable here: {reason}")
        return 0
    return harness.emit(run_all(args), print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
