"""Every qualified OpenCL device against the cpu backend: MLP and small-CNN training steps, SGEMM GFLOP/s.

The contenders are ``cpu`` and ``opencl:0``, ``opencl:1``, ... — every OpenCL device that passed NeuroFlow's
qualification (``neuroflow.backends.qualification.offered``, which checks each device in a child process and
caches the verdict, so the first run on a machine spends about a minute per device qualifying it; the parent
enumerates devices but runs no kernel). Each opencl column is labelled with its driver (``opencl:0 (PoCL 3.1,
LLVM 15)``), and a table of devices gives each one's name, driver string and the vector width its kernels use
(``Device.vector_bytes``, read in the worker, which also reports its driver: the parent checks that the worker's
``opencl:N`` is the device it labelled). Refused devices are listed with the reason and left out.

Training steps: the MLP 784-128-64-10 (Adam, as ``mlp.py`` builds it) and the small CNN (SGD with
momentum, as ``cnn.py`` builds it), batch 64, float32, through ``nf.Trainer(..., device=...)`` as a user
calls it, the same weights and batches on every backend (each device's first three losses must agree with
cpu's to 1e-3). SGEMM: C = A @ B on dense float32 matrices, ``xp.matmul(a, b, out=c)`` with each device's
namespace against ``numpy.matmul`` (OpenBLAS), a block of ``REPEATS`` products followed by one device
synchronisation. Every contender runs in its own fresh worker process (pocl's worker threads keep cores busy
after a kernel and would slow numpy in the same process), with the BLAS/OpenMP thread variables set before
numpy loads; the parent times blocks interleaved round by round (the starting contender rotating) and reports
medians, each device's time over cpu's (ratio of medians, and paired: median of per-round ratios) and the
spread.

    .venv/bin/python benchmarks/backends.py              # ~40 s on 2 cores once the devices are qualified
    .venv/bin/python benchmarks/backends.py --quick      # smoke test; not a measurement
    .venv/bin/python benchmarks/backends.py --json out.json
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import harness

BASELINE = "cpu"
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
        raise RuntimeError(f"{device} matmul {size} disagrees with numpy")

    def step() -> None:
        for _ in range(REPEATS):
            xp.matmul(da, db, out=dc)
        backend.synchronize()

    return step


# ---------------------------------------------------------------------------------------------- devices
def driver_label(platform_version: str) -> str:
    """A short name for an OpenCL driver from its platform version string: ``'OpenCL 3.0 PoCL 3.1+debian  Linux,
    None+Asserts, RELOC, SPIR, LLVM 15.0.6, ...'`` gives ``'PoCL 3.1, LLVM 15'``; another vendor's string loses
    its ``OpenCL x.y`` prefix and is cut to its first three words."""
    pocl = re.search(r"PoCL\s+([0-9][^\s+,]*)", platform_version)
    if pocl:
        llvm = re.search(r"LLVM\s+(\d+)", platform_version)
        return f"PoCL {pocl.group(1)}" + (f", LLVM {llvm.group(1)}" if llvm else "")
    words = re.sub(r"^OpenCL\s+\d+(\.\d+)*\s*", "", platform_version.strip()).replace(",", " ").split()
    return " ".join(words[:3]) or "unknown driver"


def opencl_devices() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(qualified, refused) OpenCL devices, from ``qualification.offered``: its checks run in child processes
    and are cached, so this process enumerates devices but runs no kernel. ``opencl:N`` numbers the qualified
    ones in raw order, as ``get_backend`` does."""
    from neuroflow.backends import qualification

    qualified: list[dict[str, Any]] = []
    refused: list[dict[str, Any]] = []
    for raw, verdict in qualification.offered("opencl"):
        entry = {"raw_index": raw, "device": verdict.device, "identity": verdict.identity}
        if verdict.ok:
            name = f"opencl:{len(qualified)}"
            version = verdict.identity.get("platform version", "")
            qualified.append({**entry, "name": name, "label": f"{name} ({driver_label(version)})"})
        else:
            refused.append({**entry, "verdict": verdict.explain()})
    return qualified, refused


def device_name(text: str) -> str:
    """``--backend``: ``cpu`` or ``opencl:N``."""
    if text != BASELINE and not re.fullmatch(r"opencl:\d+", text):
        raise argparse.ArgumentTypeError(f"expected 'cpu' or 'opencl:N', not {text!r}")
    return text


# ---------------------------------------------------------------------------------------------- worker
def device_info(device: str) -> dict[str, Any]:
    """What the worker's device is: its platform version (the parent checks it is the device it meant) and the
    vector width its kernels use."""
    if device == BASELINE:
        return {}
    from neuroflow.backends.selection import get_backend

    cl_device = get_backend(device).cl_device  # type: ignore[attr-defined]  # an OpenclBackend
    return {"platform_version": cl_device.device.platform.version.strip(), "device_name": cl_device.facts.name,
            "vector_bytes": cl_device.vector_bytes}


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
    info.update(device_info(args.backend))
    print(json.dumps(info), flush=True)
    harness.serve_blocks(step)


