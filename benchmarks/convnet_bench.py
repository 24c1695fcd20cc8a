"""Shared runner of the convolutional train-step benchmarks (``cnn.py``, ``resnet18.py``): NeuroFlow vs PyTorch.

One step is forward, cross-entropy loss read back as a float, backward and an SGD update (lr 0.01,
momentum 0.9) on a fixed random float32 batch. NeuroFlow runs through ``nf.Trainer.train_step`` as a
user calls it; PyTorch is CPU eager (``zero_grad``, forward, ``F.cross_entropy``, ``backward``,
``step``, ``item``). Both start from the same weights (NeuroFlow's, copied by parameter name) and must
report the same first losses. Each contender runs alone in a fresh worker process whose BLAS/OpenMP
thread counts are set before numpy or torch load; the parent times blocks of steps interleaved round by
round and reports medians, the NeuroFlow/PyTorch ratio, and each worker's peak RSS rise over its setup,
through the first step and the untimed ones after it (whichever is higher).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import harness

LR, MOMENTUM = 0.01, 0.9


@dataclass
class Case:
    """One benchmark: how to build the model in each framework, and the batch it trains on."""

    title: str
    batch: int
    sample_shape: tuple[int, ...]
    classes: int
    build_neuroflow: Callable[[], Any]                 # -> NeuroFlow model (seeded)
    build_torch: Callable[[dict[str, np.ndarray]], Any]  # NeuroFlow state dict -> torch.nn.Module
    variants: dict[str, Callable[[], Any]] = field(default_factory=dict)  # more NeuroFlow contenders
    variant_options: dict[str, dict[str, Any]] = field(default_factory=dict)  # their extra Trainer arguments


def batch_data(case: Case) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((case.batch, *case.sample_shape)).astype(np.float32)
    return x, rng.integers(0, case.classes, case.batch)


def neuroflow_stepper(case: Case, name: str) -> Callable[[], float]:
    import neuroflow as nf

    nf.manual_seed(0)
    model = case.variants[name]() if name in case.variants else case.build_neuroflow()
    trainer = nf.Trainer(model, nf.losses.CrossEntropy(), nf.optim.SGD(lr=LR, momentum=MOMENTUM),
                         batch_size=case.batch, progress=False, seed=0, **case.variant_options.get(name, {}))
    x, y = batch_data(case)
    return lambda: trainer.train_step(x, y)


def torch_stepper(case: Case) -> Callable[[], float]:
    import torch
    import torch.nn.functional as F

    import neuroflow as nf

    nf.manual_seed(0)
    model = case.build_torch(case.build_neuroflow().state_dict())
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = batch_data(case)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> float:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xt), yt)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def contenders(case: Case) -> list[str]:
    names = ["NeuroFlow", *case.variants]
    return names + ["PyTorch"] if importlib.util.find_spec("torch") is not None else names


# ---------------------------------------------------------------------------------------------- worker
def worker(case: Case, args: argparse.Namespace) -> None:
    """One contender alone in this process: RSS through its first steps, then timed blocks on request."""
    name, threads = args.contender, args.threads_child
    info: dict[str, Any] = {"contender": name, "threads": threads, "numpy": np.__version__}
    if name == "PyTorch":
        import torch

        torch.set_num_threads(threads)
        info["torch"], info["torch_threads"] = str(torch.__version__), torch.get_num_threads()
        step = torch_stepper(case)
    else:
        step = neuroflow_stepper(case, name)
    harness.start_worker(step, args.warmup, info)


def check_agreement(losses: dict[str, list[float]]) -> None:
    """Raise unless the first loss of every contender agrees: same data, same weights, same model."""
    reference_name, reference = next(iter(losses.items()))
    for name, values in losses.items():
        if abs(values[0] - reference[0]) > 1e-3 * max(1.0, abs(reference[0])):
            raise RuntimeError(f"{name} first loss {values[0]:.6f}, {reference_name} {reference[0]:.6f}: "
                               "the contenders do not compute the same step")


def measure(case: Case, script: str, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    workers: dict[str, harness.Worker] = {}
    try:
        for name in contenders(case):
            workers[name] = harness.Worker(
                [script, "--child", "--contender", name, "--threads-child", str(threads), "--warmup", str(args.warmup)],
                env=harness.thread_env(threads),
            )
        check_agreement({name: w.info["first_losses"] for name, w in workers.items()})
        samples = harness.interleave(
            {name: functools.partial(w.run, args.steps) for name, w in workers.items()}, args.rounds, args.pause
        )
    finally:
        for w in workers.values():
            w.close()
    return {"threads": threads, "samples_s": samples, "workers": {name: w.info for name, w in workers.items()}}


def table(results: list[dict[str, Any]], names: list[str]) -> str:
    has_torch = "PyTorch" in names
    headers = ["threads", *(f"{n} ms" for n in names)]
    headers += [f"{n}/PyTorch" for n in names if n != "PyTorch"] if has_torch else []
    headers += ["spread", *(f"{n} RSS rise MB" for n in names)]
    headers += [f"{n} RSS/PyTorch" for n in names if n != "PyTorch"] if has_torch else []
    rows = []
    for result in results:
        stats = {n: harness.summarise(result["samples_s"][n]) for n in names}
        rise = {n: result["workers"][n]["peak_rise_kb"] for n in names}
        row: list[object] = [result["threads"], *(f"{stats[n]['median'] * 1e3:.1f}" for n in names)]
        if has_torch:
            row += [f"{harness.paired_ratio(result['samples_s'][n], result['samples_s']['PyTorch']):.2f}×"
                    for n in names if n != "PyTorch"]
        row.append(f"{max(s['spread'] for s in stats.values()) * 100:.1f}%")
        row += ["—" if rise[n] is None else f"{rise[n] / 1024:.1f}" for n in names]
        if has_torch:
            row += [f"{rise[n] / rise['PyTorch']:.2f}×" if rise[n] and rise["PyTorch"] else "—"
                    for n in names if n != "PyTorch"]
        rows.append(row)
    return harness.markdown_table(headers, rows)


def parse_args(argv: list[str] | None, description: str, threads: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="few rounds and steps: a smoke test, not a measurement")
    parser.add_argument("--json", metavar="FILE", help="write settings, every sample and the table to FILE")
    parser.add_argument("--threads", default=threads, help=f"comma-separated thread counts (default {threads})")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 15; 3 with --quick)")
    parser.add_argument("--steps", type=int, help="steps per timed block (default 5; 1 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed steps per contender first (default 5; 1 with --quick)")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds idle before each block (default 0.05)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads-child", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = (3, 1, 1) if args.quick else (15, 5, 5)
    for name, default in zip(("rounds", "steps", "warmup"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--rounds and --steps must be at least 1, --warmup at least 0")
    return args


def main(case: Case, script: str, argv: list[str] | None = None, threads: str = "2") -> int:
    args = parse_args(argv, case.title, threads)
    if args.child:
        worker(case, args)
        return 0
    names = contenders(case)
    load_before = harness.machine_load()
    results = [measure(case, script, int(t), args) for t in args.threads.split(",")]
    print(f"{case.title}, batch {case.batch}, SGD lr {LR} momentum {MOMENTUM}, float32; one process per contender: "
          f"median of {args.rounds} interleaved rounds × {args.steps} steps after {3 + args.warmup} untimed steps")
    for result in results:
        parts = [f"{n}: OpenBLAS {w['openblas_threads']}" + (f", torch {w['torch_threads']}" if "torch" in w else "")
                 for n, w in result["workers"].items()]
        print(f"  threads={result['threads']} as the libraries report them: " + "; ".join(parts))
    print(f"  load average before {load_before}, after {harness.machine_load()}; ratio = median of per-round "
          "ratios; spread = largest interquartile range / median; RSS rise = peak over RSS after setup, "
          f"through the first {3 + args.warmup} steps\n")
    report_table = table(results, names)
    print(report_table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"case": case.title, "batch": case.batch, "contenders": names, "results": results,
                       "table": report_table}, f, indent=1)
    return 0
