"""Sparse gradient compression vs dense accumulation: MNIST accuracy, bytes a step sends, memory, step time.

One MLP 784-128-64-10 (AdamW lr 2e-3 decayed by a cosine, batch 16 × accumulation 4, the same weights and
batches for every mode) is trained on real MNIST per mode, each in a fresh process with the BLAS/OpenMP
thread variables set before numpy loads; test accuracy is on the 10,000 test images.

    .venv/bin/python benchmarks/compression.py                 # one epoch per mode, about 15 s
    .venv/bin/python benchmarks/compression.py --quick         # smoke test: 50 steps; not a measurement
    .venv/bin/python benchmarks/compression.py --steps 1874 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tracemalloc
from typing import Any

import harness

MiB = 2**20
MICRO_BATCH, ACCUMULATION = 16, 4
# label -> Trainer keyword arguments
MODES: dict[str, dict[str, Any]] = {
    "dense": {},
    "topk 10 %": {"gradient_compression": "topk", "compression_ratio": 0.1},
    "topk 1 %": {"gradient_compression": "topk", "compression_ratio": 0.01},
    "threshold 5e-3": {"gradient_compression": "threshold", "compression_threshold": 5e-3},
    "auto 10 %": {"gradient_compression": "auto", "compression_ratio": 0.1},
}


def measure(label: str, steps: int) -> dict[str, Any]:
    """Train one mode for ``steps`` optimisation steps; accuracy, bytes sent, memory and step times."""
    import numpy as np

    import neuroflow as nf
    from neuroflow import ops

    train, test = nf.data.mnist("train", normalize=True), nf.data.mnist("test", normalize=True)
    effective = MICRO_BATCH * ACCUMULATION
    x, y = train[np.arange(steps * effective) % len(train)]
    kwargs = MODES[label]
    tracemalloc.start()  # after the data: the peak counts what the trainer holds and a step needs
    nf.manual_seed(0)
    model = nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))
    # a cosine decay to zero: at a constant learning rate the end point moves a point of accuracy from step to step
    scheduler = nf.schedulers.Cosine()
    trainer = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=2e-3), scheduler=scheduler, batch_size=MICRO_BATCH,
                         gradient_accumulation_steps=ACCUMULATION, progress=False, seed=0, **kwargs)
    scheduler.bind(trainer.optimizer.lr, steps, steps)
    size = trainer.flat_parameters.size
    sent, times = [], []
    for s in range(steps):
        start = time.perf_counter()
        trainer.train_step(x[s * effective:(s + 1) * effective], y[s * effective:(s + 1) * effective])
        times.append(time.perf_counter() - start)
        if s == 2:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()  # it slows numpy down: time the remaining steps without it
        compressor = trainer.compressor
        sent.append(compressor.sent_bytes(4) if compressor is not None else size * 4)
    if steps <= 2:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    mode = kwargs.get("gradient_compression")
    report = nf.memory.profile(model, (MICRO_BATCH, 784), trainer.loss, trainer.optimizer,
                               gradient_accumulation_steps=ACCUMULATION, gradient_compression=mode)
    stats = trainer.compressor.last_stats if trainer.compressor is not None else []
    return {
        "mode": label, "steps": steps, "parameters": size,
        "accuracy": trainer.evaluate(test)["accuracy"],
        "sent_bytes_per_step": statistics.mean(sent), "dense_bytes_per_step": size * 4,
        "compression_bytes": trainer.compressor.nbytes if trainer.compressor is not None else 0,
        "predicted_static_bytes": report.static_bytes, "predicted_peak_bytes": report.predicted_peak_bytes,
        "traced_peak_bytes": peak,
        "step_ms_median": 1e3 * statistics.median(times[10:] or times),
        "last_step_layers": [{"name": t.name, "mode": t.mode, "sent": t.sent, "size": t.size, "energy": t.energy}
                             for t in stats],
    }


def tables(results: list[dict[str, Any]]) -> dict[str, str]:
    dense = next(r for r in results if r["mode"] == "dense")
    rows = []
    for r in results:
        rows.append([r["mode"], f"{100 * r['accuracy']:.2f}", f"{100 * (r['accuracy'] - dense['accuracy']):+.2f}",
                     f"{r['sent_bytes_per_step'] / 1024:.1f}", f"{r['sent_bytes_per_step'] / r['dense_bytes_per_step']:.3f}",
                     f"{r['compression_bytes'] / MiB:.3f}", f"{r['predicted_peak_bytes'] / MiB:.3f}",
                     f"{r['traced_peak_bytes'] / MiB:.3f}", f"{r['traced_peak_bytes'] / dense['traced_peak_bytes']:.3f}",
                     f"{r['step_ms_median']:.2f}", f"{r['step_ms_median'] / dense['step_ms_median']:.2f}"])
    headers = ["mode", "test accuracy %", "vs dense (points)", "sent KiB/step", "sent / dense",
               "residual MiB", "predicted peak MiB", "traced peak MiB", "peak / dense",
               "step ms (median)", "step / dense"]
    layer_rows = [[r["mode"], *(f"{t['mode']} {t['sent']}/{t['size']}" for t in r["last_step_layers"])]
                  for r in results if r["last_step_layers"]]
    names = [t["name"] for t in results[-1]["last_step_layers"]]
    return {"summary": harness.markdown_table(headers, rows),
            "layers": harness.markdown_table(["mode", *names], layer_rows) if layer_rows else ""}


def print_report(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(f"Gradient compression, MLP 784-128-64-10 on MNIST, {s['steps']} steps of batch {MICRO_BATCH} × "
          f"accumulation {ACCUMULATION}, AdamW lr 2e-3 cosine to 0, float32, {s['threads']} thread(s), one fresh process per "
          f"mode; code {report['source']}, load {report['load']}\n")
    print("sent: what the step's update takes as (int32 index, float32 value) pairs for sparse layers and whole "
          "arrays for dense ones, mean over the steps. Memory: the compressor's error-feedback residual; the "
          "predicted peak (memory.profile); tracemalloc's peak from building the trainer through step 3:\n")
    print(report["tables"]["summary"])
    if report["tables"]["layers"]:
        print("\nLast step, per layer: mode and entries sent / layer size:\n")
        print(report["tables"]["layers"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="50 steps per mode: a smoke test")
    parser.add_argument("--steps", type=int, help="optimisation steps per mode (default 937, one epoch; 50 with --quick)")
    parser.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads in every process (default 1)")
    parser.add_argument("--json", metavar="FILE", help="write settings, every measurement and the tables to FILE")
    parser.add_argument("--child", help=argparse.SUPPRESS)  # internal: the mode a measurement process trains
    args = parser.parse_args(argv)
    steps = args.steps if args.steps is not None else (50 if args.quick else 937)
    if steps < 1 or args.threads < 1:
        parser.error("--steps and --threads must be at least 1")
    if args.child is not None:
        print(json.dumps(measure(args.child, steps)))
        return 0
    env = harness.thread_env(args.threads)
    results = [harness.run_child([__file__, "--steps", str(steps), "--child", label], env) for label in MODES]
    report = {
        "settings": {"steps": steps, "threads": args.threads, "quick": args.quick},
        "source": harness.source_version(__file__.rsplit("/", 1)[0] or "."), "load": harness.machine_load(),
        "results": results, "tables": tables(results),
    }
    return harness.emit(report, print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
