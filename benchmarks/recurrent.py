"""Recurrent ops: WaveletElman's precomputed transform vs rebuilding it every step; Elman/GRU/LSTM vs PyTorch.

    python benchmarks/recurrent.py                # full run, a few minutes
    python benchmarks/recurrent.py --quick        # smoke test
    python benchmarks/recurrent.py --threads 1    # BLAS/OpenMP/torch threads (default 2)

1. WaveletElman with the db4 transform matrix built once per window length, against the same op
   rebuilding the transform's Jacobian (that matrix) from the filters in every backward: the
   per-step work the precomputed map removes. Timed for a whole training step (forward + backward,
   many-to-one) and for the transform's backward alone (the input gradient from the bands').
2. One training step (forward + BPTT through every step, many-to-many, float32, fixed output
   gradient) of Elman, GRU and LSTM against torch.nn.RNN / GRU / LSTM (batch_first) on the CPU,
   same weights and data.

Every contender runs alone in a fresh process with its thread counts set before numpy or torch
load (harness.Worker: thread pools of two libraries in one process starve each other); the parent
times blocks of steps interleaved round by round and reports medians and the median per-round
ratio. A ratio below 1 means the first contender is faster.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import harness

WAVELET_CASES = [  # (batch, window, features, hidden, levels)
    (32, 32, 1, 16, 2),
    (64, 64, 2, 32, 3),
    (32, 128, 1, 32, 4),
]
TORCH_SIZES = [  # (batch, time, features, hidden)
    (16, 16, 4, 16),
    (32, 32, 16, 64),
    (64, 64, 32, 128),
]
TORCH_MODULES = {"Elman": "RNN", "GRU": "GRU", "LSTM": "LSTM"}


# ---------------------------------------------------------------------------------------------- steps
def wavelet_stepper(contender: str, case: list[int]) -> tuple[Callable[[], Any], float]:
    from neuroflow import manual_seed, ops
    from neuroflow_ops_recurrent import wavelet

    class RebuildingWaveletElman(ops.WaveletElman):  # type: ignore[misc, name-defined]
        """Builds the transform from the db4 filters in every backward, as a per-step Jacobian would be."""

        def _transform_grad(self, grad_u: Any) -> Any:
            self._transforms.clear()
            for cached in (wavelet.dwt_matrix, wavelet.mra_matrices, wavelet.window_transform):
                cached.cache_clear()
            return super()._transform_grad(grad_u)

    batch, window, features, hidden, levels = case
    manual_seed(0)
    part, variant = contender.split("-")
    op = _pooled((ops.WaveletElman if variant == "precomputed" else RebuildingWaveletElman)(features, hidden, levels=levels))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, window, features)).astype(np.float32)
    g = rng.standard_normal((batch, hidden)).astype(np.float32)
    grad_bands = rng.standard_normal((batch, window, op.cell_input_size)).astype(np.float32)

    def step() -> Any:
        op.zero_grad()
        op.forward(x)
        return op.backward(g)

    def transform_backward() -> Any:
        return op._transform_grad(grad_bands)

    run = step if part == "step" else transform_backward
    return run, float(np.abs(run()).sum())


def neuroflow_stepper(name: str, size: list[int]) -> tuple[Callable[[], Any], float]:
    from neuroflow import manual_seed, ops

    batch, time_steps, features, hidden = size
    manual_seed(0)
    op = _pooled(getattr(ops, name)(features, hidden, return_sequences=True))
    x, g = _sequence_data(size)

    def step() -> Any:
        op.zero_grad()
        op.forward(x)
        return op.backward(g)

    return step, float(np.abs(step()).sum())


def torch_stepper(name: str, size: list[int]) -> tuple[Callable[[], Any], float]:
    import torch

    from neuroflow import manual_seed, ops

    batch, time_steps, features, hidden = size
    manual_seed(0)  # the same initial weights as the NeuroFlow contender, copied by name
    state = getattr(ops, name)(features, hidden).state_dict()
    module = getattr(torch.nn, TORCH_MODULES[name])(features, hidden, batch_first=True)
    module.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    x, g = _sequence_data(size)
    tx, tg = torch.from_numpy(x).requires_grad_(True), torch.from_numpy(g)

    def step() -> Any:
        module.zero_grad(set_to_none=False)
        tx.grad = None
        y, _ = module(tx)
        y.backward(tg)
        return tx.grad

    return step, float(step().abs().sum())


def _sequence_data(size: list[int]) -> tuple[np.ndarray, np.ndarray]:
    batch, time_steps, features, hidden = size
    rng = np.random.default_rng(1)
    return (rng.standard_normal((batch, time_steps, features)).astype(np.float32),
            rng.standard_normal((batch, time_steps, hidden)).astype(np.float32))


def _pooled(op: Any) -> Any:
    """Attach a buffer pool, as the Trainer does, so steady-state steps reuse their buffers."""
    from neuroflow.allocators.direct import DirectAllocator
    from neuroflow.buffers.pool import BufferPool

    op.attach_pool(BufferPool(DirectAllocator(op.xp)))
    return op


# ---------------------------------------------------------------------------------------------- worker
def worker(args: argparse.Namespace) -> None:
    """One contender alone in this process: build its step, warm up, report, then serve timed blocks."""
    info: dict[str, Any] = {"contender": args.contender, "threads": args.threads, "numpy": np.__version__}
    spec = json.loads(args.spec)
    if args.contender == "PyTorch":
        import torch

        torch.set_num_threads(args.threads)
        info["torch"], info["torch_threads"] = str(torch.__version__), torch.get_num_threads()
        step, checksum = torch_stepper(spec["op"], spec["size"])
    elif args.contender == "NeuroFlow":
        step, checksum = neuroflow_stepper(spec["op"], spec["size"])
    else:
        step, checksum = wavelet_stepper(args.contender, spec["case"])
    for _ in range(args.warmup):
        step()
    start = time.perf_counter()
    step()
    info.update({"checksum": checksum, "step_s": time.perf_counter() - start,
                 "openblas_threads": harness.openblas_threads()})
    print(json.dumps(info), flush=True)
    harness.serve_blocks(step)


# ---------------------------------------------------------------------------------------------- parent
def measure(spec: dict[str, Any], contenders: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """Start one worker per contender, check they compute the same gradient, time interleaved blocks."""
    workers: dict[str, harness.Worker] = {}
    try:
        for name in contenders:
            workers[name] = harness.Worker(
                [__file__, "--child", "--contender", name, "--spec", json.dumps(spec),
                 "--threads", str(args.threads), "--warmup", str(args.warmup)],
                env=harness.thread_env(args.threads),
            )
        sums = {name: w.info["checksum"] for name, w in workers.items()}
        reference = next(iter(sums.values()))
        if any(abs(s - reference) > 1e-3 * abs(reference) for s in sums.values()):
            raise RuntimeError(f"{spec}: the contenders' input gradients differ: {sums}")
        slowest = max(w.info["step_s"] for w in workers.values())
        steps = max(1, int(args.block / slowest))
        samples = harness.interleave({name: functools.partial(w.run, steps) for name, w in workers.items()},
                                     args.rounds, args.pause)
    finally:
        for w in workers.values():
            w.close()
    return {"spec": spec, "steps": steps, "samples_s": samples, "workers": {n: w.info for n, w in workers.items()}}


def wavelet_table(args: argparse.Namespace) -> str:
    rows = []
    for case in WAVELET_CASES[:1] if args.quick else WAVELET_CASES:
        batch, window, features, hidden, levels = case
        for part, label in (("step", "training step"), ("map", "transform backward")):
            pre, rebuilt = f"{part}-precomputed", f"{part}-rebuilt"
            s = measure({"case": case}, [pre, rebuilt], args)["samples_s"]
            rows.append([
                f"B={batch} window={window} F={features} H={hidden} levels={levels}", label,
                f"{harness.summarise(s[pre])['median'] * 1e3:.4f}",
                f"{harness.summarise(s[rebuilt])['median'] * 1e3:.4f}",
                f"{harness.paired_ratio(s[rebuilt], s[pre]):.2f}×",
            ])
    return harness.markdown_table(["shape", "timed", "precomputed ms", "rebuilt ms", "rebuilt / precomputed"], rows)


def torch_table(args: argparse.Namespace) -> str:
    rows = []
    for size in TORCH_SIZES[:2] if args.quick else TORCH_SIZES:
        for name in TORCH_MODULES:
            result = measure({"op": name, "size": size}, ["NeuroFlow", "PyTorch"], args)
            s = result["samples_s"]
            stats = {k: harness.summarise(v) for k, v in s.items()}
            batch, time_steps, features, hidden = size
            rows.append([
                name, f"{batch}×{time_steps}×{features}→{hidden}",
                f"{stats['NeuroFlow']['median'] * 1e3:.3f}", f"{stats['PyTorch']['median'] * 1e3:.3f}",
                f"{harness.paired_ratio(s['NeuroFlow'], s['PyTorch']):.2f}×",
                f"{max(st['spread'] for st in stats.values()) * 100:.0f}%",
            ])
    return harness.markdown_table(["op", "B×T×F→H", "NeuroFlow ms", "PyTorch ms", "NeuroFlow/PyTorch", "spread"], rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and rounds: a smoke test")
    parser.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP/torch threads (default 2)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 15; 3 with --quick)")
    parser.add_argument("--block", type=float, default=0.1, help="seconds per timed block (default 0.1)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per contender first (default 5)")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds idle before each block (default 0.05)")
    # Internal: how the parent starts a worker process.
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rounds is None:
        args.rounds = 3 if args.quick else 15
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        worker(args)
        return
    print(f"recurrent benchmark, {args.threads} threads, median of {args.rounds} interleaved rounds, "
          f"one process per contender; load average before {harness.machine_load()}")
    print("\n## WaveletElman: db4 transform precomputed vs rebuilt in every backward\n")
    print(wavelet_table(args))
    if importlib.util.find_spec("torch") is None:
        print("\nPyTorch is not installed (pip install torch==2.13.0, the CPU build): no comparison.")
        return
    print("\n## Training step (forward + BPTT, many-to-many, float32) vs PyTorch CPU eager\n")
    print(torch_table(args))
    print(f"\nload average after {harness.machine_load()}; spread = largest interquartile range / median")


if __name__ == "__main__":
    main()
