"""MLP 784-128-64-10 training step: NeuroFlow vs PyTorch CPU eager vs a hand-written numpy step.

One step is forward, cross-entropy loss (read back as a Python float), backward and an Adam update
(lr 1e-3, no weight decay) on random MNIST-shaped float32 batches, all three contenders starting from
the same weights on the same batches. Every contender runs in its own fresh worker process per
(thread count, batch), with the BLAS/OpenMP thread variables set before numpy or torch load; the
parent times them in interleaved blocks and reports median per-step times and their ratios. The same
workers report their RSS after setup and its peak during the first and later steps.

    python benchmarks/mlp.py                 # full run (make bench): a minute idle, several when busy
    python benchmarks/mlp.py --quick         # smoke test
    python benchmarks/mlp.py --json out.json # also write every sample
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import harness

SIZES = (784, 128, 64, 10)
LR = 1e-3
CONTENDERS = ("NeuroFlow", "PyTorch", "numpy")
# Steps cycle through this many distinct batches (on one fixed batch the loss is ~0 within 100 steps).
# Even so, units whose ReLU died stop getting gradient, and Adam's first moment of their weights decays
# by beta1 each step into float32 denormals from about step 700: every contender then slows 2-3x
# (measured here) and later rounds would time denormal arithmetic, not a training step. So a worker
# runs at most MAX_STEPS steps.
BATCHES = 32
MAX_STEPS = 600
Weights = list[tuple[np.ndarray, np.ndarray]]
Batches = list[tuple[np.ndarray, np.ndarray]]


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
    """The hand-written reference: the least numpy work one Adam step needs, every buffer preallocated.

    Parameters and gradients are views of two flat buffers, so gradients are written in place (nothing
    to zero or accumulate) and Adam is ten whole-buffer passes; the logits' gradient overwrites the
    softmax; the first layer's input gradient, which nothing needs, is never computed.
    """

    def __init__(self, weights: Weights, batch: int, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
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
        # Adam moments kept divided by (1 - beta): m' = b1·m' + g, v' = b2·v' + g², one pass fewer each;
        # the constants fold into the update's scalars.
        self.m = np.zeros(total, np.float32)
        self.v = np.zeros(total, np.float32)
        self.scratch = np.empty(total, np.float32)
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
        self._adam()
        return loss

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
def neuroflow_stepper(weights: Weights, batches: Batches) -> Callable[[], float]:
    import neuroflow as nf
    from neuroflow import ops

    layers: list[Any] = []
    for i, (w, b) in enumerate(weights):
        linear = ops.Linear(w.shape[1], w.shape[0])
        linear.weight.data[...] = w
        linear.bias.data[...] = b
        layers += [linear, ops.ReLU()] if i < len(weights) - 1 else [linear]
    trainer = nf.Trainer(
        nf.Sequential(*layers), nf.losses.CrossEntropy(), nf.optim.Adam(lr=LR),
        batch_size=len(batches[0][0]), progress=False, seed=0,
    )
    data = itertools.cycle(batches)
    return lambda: trainer.train_step(*next(data))


def torch_stepper(weights: Weights, batches: Batches) -> Callable[[], float]:
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
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)  # defaults, as a user writes it
    data = itertools.cycle([(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches])

    def step() -> float:
        xt, yt = next(data)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xt), yt)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step


def numpy_stepper(weights: Weights, batches: Batches) -> Callable[[], float]:
    mlp = NumpyMLP(weights, len(batches[0][0]))
    data = itertools.cycle(batches)
    return lambda: mlp.step(*next(data))


STEPPERS = {"NeuroFlow": neuroflow_stepper, "PyTorch": torch_stepper, "numpy": numpy_stepper}


# ---------------------------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> None:
    """One contender alone in this process: measure RSS through its first steps, then serve timed blocks.

    RSS is read after setup (imports, data, model, optimizer), as the peak of the first step (which
    allocates gradients, optimizer state and activations) and as the peak of every later untimed step.
    """
    name, batch, threads = args.contender, args.batch, args.threads_child
    info: dict[str, Any] = {"contender": name, "batch": batch, "threads": threads, "numpy": np.__version__}
    if name == "PyTorch":
        import torch

        torch.set_num_threads(threads)
        info["torch"], info["torch_threads"] = str(torch.__version__), torch.get_num_threads()
    step = STEPPERS[name](initial_weights(), batch_data(batch))
    harness.start_worker(step, args.warmup, info)


def check_agreement(losses: dict[str, list[float]], batch: int) -> None:
    """Raise unless every contender's first losses match: same data, same weights, same update."""
    reference_name, reference = next(iter(losses.items()))
    for name, values in losses.items():
        for step, (a, b) in enumerate(zip(values, reference, strict=True)):
            tolerance = 1e-4 if step == 0 else 1e-2  # float32 sums differ in order; Adam amplifies that a little
            if abs(a - b) > tolerance * abs(b):
                raise RuntimeError(
                    f"batch {batch}: {name} loss at step {step + 1} is {a:.6f}, {reference_name} gives {b:.6f}; "
                    "the contenders do not compute the same step"
                )


