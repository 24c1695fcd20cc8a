"""Training-step memory: predicted vs measured peak, steady-state allocations, arena packing, RSS vs PyTorch.

Every measurement runs in a fresh process (tracemalloc sees only what that model allocates; the vision
ops' per-thread workspaces start empty), with the BLAS/OpenMP thread variables set before numpy loads.

    .venv/bin/python benchmarks/memory.py                # full run, about a minute
    .venv/bin/python benchmarks/memory.py --quick        # smoke test: smaller batches, fewer steps
    .venv/bin/python benchmarks/memory.py --json out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import harness

MiB = 2**20
# name -> (one sample's shape, batch sizes, quick batch sizes)
MODELS: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = {
    "MLP 784-128-64-10": ((784,), (32, 128, 512), (16, 64)),
    "deep MLP 8×256": ((784,), (32, 128, 512), (16, 64)),
    "CNN neuroflow_cnn": ((1, 28, 28), (16, 64, 128), (4, 16)),
}
HAS_VISION = importlib.util.find_spec("neuroflow_ops_vision") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
RSS_BATCH = 64


def build(name: str) -> Any:
    """A fresh model, the same weights every time."""
    import neuroflow as nf
    from neuroflow import ops

    nf.manual_seed(0)
    if name == "MLP 784-128-64-10":
        return nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))
    if name == "deep MLP 8×256":
        layers: list[Any] = [ops.Linear(784, 256), ops.ReLU()]
        for _ in range(7):
            layers += [ops.Linear(256, 256), ops.ReLU()]
        return nf.Sequential(*layers, ops.Linear(256, 10))
    from neuroflow import registry

    return registry.models.get("neuroflow_cnn")()


def batch_data(name: str, batch: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(1)
    return rng.random((batch, *MODELS[name][0]), dtype=np.float32), rng.integers(0, 10, batch)


# ---------------------------------------------------------------------------------------------- placement
def first_fit_in_request_order(slots: list[Any]) -> int:
    """Arena bytes when each buffer takes the lowest free offset at the moment it is requested.

    What an online first-fit allocator does; the planner instead places the largest buffers first
    (greedy by size). Same collision rule: buffers alive at the same time may not overlap.
    """
    from neuroflow.buffers.planner import ALIGNMENT

    def aligned(n: int) -> int:
        return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT

    placed: list[tuple[int, int, int, int]] = []  # start, end, offset, size
    arena = 0
    for slot in sorted(slots, key=lambda s: s.start):
        size = aligned(slot.nbytes)
        offset = 0
        for lo, hi in sorted((o, o + n) for start, end, o, n in placed if start <= slot.end and slot.start <= end):
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        placed.append((slot.start, slot.end, offset, size))
        arena = max(arena, offset + size)
    return arena


# ---------------------------------------------------------------------------------------------- children
def warm_up_the_process() -> None:
    """One step of a throwaway 2×2 model: the lazy imports, entry-point and plugin caches a first Trainer fills.

    They are Python objects kept for the life of the process (about 0.5 MiB), paid once whatever the
    model, and no part of a training step's memory.
    """
    import numpy as np

    import neuroflow as nf

    trainer = nf.Trainer(nf.Sequential(nf.ops.Linear(2, 2)), optimizer=nf.optim.AdamW(), progress=False)
    trainer.train_step(np.zeros((1, 2), np.float32), np.zeros(1, np.int64))


def measure_peak(name: str, batch: int, steps: int) -> dict[str, Any]:
    """Predicted peak, tracemalloc's measured peak of steady-state steps, allocations per step, packing."""
    import numpy as np

    import neuroflow as nf
    from neuroflow.buffers.planner import place
    from neuroflow.losses import CrossEntropy
    from neuroflow.memory.profile import trace_step

    x, y = batch_data(name, batch)
    report = nf.memory.profile(build(name), (batch, *x.shape[1:]), CrossEntropy(), nf.optim.AdamW(lr=1e-3))
    slots = trace_step(build(name), CrossEntropy(), x.shape)
    greedy = place(slots)
    first_fit = first_fit_in_request_order(slots)
    del slots
    warm_up_the_process()

    # The peak: relative to traced memory before the model exists, over the steps after the first
    # (planning) one; the data was made before tracing started, as a data loader's batches would be.
    # Step 2 is reported on its own too: buffers of the traced step that an op still holds die there.
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    trainer = nf.Trainer(build(name), optimizer=nf.optim.AdamW(lr=1e-3), batch_size=batch, progress=False)
    trainer.train_step(x, y)
    arena_allocations = trainer.memory_stats().allocations
    tracemalloc.reset_peak()
    trainer.train_step(x, y)
    second_step_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.reset_peak()
    before_later = tracemalloc.get_traced_memory()[0]
    for _ in range(steps):
        trainer.train_step(x, y)
    later_peak = tracemalloc.get_traced_memory()[1]
    # Allocations, in a second window so the snapshots are not part of the peak above.
    numpy_data = tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)
    before = tracemalloc.take_snapshot().filter_traces([numpy_data])
    for _ in range(steps):
        trainer.train_step(x, y)
    after = tracemalloc.take_snapshot().filter_traces([numpy_data])
    tracemalloc.stop()
    grown = [d for d in after.compare_to(before, "traceback") if d.count_diff > 0]
    return {
        "model": name, "batch": batch, "steps": steps,
        "predicted": report.predicted_peak_bytes, "static": report.static_bytes,
        "measured": max(second_step_peak, later_peak) - base, "measured_after_step_2": later_peak - base,
        "transient_rise": later_peak - before_later,
        "new_numpy_blocks": sum(d.count_diff for d in grown), "new_numpy_bytes": sum(max(d.size_diff, 0) for d in grown),
        "arena_allocations": trainer.memory_stats().allocations - arena_allocations,
        "arena_bytes": greedy.arena_bytes, "unshared_bytes": greedy.unshared_bytes,
        "max_live_bytes": greedy.max_live_bytes, "first_fit_bytes": first_fit,
    }


