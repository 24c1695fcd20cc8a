"""MLP 784-128-64-10 training step, SGD and Adam: NeuroFlow vs PyTorch CPU eager vs a hand-written numpy step.

One step is forward, cross-entropy loss (read back as a Python float), backward and an update, on random
MNIST-shaped float32 batches, every contender starting from the same weights on the same batches. Two
updates, each with its three contenders: SGD (lr 0.01, no momentum) and Adam (lr 1e-3, no weight decay).

Main view: for each (thread count, batch), one fresh process holds all six contenders, its thread variables
set before numpy and torch load (then ``torch.set_num_threads`` and threadpoolctl when installed), and
times their blocks of steps interleaved; medians, and ratios to PyTorch with the same update. Second view
(``--separate-processes``): each contender alone in its own worker process, interleaved from the parent,
with each worker's RSS after setup and its peak during the first and later steps.

    python benchmarks/mlp.py                         # batch 64, 1 thread, one process: about 20 s
    python benchmarks/mlp.py --batches 64,256 --threads 1,2 --separate-processes
    python benchmarks/mlp.py --optimizers sgd --repeats 40
    python benchmarks/mlp.py --quick                 # smoke test
"""

from __future__ import annotations

import neuroflow  # noqa: F401 - first, as the spec's snippet does: it shortens OpenBLAS's idle spin (neuroflow.blas_idle)

# isort: split
import argparse
import functools
import importlib.util
import itertools
import json
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import harness

SIZES = (784, 128, 64, 10)
LR = 1e-3       # Adam's
SGD_LR = 0.01
OPTIMIZERS = ("sgd", "adam")
LABELS = {"sgd": "SGD", "adam": "Adam"}
FRAMEWORKS = ("NeuroFlow", "PyTorch", "numpy")
#: ``--without-replay`` adds it: NeuroFlow with ``replay_steps=False``, its ops run at every step (neuroflow.replay)
WITHOUT_REPLAY = "NeuroFlow without replay"
# Steps cycle through this many distinct batches (on one fixed batch the loss is ~0 within 100 steps).
# Even so, units whose ReLU died stop getting gradient, and Adam's first moment of their weights decays
# by beta1 each step into float32 denormals from about step 700: every contender then slows 2-3x
# (measured here) and later rounds would time denormal arithmetic, not a training step. So a contender
# runs at most MAX_STEPS steps.
BATCHES = 32
MAX_STEPS = 600
Weights = list[tuple[np.ndarray, np.ndarray]]
Batches = list[tuple[np.ndarray, np.ndarray]]


def contender_name(framework: str, optimizer: str) -> str:
    return f"{framework} {LABELS[optimizer]}"


def initial_weights(seed: int = 0) -> Weights:
    """PyTorch's default Linear init, U(±1/√fan_in), as float32 (weight (out, in), bias (out,))."""
    rng = np.random.default_rng(seed)
    weights = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:], strict=True):
        bound = 1.0 / math.sqrt(fan_in)
        weights.append((
            rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32),
            rng.uniform(-bound, bound, fan_out).astype(np.float32),
        ))
    return weights


def batch_data(batch: int, count: int = BATCHES, seed: int = 1) -> Batches:
    """``count`` random MNIST-shaped batches: pixels in [0, 1) as float32 (batch, 784), labels int64 in [0, 10)."""
    rng = np.random.default_rng(seed)
    x = rng.random((count, batch, SIZES[0]), dtype=np.float32)
    y = rng.integers(0, SIZES[-1], (count, batch))
    return list(zip(x, y, strict=True))