# ---------------------------------------------------------------------------------------------- parent
def measure(threads: int, batch: int, contenders: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Start one worker per contender at ``threads`` threads and time them in interleaved rounds."""
    workers: dict[str, harness.Worker] = {}
    try:
        for name in contenders:
            workers[name] = harness.Worker(
                [__file__, "--child", "worker", "--contender", name, "--batch", str(batch),
                 "--threads-child", str(threads), "--warmup", str(args.warmup)],
                env=harness.thread_env(threads),
            )
        check_agreement({name: w.info["first_losses"] for name, w in workers.items()}, batch)
        samples = harness.interleave(
            {name: functools.partial(w.run, args.steps) for name, w in workers.items()}, args.rounds, args.pause
        )
    finally:
        for w in workers.values():
            w.close()
    summary = {name: harness.summarise(s) | {"min": min(s)} for name, s in samples.items()}
    # Paired per-round ratios and ratios of minimums: two noise-robust cross-checks of the ratio of medians.
    cross_checks = {
        f"{a}/{b}": {"paired_median": harness.paired_ratio(samples[a], samples[b]),
                     "of_minimums": summary[a]["min"] / summary[b]["min"]}
        for a, b in (("NeuroFlow", "PyTorch"), ("numpy", "PyTorch"), ("NeuroFlow", "numpy"))
        if a in samples and b in samples
    }
    return {"batch": batch, "threads": threads, "samples_s": samples, "summary_s": summary,
            "ratio_cross_checks": cross_checks, "workers": {name: w.info for name, w in workers.items()}}


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    contenders = [c for c in CONTENDERS if c != "PyTorch" or importlib.util.find_spec("torch") is not None]
    batches = [int(b) for b in args.batches.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    load_before = harness.machine_load()
    results = [measure(t, b, contenders, args) for t in threads for b in batches]
    report = {
        "settings": {"rounds": args.rounds, "steps_per_block": args.steps, "warmup": args.warmup,
                     "pause_s": args.pause, "batches": batches, "threads": threads, "contenders": contenders},
        "source": harness.source_version(os.path.dirname(os.path.abspath(__file__))),
        "load_average_before": load_before, "load_average_after": harness.machine_load(),
        "results": results,
    }
    report["timing_table"] = timing_table(results, contenders)
    report["cross_check_table"] = cross_check_table(results)
    report["memory_table"] = memory_table(results, contenders)
    return report


def timing_table(results: list[dict[str, Any]], contenders: list[str]) -> str:
    has_torch = "PyTorch" in contenders
    headers = ["batch", "threads", *(f"{c} ms" for c in contenders)]
    if has_torch:
        headers += ["NeuroFlow/PyTorch", "numpy/PyTorch"]
    headers += ["NeuroFlow/numpy", "spread"]
    rows = []
    for result in results:
        stats = {name: harness.summarise(result["samples_s"][name]) for name in contenders}
        median = {name: stats[name]["median"] for name in contenders}
        row: list[object] = [result["batch"], result["threads"], *(f"{median[c] * 1e3:.3f}" for c in contenders)]
        if has_torch:
            row += [f"{median['NeuroFlow'] / median['PyTorch']:.2f}×", f"{median['numpy'] / median['PyTorch']:.2f}×"]
        row += [f"{median['NeuroFlow'] / median['numpy']:.2f}×",
                f"{max(s['spread'] for s in stats.values()) * 100:.1f}%"]
        rows.append(row)
    return harness.markdown_table(headers, rows)


def cross_check_table(results: list[dict[str, Any]]) -> str:
    pairs = list(results[0]["ratio_cross_checks"])
    headers = ["batch", "threads", *(f"{p} {kind}" for p in pairs for kind in ("paired", "of minimums"))]
    rows = [
        [r["batch"], r["threads"], *(f"{r['ratio_cross_checks'][p][k]:.2f}×" for p in pairs
                                     for k in ("paired_median", "of_minimums"))]
        for r in results
    ]
    return harness.markdown_table(headers, rows)


def memory_table(results: list[dict[str, Any]], contenders: list[str]) -> str:
    has_torch = "PyTorch" in contenders
    headers = ["batch", "threads", "contender", "RSS after setup MB", "first step rise MB", "later steps rise MB"]
    if has_torch:
        headers.append("first step rise / PyTorch")
    rows = []
    for result in results:
        workers = result["workers"]
        reference = workers["PyTorch"]["first_step_rise_kb"] if has_torch else None
        for name in contenders:
            m = workers[name]
            first = m["first_step_rise_kb"]
            row: list[object] = [
                result["batch"], result["threads"], name, f"{m['rss_setup_kb'] / 1024:.1f}",
                "—" if first is None else f"{first / 1024:.2f}", f"{m['later_step_rise_kb'] / 1024:.2f}",
            ]
            if has_torch:
                row.append(f"{first / reference:.2f}×" if first is not None and reference else "—")
            rows.append(row)
    return harness.markdown_table(headers, rows)


def print_report(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(f"MLP {'-'.join(map(str, SIZES))} train step (Adam lr {LR:g}, float32), one process per contender: "
          f"median of {s['rounds']} interleaved rounds × {s['steps_per_block']} steps, "
          f"after {3 + s['warmup']} untimed steps")
    seen = set()
    for result in report["results"]:
        if result["threads"] in seen:
            continue
        seen.add(result["threads"])
        parts = [f"{name}: OpenBLAS {w['openblas_threads']}" + (f", torch {w['torch_threads']}" if "torch" in w else "")
                 for name, w in result["workers"].items()]
        print(f"  threads={result['threads']} as the libraries report them: " + "; ".join(parts))
    versions = next(iter(report["results"]))["workers"]
    torch_version = versions.get("PyTorch", {}).get("torch", "absent")
    print(f"  code {report['source']}, numpy {next(iter(versions.values()))['numpy']}, torch {torch_version}; "
          "load average before "
          f"{report['load_average_before']}, after {report['load_average_after']}; "
          "spread = largest interquartile range / median among the contenders\n")
    print(report["timing_table"])
    print("\nNoise cross-check of the ratios: median of per-round ratios (blocks seconds apart), and ratio of "
          "the fastest blocks; far from the ratios of medians above means the machine was too busy\n")
    print(report["cross_check_table"])
    print("\nRSS, measured in each contender's own process: rise of the peak over RSS after setup during the first "
          "step, and over RSS after the first step during the later untimed steps\n")
    print(report["memory_table"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds and steps: a smoke test, not a measurement")
    parser.add_argument("--json", metavar="FILE", help="write settings, every sample and the tables to FILE")
    parser.add_argument("--batches", default="64,256", help="comma-separated batch sizes (default 64,256)")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 30; 5 with --quick)")
    parser.add_argument("--steps", type=int, help="steps per timed block (default 15; 10 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed steps per contender first (default 20; 3 with --quick)")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds idle before each block (default 0.05)")
    # Internal: how the parent starts a worker process.
    parser.add_argument("--child", choices=["worker"], help=argparse.SUPPRESS)
    parser.add_argument("--threads-child", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = (5, 10, 3) if args.quick else (30, 15, 20)
    for name, default in zip(("rounds", "steps", "warmup"), defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    if args.rounds < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--rounds and --steps must be at least 1, --warmup at least 0")
    total = 3 + args.warmup + args.rounds * args.steps
    if total > MAX_STEPS:
        parser.error(f"each contender would run {total} steps (3 + warmup + rounds × steps); keep it at most "
                     f"{MAX_STEPS}: later steps time float32 denormals in Adam's state, not a training step")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child == "worker":
        worker(args)
        return 0
    report = run_all(args)
    return harness.emit(report, print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
