"""How much of the gradient allreduce backward hides, and the step times, under ``mpiexec -n 2``.

    OMP_NUM_THREADS=1 mpiexec -n 2 python neuroflow-distributed/benchmarks/overlap.py --model resnet18

For each bucket size, steps alternate between buckets started during backward and every bucket started
after it (``overlap=False``: the whole allreduce): the median step time and the median wait after backward
(``GradientBuckets.finish``) of each, counted from the moment the last rank got there (the ranks' skew is
not communication). Hidden fraction = 1 - wait / whole.
The one-process step (batch per rank, one thread) is ``--distributed none`` run alone.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

import neuroflow as nf
from neuroflow import ops, optim


def build(model: str) -> tuple[Any, tuple[int, ...]]:
    nf.manual_seed(0)
    if model == "resnet18":
        return nf.registry.models.get("resnet18")(num_classes=10), (3, 32, 32)
    if model == "cnn":
        conv, pool = nf.registry.ops.get("Conv2d"), nf.registry.ops.get("MaxPool2d")
        return nf.Sequential(conv(3, 32, 3, padding=1), ops.ReLU(), pool(2), conv(32, 64, 3, padding=1), ops.ReLU(),
                             pool(2), ops.Flatten(), ops.Linear(64 * 8 * 8, 10)), (3, 32, 32)
    return nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10)), (784,)


def run(model_name: str, per_rank: int, steps: int, distributed: str | None,
        bucket_mb: float | None) -> dict[str, dict[str, float]]:
    """Steps alternating between buckets started during backward and after it (drift and load hit both alike)."""
    model, shape = build(model_name)
    trainer = nf.Trainer(model, optimizer=optim.SGD(lr=0.01, momentum=0.9), progress=False, seed=0,
                         distributed=distributed, bucket_mb=bucket_mb)
    size = 1 if trainer.parallel is None else trainer.parallel.size
    rng = np.random.default_rng(0)
    x = rng.standard_normal((per_rank * size, *shape)).astype(np.float32)
    y = rng.integers(0, 10, per_rank * size)
    times: dict[bool, list[float]] = {True: [], False: []}
    waits: dict[bool, list[float]] = {True: [], False: []}
    for step in range(2 * steps + 2):
        overlap = step % 2 == 0
        reducer = trainer.parallel.reducer if trainer.parallel is not None else None
        if reducer is not None:
            reducer.overlap = overlap
        start = time.perf_counter()
        trainer.train_step(x, y)
        elapsed = time.perf_counter() - start
        if step >= 2:  # the first steps trace and plan
            reducer = trainer.parallel.reducer if trainer.parallel is not None else None
            times[overlap].append(elapsed)
            waits[overlap].append(0.0 if reducer is None else unhidden(trainer.parallel.communicator, reducer))
    buckets = 0 if trainer.parallel is None else len(trainer.parallel.reducer)
    return {("on" if mode else "off"): {"step_s": statistics.median(times[mode]), "wait_s": statistics.median(waits[mode]),
                                        "buckets": buckets} for mode in (True, False)}


def unhidden(communicator: Any, reducer: Any) -> float:
    """Seconds the allreduce took after the last rank finished backward: the wait in ``finish`` less the ranks'
    skew (a rank waiting there for a slower one is not waiting for communication)."""
    latest, = communicator.allreduce_scalars([reducer.finish_started], "max")
    mine = max(0.0, reducer.finish_started + reducer.finish_seconds - latest)
    longest, = communicator.allreduce_scalars([mine], "max")
    return longest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet18", choices=("resnet18", "cnn", "mlp"))
    parser.add_argument("--batch-per-rank", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--bucket-mb", type=float, nargs="*", default=[2.0])
    parser.add_argument("--distributed", default="mpi")
    args = parser.parse_args()
    distributed = None if args.distributed == "none" else args.distributed
    if distributed is None:
        result = run(args.model, args.batch_per_rank, args.steps, None, None)["on"]
        print(f"{args.model} one process, batch {args.batch_per_rank}: step {result['step_s'] * 1e3:.1f} ms")
        return
    for bucket_mb in args.bucket_mb:
        result = run(args.model, args.batch_per_rank, args.steps, distributed, bucket_mb)
        on, off = result["on"], result["off"]
        hidden = 1 - on["wait_s"] / off["wait_s"] if off["wait_s"] > 0 else float("nan")
        if _rank0():
            print(f"{args.model} bucket {bucket_mb:g} MiB ({on['buckets']} buckets): step {on['step_s'] * 1e3:.1f} ms "
                  f"overlapped, {off['step_s'] * 1e3:.1f} ms after backward; wait {on['wait_s'] * 1e3:.1f} ms vs "
                  f"whole allreduce {off['wait_s'] * 1e3:.1f} ms: {hidden:.0%} hidden", flush=True)


def _rank0() -> bool:
    from mpi4py import MPI  # lazy: this script runs under mpiexec only

    return MPI.COMM_WORLD.Get_rank() == 0


if __name__ == "__main__":
    main()
