"""The qualification child: ``python -m neuroflow.probe BACKEND INDEX [--time STEPS] [--class MODULE:NAME]``.

Runs in a process of its own (``neuroflow.backends.qualification`` starts it), so that a driver that crashes
or hangs takes only this process with it. On raw device INDEX of BACKEND it runs the backend's own kernel
set (``Backend.self_test``), then trains a small MLP with SGD (momentum) and with Adam, checking every loss
and the final weights against the cpu backend, and with ``--time`` times that many training steps for
``NEUROFLOW_BACKEND=auto``. Each stage is announced on stdout before it starts, as a line
``NEUROFLOW-PROBE {"stage": ...}``, so the parent can name the stage a crash happened in; the last line is
``NEUROFLOW-PROBE {"status": "ok" | "wrong" | "failed", ...}``.
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import importlib
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import neuroflow as nf
from neuroflow import registry
from neuroflow.backends.qualification import PREFIX

#: Relative agreement asked of float32 training against cpu over a few steps (rounding differs per kernel).
RTOL = 2e-4
ATOL = 1e-5


def emit(**message: Any) -> None:
    print(PREFIX + json.dumps(message), flush=True)


def stage(name: str) -> None:
    emit(stage=name)


def _trainer(optimizer: Callable[[], Any], device: Any) -> Any:
    nf.manual_seed(0)  # the same initial weights on every device
    model = nf.Sequential(nf.ops.Linear(784, 128), nf.ops.ReLU(), nf.ops.Linear(128, 10))
    return nf.Trainer(model, optimizer=optimizer(), device=device, batch_size=64, progress=False, seed=0)


def check_training(backend: Any, report: Callable[[str], None]) -> None:
    """A few steps of an MLP with each optimizer on ``backend`` and on cpu agree (losses and weights)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 784)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    optimizers = {"sgd": lambda: nf.optim.SGD(lr=0.05, momentum=0.9), "adam": lambda: nf.optim.Adam(lr=1e-3)}
    for name, optimizer in optimizers.items():
        report(f"train mlp {name}")
        ours, reference = _trainer(optimizer, backend), _trainer(optimizer, "cpu")
        for step in range(3):
            got, want = ours.train_step(x, y), reference.train_step(x, y)
            if not np.isclose(got, want, rtol=RTOL, atol=ATOL):
                raise AssertionError(f"training an MLP with {name}: loss {got!r} at step {step}, cpu gives {want!r}")
        got_w, want_w = ours.predict(x), reference.predict(x)
        error = float(np.max(np.abs(got_w - want_w)))
        if not np.allclose(got_w, want_w, rtol=RTOL, atol=10 * ATOL):
            raise AssertionError(f"training an MLP with {name}: predictions differ from cpu by up to {error:.3g}")


def time_steps(backend: Any, steps: int) -> float:
    """Median seconds of one training step (MLP 784-128-10, batch 64, SGD) after warm-up."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 784)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    trainer = _trainer(lambda: nf.optim.SGD(lr=0.01), backend)
    for _ in range(3):  # compiles kernels, plans the arena
        trainer.train_step(x, y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        trainer.train_step(x, y)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _die_with_parent() -> None:
    """On Linux, have the kernel kill this process when the parent that started it dies (kill -9, Ctrl-C
    while it waits): the child runs in a session of its own, so its parent's process group is not its own."""
    if not sys.platform.startswith("linux"):
        return  # elsewhere --deadline bounds an orphan
    parent = os.getppid()
    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before the request was made
        os._exit(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neuroflow.probe", description=__doc__.splitlines()[0])
    parser.add_argument("backend")
    parser.add_argument("index", type=int)
    parser.add_argument("--time", type=int, default=0, metavar="STEPS", help="also time this many training steps")
    parser.add_argument("--class", dest="cls", metavar="MODULE:NAME",
                        help="the backend class, for one registered at run time rather than by entry point")
    parser.add_argument("--deadline", type=float, default=0, metavar="SECONDS",
                        help="end this process after SECONDS, stuck in a driver or not (0: never)")
    args = parser.parse_args(argv)
    _die_with_parent()
    faulthandler.enable()  # a crash prints the Python stack to stderr, which the parent quotes
    if args.deadline > 0:
        faulthandler.dump_traceback_later(args.deadline, exit=True)
    try:
        stage("load")
        if args.cls:
            module, _, qualname = args.cls.partition(":")
            cls: Any = importlib.import_module(module)
            for part in qualname.split("."):
                cls = getattr(cls, part)
            registry.backends.register(args.backend, cls)
        else:
            cls = registry.backends.get(args.backend)
        stage("open device")
        backend = cls(args.index)
        if cls.needs_qualification:
            backend.self_test(stage)
            check_training(backend, stage)
        result: dict[str, Any] = {}
        if args.time:
            stage("time")
            result["step_seconds"] = time_steps(backend, args.time)
    except AssertionError as exc:
        emit(status="wrong", detail=str(exc))
        return 3
    except Exception as exc:  # the parent reports it: this device cannot train here
        emit(status="failed", detail=f"{type(exc).__name__}: {exc}")
        return 4
    emit(status="ok", **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
