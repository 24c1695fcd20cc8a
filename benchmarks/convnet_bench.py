"""Shared runner of the convolutional train-step benchmarks (``cnn.py``, ``resnet18.py``): NeuroFlow vs PyTorch.

One step is forward, cross-entropy loss read back as a float, backward and an SGD update (lr 0.01,
momentum 0.9) on a fixed random float32 batch. NeuroFlow runs through ``nf.Trainer.train_step`` as a
user calls it; PyTorch is CPU eager (``zero_grad``, forward, ``F.cross_entropy``, ``backward``,
``step``, ``item``). Every contender starts from the same weights (the main NeuroFlow model's, copied by
parameter name) and must report the same first loss.

The main contender, ``NeuroFlow``, is the model as a user writes it; variants (``--variants``) are more
NeuroFlow contenders (layout hints, other Trainer options). Main view: for each thread count, one fresh
process holds every contender, its thread variables set before numpy and torch load (then
``torch.set_num_threads`` and threadpoolctl when installed), and times their blocks of steps interleaved;
medians and ratios to PyTorch. Second view (``--separate-processes``): each contender alone in its own
worker process, interleaved round by round from the parent, with each worker's peak RSS rise over its
setup, through the first step and the untimed ones after it (whichever is higher).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import harness

LR, MOMENTUM = 0.01, 0.9
MAIN, TORCH = "NeuroFlow", "PyTorch"


@dataclass
class Variant:
    """A further NeuroFlow contender: its name in the tables, its model, its extra Trainer arguments."""

    name: str
    build: Callable[[], Any]  # -> NeuroFlow model with the main model's weights (called after nf.manual_seed(0))
    trainer_options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Case:
    """One benchmark: how to build the model in each framework, and the batch it trains on."""

    title: str
    batch: int
    sample_shape: tuple[int, ...]
    classes: int
    build_neuroflow: Callable[[], Any]                 # -> the model as a user writes it (seeded)
    build_torch: Callable[[dict[str, np.ndarray]], Any]  # its state dict -> torch.nn.Module
    variants: dict[str, Variant] = field(default_factory=dict)  # --variants key -> a further NeuroFlow contender
    default_variants: tuple[str, ...] = ()
    threads: str = "2"             # default --threads
    timing: tuple[int, int, int] = (15, 5, 5)  # default --repeats, --steps, --warmup


def batch_data(case: Case) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((case.batch, *case.sample_shape)).astype(np.float32)
    return x, rng.integers(0, case.classes, case.batch)


def neuroflow_stepper(case: Case, variant: Variant | None) -> Callable[[], float]:
    import neuroflow as nf

    nf.manual_seed(0)
    model = case.build_neuroflow() if variant is None else variant.build()
    options = {} if variant is None else variant.trainer_options
    trainer = nf.Trainer(model, nf.losses.CrossEntropy(), nf.optim.SGD(lr=LR, momentum=MOMENTUM),
                         batch_size=case.batch, progress=False, seed=0, **options)
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


def contenders(case: Case, variant_keys: list[str]) -> list[str]:
    """Names of the contenders, in the order they run: the main NeuroFlow model, the variants, PyTorch if installed."""
    names = [MAIN, *(case.variants[k].name for k in variant_keys)]
    return names + [TORCH] if importlib.util.find_spec("torch") is not None else names


def stepper(case: Case, name: str) -> Callable[[], float]:
    if name == TORCH:
        return torch_stepper(case)
    variant = next((v for v in case.variants.values() if v.name == name), None)
    if name != MAIN and variant is None:
        raise ValueError(f"no contender {name!r}; expected {MAIN}, {TORCH} or one of {[v.name for v in case.variants.values()]}")
    return neuroflow_stepper(case, variant)


# ---------------------------------------------------------------------------------------------- one process
def one_process_child(case: Case, args: argparse.Namespace) -> None:
    """Every contender in this process (started with the thread variables set), timed interleaved; one JSON line."""
    steppers = {name: stepper(case, name) for name in args.contender_names}
    results, threads = harness.measure_in_child({"step": steppers}, args, harness.first_values_agree)
    harness.print_child_line(results["step"], threads)


# ---------------------------------------------------------------------------------------------- separate processes
def worker(case: Case, args: argparse.Namespace) -> None:
    """One contender alone in this process: RSS through its first steps, then timed blocks on request."""
    name, threads = args.contender, args.threads_child
    harness.start_worker(stepper(case, name), args.warmup, harness.worker_info(name, threads, name == TORCH))


def measure_separately(case: Case, script: str, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    workers: dict[str, harness.Worker] = {}
    try:
        for name in args.contender_names:
            workers[name] = harness.Worker(
                [script, "--child", "--contender", name, "--threads-child", str(threads), "--warmup", str(args.warmup)],
                env=harness.thread_env(threads),
            )
        harness.first_values_agree({name: w.info["first_losses"] for name, w in workers.items()})
        samples = harness.interleave(
            {name: functools.partial(w.run, args.steps, args.settle) for name, w in workers.items()}, args.repeats,
            harness.pause_for(threads, args.pause),
        )
    finally:
        for w in workers.values():
            w.close()
    return {"threads": threads, "samples_s": samples, "workers": {name: w.info for name, w in workers.items()}}


def separate_table(results: list[dict[str, Any]], names: list[str]) -> str:
    has_torch = TORCH in names
    headers = ["threads", *(f"{n} ms" for n in names)]
    headers += [f"{n}/PyTorch" for n in names if n != TORCH] if has_torch else []
    headers += ["spread", *(f"{n} RSS rise MB" for n in names)]
    headers += [f"{n} RSS/PyTorch" for n in names if n != TORCH] if has_torch else []
    rows = []
    for result in results:
        stats = {n: harness.summarise(result["samples_s"][n]) for n in names}
        rise = {n: result["workers"][n]["peak_rise_kb"] for n in names}
        row: list[object] = [result["threads"], *(f"{stats[n]['median'] * 1e3:.1f}" for n in names)]
        if has_torch:
            row += [f"{harness.paired_ratio(result['samples_s'][n], result['samples_s'][TORCH]):.2f}×"
                    for n in names if n != TORCH]
        row.append(f"{max(s['spread'] for s in stats.values()) * 100:.1f}%")
        row += ["—" if rise[n] is None else f"{rise[n] / 1024:.1f}" for n in names]
        if has_torch:
            row += [f"{rise[n] / rise[TORCH]:.2f}×" if rise[n] and rise[TORCH] else "—"
                    for n in names if n != TORCH]
        rows.append(row)
    return harness.markdown_table(headers, rows)


# ---------------------------------------------------------------------------------------------- parent
def parse_args(case: Case, argv: list[str] | None) -> argparse.Namespace:
    repeats, steps, warmup = case.timing
    keys = ", ".join(f"{k} ({v.name})" for k, v in case.variants.items()) or "none"
    parser = argparse.ArgumentParser(description=case.title)
    parser.add_argument("--quick", action="store_true", help="few repeats and steps: a smoke test, not a measurement")
    parser.add_argument("--json", metavar="FILE", help="write settings, every sample and the tables to FILE")
    parser.add_argument("--threads", default=case.threads, help=f"comma-separated thread counts (default {case.threads})")
    parser.add_argument("--repeats", "--rounds", dest="repeats", type=int,
                        help=f"interleaved repetitions: one block per contender each (default {repeats}; 3 with --quick)")
    parser.add_argument("--steps", type=int, help=f"steps per timed block (default {steps}; 1 with --quick)")
    parser.add_argument("--warmup", type=int, help=f"untimed steps per contender first (default {warmup}; 1 with --quick)")
    parser.add_argument("--pause", type=float,
                        help="seconds idle before each block, so the previous contender's spinning BLAS/OpenMP threads "
                             f"go to sleep (default {harness.SPIN_PAUSE_S} above one thread, 0 at one)")
    harness.add_settle_argument(parser)
    parser.add_argument("--variants", default=",".join(case.default_variants),
                        help=f"comma-separated further NeuroFlow contenders, or 'all': {keys} "
                             f"(default {','.join(case.default_variants) or 'none'})")
    parser.add_argument("--separate-processes", action="store_true",
                        help="also time each contender alone in its own process (second view, with RSS)")
    parser.add_argument("--one-process-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads-child", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--names", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = (3, 1, 1) if args.quick else case.timing
    for name, default in zip(("repeats", "steps", "warmup"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--repeats and --steps must be at least 1, --warmup at least 0")
    chosen = list(case.variants) if args.variants == "all" else [k for k in args.variants.split(",") if k]
    unknown = [k for k in chosen if k not in case.variants]
    if unknown:
        parser.error(f"unknown --variants {unknown}; expected 'all' or some of {list(case.variants)}")
    args.contender_names = args.names.split("|") if args.names else contenders(case, chosen)
    return args


def child_argv(args: argparse.Namespace) -> list[str]:
    return [*harness.timing_argv(args), "--names", "|".join(args.contender_names)]


def main(case: Case, script: str, argv: list[str] | None = None) -> int:
    args = parse_args(case, argv)
    if args.one_process_child is not None:
        one_process_child(case, args)
        return 0
    if args.child:
        worker(case, args)
        return 0
    names, threads = args.contender_names, [int(t) for t in args.threads.split(",")]
    references = {name: TORCH for name in names if name != TORCH}
    load_before = harness.machine_load()
    results = [harness.one_process_run(script, t, child_argv(args)) for t in threads]
    separate = [measure_separately(case, script, t, args) for t in threads] if args.separate_processes else []
    report: dict[str, Any] = {
        "case": case.title, "batch": case.batch, "contenders": names,
        "settings": {"repeats": args.repeats, "steps": args.steps, "warmup": args.warmup, "settle": args.settle},
        "source": harness.source_version(os.path.dirname(os.path.abspath(script))),
        "load_average_before": load_before, "load_average_after": harness.machine_load(),
        "results": results, "table": harness.ratio_table(results, references),
    }
    print(f"{case.title}, batch {case.batch}, SGD lr {LR} momentum {MOMENTUM}, float32. Every contender in one process "
          f"per thread count, interleaved: median of {args.repeats} repeats × {args.steps} steps after "
          f"{3 + args.warmup} untimed steps (and {args.settle} at the start of each block)")
    for result in results:
        print(f"  threads={result['threads']}, {result['pause_s']} s idle before each block: "
              f"{harness.describe_threads(result['thread_report'])}")
    print(f"  code {report['source']}, numpy {results[0]['numpy']}, torch {results[0]['torch']}; load average before "
          f"{load_before}, after {report['load_average_after']}; ratio = ratio of medians; per-repeat ratio = median "
          "of the ratios within a repeat; spread = interquartile range / median\n")
    print(report["table"])
    line = harness.summary(os.path.basename(script).removesuffix(".py"), results, references)
    if separate:
        report["separate_processes"] = separate
        report["separate_table"] = separate_table(separate, names)
        print("\nSecond view, each contender alone in its own process (thread variables set before the libraries "
              "load): ratio = median of per-round ratios; RSS rise = peak over RSS after setup, through the first "
              f"{3 + args.warmup} steps\n")
        print(report["separate_table"])
        line["separate_processes"] = harness.summary("", separate, references)["results"]
    print("\n" + json.dumps(line), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0