class NumpyMLP:
    """The hand-written reference: the least numpy work one step needs, every buffer preallocated.

    Parameters and gradients are views of two flat buffers, so gradients are written in place (nothing
    to zero or accumulate) and the update is whole-buffer passes (SGD two, Adam ten); the logits' gradient
    overwrites the softmax; the first layer's input gradient, which nothing needs, is never computed.
    """

    def __init__(self, weights: Weights, batch: int, optimizer: str, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        total = sum(w.size + b.size for w, b in weights)
        self.params = np.empty(total, np.float32)
        self.grads = np.empty(total, np.float32)
        self.weight: list[np.ndarray] = []
        self.bias: list[np.ndarray] = []
        self.grad_weight: list[np.ndarray] = []
        self.grad_bias: list[np.ndarray] = []
        offset = 0
        for w, b in weights:
            for source, views, grad_views in ((w, self.weight, self.grad_weight), (b, self.bias, self.grad_bias)):
                part = slice(offset, offset + source.size)
                self.params[part] = source.ravel()
                views.append(self.params[part].reshape(source.shape))
                grad_views.append(self.grads[part].reshape(source.shape))
                offset += source.size
        self.out = [np.empty((batch, w.shape[0]), np.float32) for w, _ in weights]  # hidden ones after ReLU
        self.grad_hidden = [np.empty_like(h) for h in self.out[:-1]]
        self.mask = [np.empty(h.shape, bool) for h in self.out[:-1]]
        self.rows = np.arange(batch)
        self.row = np.empty((batch, 1), np.float32)
        self.scratch = np.empty(total, np.float32)
        self.update = {"sgd": self._sgd, "adam": self._adam}[optimizer]
        # Adam moments kept divided by (1 - beta): m' = b1·m' + g, v' = b2·v' + g², one pass fewer each;
        # the constants fold into the update's scalars.
        if optimizer == "adam":
            self.m = np.zeros(total, np.float32)
            self.v = np.zeros(total, np.float32)
        self.beta1, self.beta2 = betas
        self.eps = eps
        self.t = 0

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        out, last = self.out, len(self.out) - 1
        a = x
        for i, (w, b) in enumerate(zip(self.weight, self.bias, strict=True)):
            np.matmul(a, w.T, out=out[i])
            out[i] += b
            if i < last:
                np.maximum(out[i], 0, out=out[i])
            a = out[i]
        z = out[last]
        np.max(z, axis=1, keepdims=True, out=self.row)
        z -= self.row
        picked = float(z[self.rows, y].sum())
        np.exp(z, out=z)
        np.sum(z, axis=1, keepdims=True, out=self.row)
        z /= self.row
        np.log(self.row, out=self.row)
        loss = (float(self.row.sum()) - picked) / len(y)

        z[self.rows, y] -= 1.0  # dL/dlogits = (softmax - one_hot) / N, over the softmax
        z *= 1.0 / len(y)
        g = z
        for i in range(last, -1, -1):
            np.matmul(g.T, out[i - 1] if i else x, out=self.grad_weight[i])
            np.sum(g, axis=0, out=self.grad_bias[i])
            if i:
                gh, mask = self.grad_hidden[i - 1], self.mask[i - 1]
                np.matmul(g, self.weight[i], out=gh)
                np.greater(out[i - 1], 0, out=mask)
                np.multiply(gh, mask, out=gh)
                g = gh
        self.update()
        return loss

    def _sgd(self) -> None:
        np.multiply(self.grads, SGD_LR, out=self.scratch)
        self.params -= self.scratch

    def _adam(self) -> None:
        self.t += 1
        b1, b2, g, tmp = self.beta1, self.beta2, self.grads, self.scratch
        self.m *= b1
        self.m += g
        np.multiply(g, g, out=tmp)
        self.v *= b2
        self.v += tmp
        # p -= lr/(1-b1ᵗ) · m / (√v / √(1-b2ᵗ) + eps), with m = (1-b1)·m' and v = (1-b2)·v'
        root = math.sqrt((1.0 - b2**self.t) / (1.0 - b2))
        np.sqrt(self.v, out=tmp)
        tmp += self.eps * root
        np.divide(self.m, tmp, out=tmp)
        tmp *= LR * (1.0 - b1) * root / (1.0 - b1**self.t)
        self.params -= tmp


# ---------------------------------------------------------------------------------------------- contenders
def neuroflow_stepper(weights: Weights, batches: Batches, optimizer: str, replay: bool = True) -> Callable[[], float]:
    import neuroflow as nf
    from neuroflow import ops

    layers: list[Any] = []
    for i, (w, b) in enumerate(weights):
        linear = ops.Linear(w.shape[1], w.shape[0])
        linear.weight.data[...] = w
        linear.bias.data[...] = b
        layers += [linear, ops.ReLU()] if i < len(weights) - 1 else [linear]
    update = nf.optim.SGD(lr=SGD_LR) if optimizer == "sgd" else nf.optim.Adam(lr=LR)
    trainer = nf.Trainer(nf.Sequential(*layers), nf.losses.CrossEntropy(), update,
                         batch_size=len(batches[0][0]), progress=False, seed=0, replay_steps=replay)
    data = itertools.cycle(batches)
    return lambda: trainer.train_step(*next(data))


def torch_stepper(weights: Weights, batches: Batches, optimizer: str) -> Callable[[], float]:
    import torch
    import torch.nn.functional as F

    layers: list[torch.nn.Module] = []
    for i, (w, b) in enumerate(weights):
        linear = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w))
            linear.bias.copy_(torch.from_numpy(b))
        layers += [linear, torch.nn.ReLU()] if i < len(weights) - 1 else [linear]
    model = torch.nn.Sequential(*layers)
    # defaults otherwise, as a user writes them
    update = (torch.optim.SGD(model.parameters(), lr=SGD_LR) if optimizer == "sgd"
              else torch.optim.Adam(model.parameters(), lr=LR))
    data = itertools.cycle([(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches])

    def step() -> float:
        xt, yt = next(data)
        update.zero_grad()
        loss = F.cross_entropy(model(xt), yt)
        loss.backward()
        update.step()
        return loss.item()

    return step


def numpy_stepper(weights: Weights, batches: Batches, optimizer: str) -> Callable[[], float]:
    mlp = NumpyMLP(weights, len(batches[0][0]), optimizer)
    data = itertools.cycle(batches)
    return lambda: mlp.step(*next(data))


STEPPERS = {"NeuroFlow": neuroflow_stepper, "PyTorch": torch_stepper, "numpy": numpy_stepper,
            WITHOUT_REPLAY: functools.partial(neuroflow_stepper, replay=False)}
CONTENDERS = {contender_name(f, o): (f, o) for o in OPTIMIZERS for f in (*FRAMEWORKS, WITHOUT_REPLAY)}


def stepper(name: str, batch: int) -> Callable[[], float]:
    framework, optimizer = CONTENDERS[name]
    return STEPPERS[framework](initial_weights(), batch_data(batch), optimizer)


def references(names: list[str]) -> dict[str, str]:
    """Each contender's reference: PyTorch with the same update."""
    return {name: contender_name("PyTorch", CONTENDERS[name][1]) for name in names}


def check_agreement(losses: dict[str, list[float]]) -> None:
    """Raise unless the contenders with one update agree on their first three losses: same data, weights, step."""
    for optimizer in OPTIMIZERS:
        group = {name: v for name, v in losses.items() if CONTENDERS[name][1] == optimizer}
        if not group:
            continue
        reference_name, reference = next(iter(group.items()))
        for name, values in group.items():
            for step, (a, b) in enumerate(zip(values, reference, strict=True)):
                tolerance = 1e-4 if step == 0 else 1e-2  # float32 sums differ in order; Adam amplifies that a little
                if abs(a - b) > tolerance * abs(b):
                    raise RuntimeError(f"{name} loss at step {step + 1} is {a:.6f}, {reference_name} gives {b:.6f}; "
                                       "the contenders do not compute the same step")


# ---------------------------------------------------------------------------------------------- one process
def one_process_child(args: argparse.Namespace) -> None:
    """Every contender in this process (started with the thread variables set), timed interleaved; one JSON line."""
    steppers = {name: stepper(name, args.batch) for name in args.contender_names}
    results, threads = harness.measure_in_child({"step": steppers}, args, check_agreement)
    harness.print_child_line(results["step"], threads)


# ---------------------------------------------------------------------------------------------- separate processes
def worker(args: argparse.Namespace) -> None:
    """One contender alone in this process: measure RSS through its first steps, then serve timed blocks.

    RSS is read after setup (imports, data, model, optimizer), as the peak of the first step (which
    allocates gradients, optimizer state and activations) and as the peak of every later untimed step.
    """
    name, batch, threads = args.contender, args.batch, args.threads_child
    info = harness.worker_info(name, threads, CONTENDERS[name][0] == "PyTorch", batch=batch)
    harness.start_worker(stepper(name, batch), args.warmup, info)


def measure_separately(threads: int, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """Start one worker per contender at ``threads`` threads and time them in interleaved rounds."""
    workers: dict[str, harness.Worker] = {}
    try:
        for name in args.contender_names:
            workers[name] = harness.Worker(
                [__file__, "--child", "--contender", name, "--batch", str(batch),
                 "--threads-child", str(threads), "--warmup", str(args.warmup)],
                env=harness.thread_env(threads),
            )
        check_agreement({name: w.info["first_losses"] for name, w in workers.items()})
        samples = harness.interleave({name: functools.partial(w.run, args.steps, args.settle) for name, w in workers.items()},
                                     args.repeats, harness.pause_for(threads, args.pause))
    finally:
        for w in workers.values():
            w.close()
    return {"batch": batch, "threads": threads, "samples_s": samples, "workers": {n: w.info for n, w in workers.items()}}


def memory_table(results: list[dict[str, Any]]) -> str:
    headers = ["batch", "threads", "contender", "RSS after setup MB", "first step rise MB", "later steps rise MB",
               "first step rise / PyTorch"]
    rows = []
    for result in results:
        workers = result["workers"]
        for name, m in workers.items():
            reference = workers.get(references([name])[name], {}).get("first_step_rise_kb")
            first = m["first_step_rise_kb"]
            rows.append([
                result["batch"], result["threads"], name, f"{m['rss_setup_kb'] / 1024:.1f}",
                "—" if first is None else f"{first / 1024:.2f}", f"{m['later_step_rise_kb'] / 1024:.2f}",
                f"{first / reference:.2f}×" if first is not None and reference else "—",
            ])
    return harness.markdown_table(headers, rows)


# ---------------------------------------------------------------------------------------------- parent
def run_all(args: argparse.Namespace) -> dict[str, Any]:
    batches = [int(b) for b in args.batches.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    child = [*harness.timing_argv(args), "--names", "|".join(args.contender_names)]
    load_before = harness.machine_load()
    results = [{"batch": b, **harness.one_process_run(__file__, t, [*child, "--batch", str(b)])}
               for t in threads for b in batches]
    separate = [measure_separately(t, b, args) for t in threads for b in batches] if args.separate_processes else []
    report: dict[str, Any] = {
        "settings": {"repeats": args.repeats, "steps_per_block": args.steps, "warmup": args.warmup, "settle": args.settle,
                     "batches": batches, "threads": threads, "contenders": args.contender_names},
        "source": harness.source_version(os.path.dirname(os.path.abspath(__file__))),
        "load_average_before": load_before, "load_average_after": harness.machine_load(),
        "results": results,
    }
    refs = references(args.contender_names)
    report["timing_table"] = harness.ratio_table(results, refs, keys=("batch", "threads"))
    report["summary"] = harness.summary("mlp", results, refs, keys=("batch", "threads"))
    if separate:
        report["separate_processes"] = separate
        report["separate_timing_table"] = harness.ratio_table(separate, refs, keys=("batch", "threads"))
        report["memory_table"] = memory_table(separate)
        report["summary"]["separate_processes"] = harness.summary("", separate, refs, ("batch", "threads"))["results"]
    return report


def numpy_ratios(result: dict[str, Any]) -> str:
    """NeuroFlow over hand-written numpy, per update: what the per-step overhead of the runtime costs."""
    samples, parts = result["samples_s"], []
    for optimizer in OPTIMIZERS:
        ours, floor = contender_name("NeuroFlow", optimizer), contender_name("numpy", optimizer)
        if ours in samples and floor in samples:
            ratio = harness.summarise(samples[ours])["median"] / harness.summarise(samples[floor])["median"]
            parts.append(f"{LABELS[optimizer]} {ratio:.2f}×")
    return ", ".join(parts)


def print_report(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(f"MLP {'-'.join(map(str, SIZES))} train step (SGD lr {SGD_LR:g}; Adam lr {LR:g}), float32. Every contender "
          f"in one process per (threads, batch), interleaved: median of {s['repeats']} repeats × "
          f"{s['steps_per_block']} steps, after {3 + s['warmup']} untimed steps (and {s['settle']} at the start of "
          f"each block)")
    first = report["results"][0]
    for result in report["results"]:
        print(f"  batch {result['batch']}, threads={result['threads']}, {result['pause_s']} s idle before each block: "
              f"{harness.describe_threads(result['thread_report'])}; NeuroFlow / numpy: {numpy_ratios(result)}")
    print(f"  code {report['source']}, numpy {first['numpy']}, torch {first['torch']}; load average before "
          f"{report['load_average_before']}, after {report['load_average_after']}; ratio = ratio of medians to "
          "PyTorch with the same update; per-repeat ratio = median of the ratios within a repeat; "
          "spread = interquartile range / median\n")
    print(report["timing_table"])
    if "separate_processes" in report:
        print("\nSecond view, each contender alone in its own process (thread variables set before the libraries "
              "load)\n")
        print(report["separate_timing_table"])
        print("\nRSS, measured in each contender's own process: rise of the peak over RSS after setup during the first "
              "step, and over RSS after the first step during the later untimed steps\n")
        print(report["memory_table"])
    print("\n" + json.dumps(report["summary"]), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repeats and steps: a smoke test, not a measurement")
    parser.add_argument("--json", metavar="FILE", help="write settings, every sample and the tables to FILE")
    parser.add_argument("--batches", default="64", help="comma-separated batch sizes (default 64)")
    parser.add_argument("--threads", default="1", help="comma-separated thread counts (default 1)")
    parser.add_argument("--optimizers", default=",".join(OPTIMIZERS),
                        help=f"comma-separated updates, some of {','.join(OPTIMIZERS)} (default both)")
    parser.add_argument("--repeats", "--rounds", dest="repeats", type=int,
                        help="interleaved repetitions: one block per contender each (default 50; 5 with --quick)")
    parser.add_argument("--steps", type=int, help="steps per timed block (default 10 with or without --quick)")
    parser.add_argument("--warmup", type=int, help="untimed steps per contender first (default 20; 3 with --quick)")
    parser.add_argument("--pause", type=float,
                        help="seconds idle before each block, so the previous contender's spinning BLAS/OpenMP threads "
                             f"go to sleep (default {harness.SPIN_PAUSE_S} above one thread, 0 at one)")
    harness.add_settle_argument(parser)
    parser.add_argument("--without-replay", action="store_true",
                        help="also NeuroFlow with replay_steps=False (its ops run every step)")
    parser.add_argument("--separate-processes", action="store_true",
                        help="also time each contender alone in its own process (second view, with RSS)")
    # Internal: how the parent starts a child process.
    parser.add_argument("--one-process-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads-child", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--contender", choices=list(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--names", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = (5, 10, 3) if args.quick else (50, 10, 20)
    for name, default in zip(("repeats", "steps", "warmup"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--repeats and --steps must be at least 1, --warmup at least 0")
    total = 3 + args.warmup + args.repeats * (args.settle + args.steps)
    if total > MAX_STEPS:
        parser.error(f"each contender would run {total} steps (3 + warmup + repeats × (settle + steps)); keep it at most "
                     f"{MAX_STEPS}: later steps time float32 denormals in Adam's state, not a training step")
    optimizers = [o for o in args.optimizers.split(",") if o]
    if not optimizers or any(o not in OPTIMIZERS for o in optimizers):
        parser.error(f"--optimizers {args.optimizers!r}: expected some of {','.join(OPTIMIZERS)}")
    has_torch = importlib.util.find_spec("torch") is not None
    frameworks = [*FRAMEWORKS[:1], WITHOUT_REPLAY, *FRAMEWORKS[1:]] if args.without_replay else list(FRAMEWORKS)
    args.contender_names = (args.names.split("|") if args.names else
                            [contender_name(f, o) for o in optimizers for f in frameworks if f != "PyTorch" or has_torch])
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one_process_child is not None:
        one_process_child(args)
        return 0
    if args.child:
        worker(args)
        return 0
    return harness.emit(run_all(args), print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