def neuroflow_stepper(batch: int) -> Callable[[], object]:
    import neuroflow as nf

    x, y = batch_data("MLP 784-128-64-10", batch)
    trainer = nf.Trainer(build("MLP 784-128-64-10"), optimizer=nf.optim.AdamW(lr=1e-3), batch_size=batch,
                         progress=False)
    return lambda: trainer.train_step(x, y)


def torch_stepper(batch: int, threads: int) -> Callable[[], object]:
    import torch

    torch.set_num_threads(threads)
    x, y = (torch.from_numpy(a) for a in batch_data("MLP 784-128-64-10", batch))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> float:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return float(loss.item())

    return step


def measure_rss(contender: str, batch: int, steps: int, threads: int) -> dict[str, Any]:
    """RSS of one contender alone in this process: after setup, through a warm-up step, then over ``steps`` steps."""
    import gc

    step = neuroflow_stepper(batch) if contender == "NeuroFlow" else torch_stepper(batch, threads)
    gc.collect()
    setup = harness.rss_kb()
    resettable = harness.reset_peak_rss()
    step()
    first_peak = harness.peak_rss_kb()
    after_warmup = harness.rss_kb()
    harness.reset_peak_rss()
    for _ in range(steps):
        step()
    return {
        "contender": contender, "batch": batch, "steps": steps, "peak_resettable": resettable,
        "rss_setup_kb": setup, "rss_after_warmup_kb": after_warmup, "rss_end_kb": harness.rss_kb(),
        # Without clear_refs the high-water mark cannot be restarted and includes setup and the warm-up step.
        "first_step_rise_kb": first_peak - setup if resettable else None,
        "steady_rise_kb": max(harness.peak_rss_kb() - after_warmup, 0),
    }


# ---------------------------------------------------------------------------------------------- report
def mib(n: float) -> str:
    return f"{n / MiB:.3f}"


def tables(peaks: list[dict[str, Any]], rss: dict[str, dict[str, Any]]) -> dict[str, str]:
    out = {}
    def error(r: dict[str, Any], key: str) -> str:
        return f"{100 * (r['predicted'] - r[key]) / r[key]:+.2f}"

    out["peak"] = harness.markdown_table(
        ["model", "batch", "predicted MiB", "of which static MiB", "measured MiB", "error %",
         "measured from step 3 MiB", "error from step 3 %"],
        [[r["model"], r["batch"], mib(r["predicted"]), mib(r["static"]), mib(r["measured"]), error(r, "measured"),
          mib(r["measured_after_step_2"]), error(r, "measured_after_step_2")] for r in peaks])
    out["allocations"] = harness.markdown_table(
        ["model", "batch", "steps", "new numpy blocks", "new numpy bytes", "arena allocations", "peak rise KiB"],
        [[r["model"], r["batch"], r["steps"], r["new_numpy_blocks"], r["new_numpy_bytes"], r["arena_allocations"],
          f"{r['transient_rise'] / 1024:.1f}"] for r in peaks])
    out["packing"] = harness.markdown_table(
        ["model", "batch", "unshared MiB", "max-live bound MiB", "greedy by size MiB", "greedy / bound",
         "first-fit in order MiB", "first-fit / bound"],
        [[r["model"], r["batch"], mib(r["unshared_bytes"]), mib(r["max_live_bytes"]), mib(r["arena_bytes"]),
          f"{r['arena_bytes'] / r['max_live_bytes']:.3f}", mib(r["first_fit_bytes"]),
          f"{r['first_fit_bytes'] / r['max_live_bytes']:.3f}"] for r in peaks])
    if rss:
        reference = rss.get("PyTorch")
        rows = []
        for name, m in rss.items():
            first, steady = m["first_step_rise_kb"], m["steady_rise_kb"]
            row: list[object] = [name, m["batch"], f"{m['rss_setup_kb'] / 1024:.1f}",
                                 "—" if first is None else f"{first / 1024:.2f}", f"{steady / 1024:.2f}",
                                 f"{(m['rss_end_kb'] - m['rss_setup_kb']) / 1024:.2f}"]
            if reference is not None:
                ref_first = reference["first_step_rise_kb"]
                row.append(f"{first / ref_first:.2f}×" if first is not None and ref_first else "—")
            rows.append(row)
        headers = ["contender", "batch", "RSS after setup MiB", "first step rise MiB", "steady-state peak rise MiB",
                   "held after the steps MiB"]
        out["rss"] = harness.markdown_table(headers + (["first step rise / PyTorch"] if reference else []), rows)
    return out