def measure(task: str, size: str, devices: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    names = [BASELINE, *(d["name"] for d in devices)]
    workers: dict[str, harness.Worker] = {}
    steps = args.steps if task == "mlp" else max(1, args.steps // 4)
    try:
        for name in names:
            workers[name] = harness.Worker(
                [__file__, "--child", "--task", task, "--backend", name, "--size", size, "--warmup", str(args.warmup)],
                env=harness.thread_env(args.threads),
            )
        for d in devices:  # the child's opencl:N must be the device the parent labelled
            expected = d["identity"].get("platform version", "").strip()
            found = workers[d["name"]].info.get("platform_version")
            if found != expected:
                raise RuntimeError(f"{task}: worker {d['name']} runs on {found!r}, not {expected!r}")
        losses = {name: w.info["first_losses"] for name, w in workers.items()}
        for name in names[1:]:
            for (a, b) in zip(losses[name], losses[BASELINE], strict=True):
                if abs(a - b) > 1e-3 * abs(b):
                    raise RuntimeError(f"{task}: {name} losses {losses[name]} differ from cpu {losses[BASELINE]}")
        samples = harness.interleave({name: functools.partial(w.run, steps) for name, w in workers.items()},
                                     args.rounds, args.pause)
    finally:
        for w in workers.values():
            w.close()
    return {"task": task, "size": size, "samples_s": samples, "losses": losses,
            "workers": {name: w.info for name, w in workers.items()},
            "summary_s": {name: harness.summarise(s) for name, s in samples.items()},
            "paired_ratio": {name: harness.paired_ratio(samples[name], samples[BASELINE]) for name in names[1:]}}


def run_all(devices: list[dict[str, Any]], refused: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    load_before = harness.machine_load()
    results = [measure(task, "-", devices, args) for task in ("mlp", "cnn")]
    results += [measure("gemm", "x".join(map(str, s)), devices, args) for s in GEMM_SIZES]
    for d in devices:  # the vector width each device's kernels use, as its worker found it
        widths = {r["workers"][d["name"]].get("vector_bytes") for r in results}
        d["vector_bytes"] = widths.pop() if len(widths) == 1 else sorted(widths)
    report = {"settings": {"rounds": args.rounds, "steps_per_block": args.steps, "warmup": args.warmup,
                           "threads": args.threads, "gemm_repeats": REPEATS,
                           "contenders": [BASELINE, *(d["name"] for d in devices)]},
              "source": harness.source_version(os.path.dirname(os.path.abspath(__file__))),
              "load_average_before": load_before, "load_average_after": harness.machine_load(),
              "devices": devices, "refused_devices": refused, "results": results}
    names = [d["name"] for d in devices]
    rows = []
    for r in results:
        med = {name: r["summary_s"][name]["median"] for name in [BASELINE, *names]}
        spread = max(s["spread"] for s in r["summary_s"].values())
        if r["task"] == "gemm":
            m, k, n = (int(s) for s in r["size"].split("x"))
            flops = 2 * m * k * n * REPEATS
            what, values = f"SGEMM {r['size']} (GFLOP/s)", [f"{flops / med[x] / 1e9:.1f}" for x in [BASELINE, *names]]
        else:
            what, values = f"{r['task'].upper()} train step (ms)", [f"{med[x] * 1e3:.2f}" for x in [BASELINE, *names]]
        rows.append([what, *values, *(f"{med[x] / med[BASELINE]:.2f}×" for x in names),
                     *(f"{r['paired_ratio'][x]:.2f}×" for x in names), f"{spread * 100:.0f}%"])
    report["table"] = harness.markdown_table(
        ["what", "cpu / numpy", *(d["label"] for d in devices), *(f"{x}/cpu time" for x in names),
         *(f"{x} paired" for x in names), "spread"], rows)
    report["device_table"] = harness.markdown_table(
        ["contender", "device", "driver (platform version)", "vector bytes"],
        [[d["name"], d["identity"].get("device", "?"), " ".join(d["identity"].get("platform version", "?").split()),
          d["vector_bytes"]] for d in devices])
    return report


def print_report(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(f"every qualified opencl device vs cpu backend / numpy, one process per contender, {s['threads']} BLAS "
          f"threads: median of {s['rounds']} interleaved rounds; code {report['source']}; load average before "
          f"{report['load_average_before']}, after {report['load_average_after']}; X/cpu time = ratio of medians "
          "(below 1: X faster than cpu); paired = median of per-round ratios; spread = largest interquartile "
          "range / median\n")
    print(report["device_table"])
    for d in report["refused_devices"]:
        print(f"\nleft out, not qualified: raw device {d['raw_index']} = {d['device']}: {d['verdict']}")
    print()
    print(report["table"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few rounds: a smoke test, not a measurement")
    parser.add_argument("--json", metavar="FILE", help="write settings, devices, every sample and the tables to FILE")
    parser.add_argument("--threads", type=int, default=2, help="BLAS/OpenMP threads of every worker (default 2)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 15; 3 with --quick)")
    parser.add_argument("--steps", type=int, help="MLP steps per block, a quarter for the others (default 12; 4 with --quick)")
    parser.add_argument("--warmup", type=int, help="untimed steps per worker (default 5; 1 with --quick)")
    parser.add_argument("--pause", type=float, default=0.05, help="seconds idle before each block (default 0.05)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--task", choices=("mlp", "cnn", "gemm"), help=argparse.SUPPRESS)
    parser.add_argument("--backend", type=device_name, help=argparse.SUPPRESS)
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
    devices, refused = opencl_devices()
    if not devices:
        print("no opencl device qualified here; nothing to compare")
        for d in refused:
            print(f"  refused: raw device {d['raw_index']} = {d['device']}: {d['verdict']}")
        return 0
    return harness.emit(run_all(devices, refused, args), print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
