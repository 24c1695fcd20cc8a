"""The layout pass on the spec's small CNN: NCHW as written vs NHWC hints vs PyTorch, one process, interleaved.

Contenders, each a training step (forward, loss, backward, SGD lr 0.01) on the same batch of 64 3×32×32
images, timed in rounds that run every contender once, so load on a shared machine hits them alike:

- ``written``: the spec's snippet, no layout argument (the Trainer's layout pass runs it in NHWC between the
  first convolution and one conversion before Flatten);
- ``unplanned``: the same model with the pass switched off (every convolution permutes NCHW in and out);
- ``hints``: the hand-tuned model (``output_layout="NHWC"`` / ``layout="NHWC"``, linear weight columns permuted);
- ``torch``: PyTorch CPU eager, the same weights (skipped when torch is not installed).

Each round runs the contenders in a new order: a step right after PyTorch's finds PyTorch's threads still
spinning, and one right after another NeuroFlow step finds that step's memory in the caches.

    .venv/bin/python benchmarks/layout_pass.py                  # 2 threads, 30 rounds
    .venv/bin/python benchmarks/layout_pass.py --device opencl  # the three NeuroFlow contenders on opencl
    .venv/bin/python benchmarks/layout_pass.py --threads 1 --rounds 10

Prints each contender's median step and the median over rounds of its time over PyTorch's (or, without
PyTorch, over ``unplanned``'s), in wall-clock and in process CPU time (on a loaded machine the CPU time of
a one-thread run moves least; at two threads it counts the time a waiting thread spins).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(args.threads)
    import neuroflow as nf
    from neuroflow import ops

    session = importlib.import_module("neuroflow.trainer.session")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((64, 3, 32, 32)).astype(np.float32), rng.integers(0, 10, 64)

    def written() -> Any:
        nf.manual_seed(0)
        return nf.Sequential(ops.Conv2d(3, 32, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
                             ops.Conv2d(32, 64, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
                             ops.Flatten(), ops.Linear(4096, 10))

    def hinted() -> Any:
        model = nf.Sequential(ops.Conv2d(3, 32, 3, padding=1, output_layout="NHWC"), ops.ReLU(),
                              ops.MaxPool2d(2, layout="NHWC"), ops.Conv2d(32, 64, 3, padding=1, layout="NHWC"),
                              ops.ReLU(), ops.MaxPool2d(2, layout="NHWC"), ops.Flatten(), ops.Linear(4096, 10))
        state = {k: np.array(v) for k, v in written().state_dict().items()}
        state["7.weight"] = state["7.weight"].reshape(10, 64, 8, 8).transpose(0, 2, 3, 1).reshape(10, 4096)
        model.load_state_dict(state)
        return model

    def trainer(model: Any) -> Callable[[], Any]:
        t = nf.Trainer(model, optimizer=nf.optim.SGD(lr=0.01), batch_size=64, progress=False, seed=0, device=args.device)
        return lambda: t.train_step(x, y)

    steps = {"written": trainer(written()), "hints": trainer(hinted())}
    for step in steps.values():  # the first step packs the model, plans its layouts and traces its memory
        step()
    planner, session.plan_layouts = session.plan_layouts, lambda model: 0
    steps["unplanned"] = trainer(written())
    steps["unplanned"]()  # packed without the pass
    session.plan_layouts = planner
    reference = "unplanned"
    if args.device == "cpu":
        try:
            steps["torch"] = torch_step(written().state_dict(), x, y, args.threads)
            reference = "torch"
        except ImportError:
            pass
    for step in steps.values():
        for _ in range(3):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    cpu: dict[str, list[float]] = {name: [] for name in steps}
    order = np.random.default_rng(0)
    for _ in range(args.rounds):
        # a new order each round: a step right after PyTorch's finds its threads still spinning
        for name in order.permutation(list(steps)):
            step = steps[name]
            start, start_cpu = time.perf_counter(), time.process_time()
            step()
            times[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    base, base_cpu = np.array(times[reference]), np.array(cpu[reference])
    for name, seconds in times.items():
        ratio = float(np.median(np.array(seconds) / base))
        cpu_ratio = float(np.median(np.array(cpu[name]) / base_cpu))
        print(f"{name:10s} {np.median(seconds) * 1e3:8.1f} ms  ×{ratio:.3f} {reference}   "
              f"cpu {np.median(cpu[name]) * 1e3:8.1f} ms  ×{cpu_ratio:.3f}")
    hints = np.array(times["hints"])
    print("over hints:", ", ".join(f"{name} ×{np.median(np.array(times[name]) / hints):.3f}"
                                   for name in ("written", "unplanned")))
    print(f"{args.device}, {args.threads} thread(s), {args.rounds} rounds; load average {os.getloadavg()}")
    return 0


def torch_step(state: dict[str, Any], x: np.ndarray, y: np.ndarray, threads: int) -> Callable[[], Any]:
    """PyTorch's step on the same model and weights."""
    import torch

    torch.set_num_threads(threads)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                torch.nn.Flatten(), torch.nn.Linear(4096, 10))
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = torch.nn.CrossEntropyLoss()
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step() -> None:
        optimizer.zero_grad(set_to_none=False)
        loss(model(tx), ty).backward()
        optimizer.step()

    return step


if __name__ == "__main__":
    sys.exit(main())