def print_report(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(f"Training-step memory (AdamW, CrossEntropy, float32), one fresh process per measurement, {s['threads']} "
          f"thread(s); code {report['source']}\n")
    print(f"Predicted peak (memory.profile) vs tracemalloc's peak over the {s['steps'] + 1} steps after the first "
          "(planning) one, above traced memory before the model was built (numpy data and Python objects); "
          "'from step 3' leaves out the first step after planning. Error = (predicted - measured) / measured:\n")
    print(report["tables"]["peak"])
    print(f"\nSteady state over {s['steps']} steps from step 3, then {s['steps']} more: numpy blocks alive at the end that were not before "
          "(tracemalloc snapshot diff over the second window), arena allocations after step 1 (memory_stats), and how "
          "far the traced peak of the first window rose over the traced memory at its start (temporaries, numpy or "
          "Python, that a snapshot cannot see):\n")
    print(report["tables"]["allocations"])
    print("\nArena packing of the traced buffers: every buffer its own memory (unshared), the most bytes alive "
          "at once (no placement can use less), the planner's greedy-by-size placement, and first-fit in request "
          "order (an online allocator):\n")
    print(report["tables"]["packing"])
    if "rss" in report["tables"]:
        print(f"\nRSS of MLP 784-128-64-10 at batch {RSS_BATCH}, each contender alone in a fresh process: rise of "
              "the peak (VmHWM) over RSS after setup during the warm-up step, and over RSS after the warm-up step "
              f"during {s['rss_steps']} more steps:\n")
        print(report["tables"]["rss"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller batches and fewer steps: a smoke test")
    parser.add_argument("--json", metavar="FILE", help="write settings, every measurement and the tables to FILE")
    parser.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads in every process (default 1)")
    parser.add_argument("--steps", type=int, help="steady-state steps per window (default 5; 2 with --quick)")
    parser.add_argument("--rss-steps", type=int, help="steps after the warm-up for RSS (default 50; 5 with --quick)")
    # Internal: how the parent starts a measurement process.
    parser.add_argument("--child", choices=["peak", "rss"], help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps is None:
        args.steps = 2 if args.quick else 5
    if args.rss_steps is None:
        args.rss_steps = 5 if args.quick else 50
    if args.steps < 1 or args.rss_steps < 1 or args.threads < 1:
        parser.error("--steps, --rss-steps and --threads must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child == "peak":
        print(json.dumps(measure_peak(args.name, args.batch, args.steps)))
        return 0
    if args.child == "rss":
        print(json.dumps(measure_rss(args.name, args.batch, args.rss_steps, args.threads)))
        return 0
    env = harness.thread_env(args.threads)
    common = [__file__, "--threads", str(args.threads), "--steps", str(args.steps), "--rss-steps", str(args.rss_steps)]
    peaks = []
    for name, (_, batches, quick_batches) in MODELS.items():
        if name.startswith("CNN") and not HAS_VISION:
            print(f"skipping {name}: neuroflow-ops-vision is not installed", file=sys.stderr)
            continue
        for batch in quick_batches if args.quick else batches:
            peaks.append(harness.run_child([*common, "--child", "peak", "--name", name, "--batch", str(batch)], env))
    rss = {}
    for contender in ("NeuroFlow", "PyTorch") if HAS_TORCH else ("NeuroFlow",):
        rss[contender] = harness.run_child([*common, "--child", "rss", "--name", contender,
                                            "--batch", str(RSS_BATCH)], env)
    report = {
        "settings": {"threads": args.threads, "steps": args.steps, "rss_steps": args.rss_steps, "quick": args.quick},
        "source": harness.source_version(__file__.rsplit("/", 1)[0] or "."),
        "peaks": peaks, "rss": rss, "tables": tables(peaks, rss),
    }
    return harness.emit(report, print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
