"""NeuroFlow ``cuda`` vs PyTorch CUDA eager: MLP (batch 64), small CNN (batch 64), ResNet-18 (batch 128).

Same models and weights as ``mlp.py``/``cnn.py``/``resnet18.py``, float32, one step = forward, cross-entropy
read back as a float, backward, SGD (lr 0.01, momentum 0.9). Each contender runs in its own worker
process (NeuroFlow cuda, PyTorch cuda, and NeuroFlow cpu for the cpu/cuda speed ratio); blocks of steps
are timed inside the worker between device synchronisations, interleaved round by round; medians.

Device memory: PyTorch's ``torch.cuda.max_memory_allocated()``; NeuroFlow's device memory in use after the
first steps as the driver reports it (``mem_info``), which holds the arena, the flat parameter, gradient
and optimizer buffers and the scratch pool's cached blocks (steady state keeps all of them, so this is
the step's peak up to temporaries over 8 MiB, which are freed at once).

    python benchmarks/gpu.py                 # a few minutes on a GPU
    python benchmarks/gpu.py --quick --json gpu.json
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import harness

LR, MOMENTUM = 0.01, 0.9


def mlp_neuroflow() -> Any:
    import neuroflow as nf
    from neuroflow import ops

    return nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))


def mlp_torch(state: dict[str, np.ndarray]) -> Any:
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})
    return model


def cases() -> dict[str, tuple[int, tuple[int, ...], Callable[[], Any], Callable[[dict[str, np.ndarray]], Any]]]:
    import cnn
    import resnet18

    return {
        "MLP 784-128-64-10": (64, (784,), mlp_neuroflow, mlp_torch),
        "small CNN": (64, (3, 32, 32), cnn.build_neuroflow, cnn.build_torch),
        "ResNet-18 (CIFAR)": (128, (3, 32, 32), resnet18.build_neuroflow, resnet18.build_torch),
    }


def batch_data(batch: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((batch, *shape)).astype(np.float32), rng.integers(0, 10, batch)


# ---------------------------------------------------------------------------------------------- worker
def neuroflow_worker(case: str, device: str) -> tuple[Callable[[], float], Callable[[], None], dict[str, Any]]:
    import neuroflow as nf

    batch, shape, build, _ = cases()[case]
    nf.manual_seed(0)
    trainer = nf.Trainer(build(), nf.losses.CrossEntropy(), nf.optim.SGD(lr=LR, momentum=MOMENTUM), device=device,
                         batch_size=batch, progress=False, seed=0)
    x, y = batch_data(batch, shape)
    backend = trainer.backend
    info: dict[str, Any] = {}
    if device.startswith("cuda"):
        mem = backend.cupy.cuda.Device(backend.index)
        backend.synchronize()
        info["used_before"] = mem.mem_info[1] - mem.mem_info[0]
    return (lambda: trainer.train_step(x, y)), backend.synchronize, info


def torch_worker(case: str) -> tuple[Callable[[], float], Callable[[], None], dict[str, Any]]:
    import torch
    import torch.nn.functional as F

    import neuroflow as nf

    batch, shape, build, build_torch = cases()[case]
    nf.manual_seed(0)
    model = build_torch(build().state_dict()).cuda().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    x, y = batch_data(batch, shape)
    xt, yt = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    torch.cuda.reset_peak_memory_stats()

    def step() -> float:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xt), yt)
        loss.backward()
        optimizer.step()
        return loss.item()

    return step, torch.cuda.synchronize, {"torch": str(torch.__version__)}


def worker(args: argparse.Namespace) -> None:
    name = args.contender
    step, sync, info = torch_worker(args.case) if name == "PyTorch cuda" else \
        neuroflow_worker(args.case, "cuda:0" if name == "NeuroFlow cuda" else "cpu")
    losses = [step() for _ in range(3)]
    for _ in range(args.warmup if name != "NeuroFlow cpu" else min(args.warmup, 1)):  # cpu steps are slow
        step()
    sync()
    if name == "PyTorch cuda":
        import torch

        info["peak_device_bytes"] = int(torch.cuda.max_memory_allocated())
    elif name == "NeuroFlow cuda":
        import cupy

        free, total = cupy.cuda.Device(0).mem_info
        info["peak_device_bytes"] = int(total - free - info.pop("used_before"))
    print(json.dumps({"contender": name, "first_losses": losses, **info}), flush=True)

    def timed(steps: int) -> None:
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        print(repr((time.perf_counter() - start) / steps), flush=True)

    for line in sys.stdin:
        if not line.strip():
            break
        timed(int(line))


# ---------------------------------------------------------------------------------------------- parent
def gpu_missing() -> str | None:
    """Why this benchmark cannot run here, or None."""
    if importlib.util.find_spec("neuroflow_cuda") is None:
        return "neuroflow-cuda is not installed (pip install -e neuroflow-cuda)"
    from neuroflow_cuda import unavailable_reason

    return unavailable_reason()


def torch_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def measure(case: str, args: argparse.Namespace, names: list[str]) -> dict[str, Any]:
    workers: dict[str, harness.Worker] = {}
    try:
        for name in names:
            workers[name] = harness.Worker([__file__, "--child", "--case", case, "--contender", name,
                                            "--warmup", str(args.warmup)])
        first = {n: w.info["first_losses"][0] for n, w in workers.items()}
        if max(first.values()) - min(first.values()) > 1e-3 * max(1.0, abs(first[names[0]])):
            raise RuntimeError(f"{case}: first losses disagree {first}: the contenders do not compute the same step")
        steps = {n: (args.cpu_steps if n == "NeuroFlow cpu" else args.steps) for n in names}
        samples = harness.interleave({n: functools.partial(w.run, steps[n]) for n, w in workers.items()},
                                     args.rounds, args.pause)
    finally:
        for w in workers.values():
            w.close()
    return {"case": case, "samples_s": samples, "workers": {n: w.info for n, w in workers.items()}}


def table(results: list[dict[str, Any]]) -> str:
    rows = []
    for r in results:
        s, w = r["samples_s"], r["workers"]
        med = {n: harness.summarise(v)["median"] for n, v in s.items()}
        torch_ms = f"{med['PyTorch cuda'] * 1e3:.2f}" if "PyTorch cuda" in med else "—"
        ratio = f"{harness.paired_ratio(s['NeuroFlow cuda'], s['PyTorch cuda']):.2f}×" if "PyTorch cuda" in s else "—"
        cpu = f"{med['NeuroFlow cpu'] / med['NeuroFlow cuda']:.1f}×" if "NeuroFlow cpu" in med else "—"
        nf_mb = w["NeuroFlow cuda"]["peak_device_bytes"] / 2**20
        torch_mb = w["PyTorch cuda"]["peak_device_bytes"] / 2**20 if "PyTorch cuda" in w else None
        rows.append([r["case"], f"{med['NeuroFlow cuda'] * 1e3:.2f}", torch_ms, ratio, cpu, f"{nf_mb:.1f}",
                     "—" if torch_mb is None else f"{torch_mb:.1f}",
                     "—" if not torch_mb else f"{nf_mb / torch_mb:.2f}×"])
    return harness.markdown_table(["model", "NeuroFlow cuda ms", "PyTorch cuda ms", "NeuroFlow/PyTorch",
                                   "cpu/cuda", "NeuroFlow MB", "PyTorch MB", "memory ratio"], rows)


def print_report(report: dict[str, Any]) -> None:
    print(f"NeuroFlow cuda vs PyTorch CUDA eager, float32, SGD momentum; median of {report['rounds']} interleaved "
          f"rounds × {report['steps']} steps (cpu: {report['cpu_steps']}) after {3 + report['warmup']} untimed steps; "
          f"device: {report['device']}\n")
    print(report["table"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="few rounds: a smoke test, not a measurement")
    parser.add_argument("--json", metavar="FILE", help="write every sample and the table to FILE")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 10; 3 with --quick)")
    parser.add_argument("--steps", type=int, help="steps per timed GPU block (default 20; 5 with --quick)")
    parser.add_argument("--cpu-steps", type=int, default=1, help="steps per timed cpu block (default 1)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (default 10; 2 with --quick)")
    parser.add_argument("--no-cpu", action="store_true", help="leave out the cpu contender (and the cpu/cuda ratio)")
    parser.add_argument("--pause", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--case", help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    harness.fill_defaults(args, {"rounds": (3, 10), "steps": (5, 20), "warmup": (2, 10)})
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        worker(args)
        return 0
    missing = gpu_missing()
    if missing is not None:
        print(f"benchmarks/gpu.py needs an NVIDIA GPU with CuPy; skipped: {missing}")
        return 0
    names = ["NeuroFlow cuda", *(["PyTorch cuda"] if torch_cuda() else []), *([] if args.no_cpu else ["NeuroFlow cpu"])]
    from neuroflow.backends.selection import get_backend

    device = get_backend("cuda:0").describe()["device"]
    results = [measure(case, args, names) for case in cases()]
    report = {"device": device, "contenders": names, "rounds": args.rounds, "steps": args.steps,
              "cpu_steps": args.cpu_steps, "warmup": args.warmup, "results": results, "table": table(results)}
    return harness.emit(report, print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
