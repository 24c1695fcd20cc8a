"""LoRA vs full fine-tuning: predicted and measured peak memory of a training step, and step time.

Both ways start from the same weights; LoRA puts rank-8 adapters (alpha 16) on every Linear (and Conv2d)
and freezes everything else (``nf.lora.mark_only_lora_as_trainable``). Every measurement runs in a
fresh process with the BLAS/OpenMP thread variables set before numpy loads.

    .venv/bin/python benchmarks/lora.py                          # MLP and small CNN, about a minute
    .venv/bin/python benchmarks/lora.py --quick                  # smoke test: small batches, few steps
    .venv/bin/python benchmarks/lora.py --models mlp,cnn,resnet18 --json out.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tracemalloc
from typing import Any

import harness
from memory import warm_up_the_process

MiB = 2**20
RANK, ALPHA = 8, 16
# key -> (title, one sample's shape, batch, quick batch, LoRA targets, needs vision)
MODELS: dict[str, tuple[str, tuple[int, ...], int, int, tuple[str, ...], bool]] = {
    "mlp": ("MLP 784-1024-1024-10", (784,), 64, 16, ("Linear",), False),
    "cnn": ("small CNN 2 conv + pool + linear", (3, 32, 32), 64, 8, ("Conv2d", "Linear"), True),
    "resnet18": ("ResNet-18 (CIFAR)", (3, 32, 32), 16, 2, ("Conv2d", "Linear"), True),
}
MODES = ("full", "LoRA")
HAS_VISION = importlib.util.find_spec("neuroflow_ops_vision") is not None


def build(key: str, mode: str) -> Any:
    """The model, the same weights every time; with mode "LoRA", adapted and only the adapters trainable."""
    import neuroflow as nf
    from neuroflow import ops

    nf.manual_seed(0)
    if key == "mlp":
        model = nf.Sequential(ops.Linear(784, 1024), ops.ReLU(), ops.Linear(1024, 1024), ops.ReLU(),
                              ops.Linear(1024, 10))
    elif key == "cnn":
        model = nf.Sequential(
            ops.Conv2d(3, 32, 3, padding=1, output_layout="NHWC"), ops.ReLU(), ops.MaxPool2d(2, layout="NHWC"),
            ops.Conv2d(32, 64, 3, padding=1, layout="NHWC"), ops.ReLU(), ops.MaxPool2d(2, layout="NHWC"),
            ops.Flatten(), ops.Linear(64 * 8 * 8, 10))
    else:
        model = nf.registry.models.get("resnet18")()
    if mode == "LoRA":
        model = nf.lora.apply_lora(model, rank=RANK, alpha=ALPHA, targets=MODELS[key][4])
        nf.lora.mark_only_lora_as_trainable(model)
    return model


def batch_data(key: str, batch: int) -> tuple[Any, Any]:
    import numpy as np

    rng = np.random.default_rng(1)
    return rng.random((batch, *MODELS[key][1]), dtype=np.float32), rng.integers(0, 10, batch)


# ---------------------------------------------------------------------------------------------- children
def measure_peak(key: str, mode: str, batch: int, steps: int) -> dict[str, Any]:
    """Predicted peak (memory.profile) and tracemalloc's peak over steady-state steps, as benchmarks/memory.py."""
    import neuroflow as nf

    x, y = batch_data(key, batch)
    model = build(key, mode)
    report = nf.memory.profile(model, x.shape, nf.losses.CrossEntropy(), nf.optim.AdamW(lr=1e-3))
    trainable = sum(int(p.data.size) for p in model.trainable_parameters())
    total = sum(int(p.data.size) for p in model.parameters())
    del model
    warm_up_the_process()

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    trainer = nf.Trainer(build(key, mode), optimizer=nf.optim.AdamW(lr=1e-3), batch_size=batch, progress=False)
    trainer.train_step(x, y)
    tracemalloc.reset_peak()
    for _ in range(steps):
        trainer.train_step(x, y)
    measured = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return {
        "model": key, "mode": mode, "batch": batch, "parameters": total, "trainable": trainable,
        "predicted": report.predicted_peak_bytes, "weights": report.parameter_bytes,
        "gradients_and_optimizer": report.gradient_bytes + report.optimizer_bytes,
        "arena": report.arena_bytes, "measured": measured,
    }


def serve_steps(key: str, mode: str, batch: int) -> None:
    """A timing worker: one Trainer, two warm-up steps, then blocks of steps on request."""
    import neuroflow as nf

    x, y = batch_data(key, batch)
    trainer = nf.Trainer(build(key, mode), optimizer=nf.optim.AdamW(lr=1e-3), batch_size=batch, progress=False)
    losses = [trainer.train_step(x, y) for _ in range(2)]
    print(json.dumps({"first_losses": losses}), flush=True)
    harness.serve_blocks(lambda: trainer.train_step(x, y))


# ---------------------------------------------------------------------------------------------- parent
def time_steps(common: list[str], key: str, batch: int, rounds: int, steps: int, env: dict[str, str]) -> dict[str, Any]:
    workers = {mode: harness.Worker([*common, "--child", "time", "--name", key, "--mode", mode,
                                     "--batch", str(batch)], env) for mode in MODES}
    try:
        # The adapters start at zero, so both ways compute the same first loss.
        first = {mode: w.info["first_losses"][0] for mode, w in workers.items()}
        if abs(first["full"] - first["LoRA"]) > 1e-4 * abs(first["full"]):
            raise RuntimeError(f"{key}: first losses differ between full and LoRA: {first}")
        samples = harness.interleave({mode: (lambda w=w: w.run(steps)) for mode, w in workers.items()}, rounds)
    finally:
        for w in workers.values():
            w.close()
    return {"model": key, "batch": batch, "samples_s": samples,
            "summary": {mode: harness.summarise(s) for mode, s in samples.items()},
            "paired_ratio": harness.paired_ratio(samples["LoRA"], samples["full"])}


def mib(n: float) -> str:
    return f"{n / MiB:.2f}"


def tables(peaks: list[dict[str, Any]], times: list[dict[str, Any]]) -> dict[str, str]:
    out = {}
    out["memory"] = harness.markdown_table(
        ["model", "batch", "way", "trainable / all parameters", "weights MiB", "grads + AdamW MiB", "arena MiB",
         "predicted peak MiB", "measured peak MiB", "error %"],
        [[MODELS[r["model"]][0], r["batch"], r["mode"], f"{r['trainable']:,} / {r['parameters']:,}",
          mib(r["weights"]), mib(r["gradients_and_optimizer"]), mib(r["arena"]), mib(r["predicted"]),
          mib(r["measured"]), f"{100 * (r['predicted'] - r['measured']) / r['measured']:+.1f}"] for r in peaks])
    rows = []
    for key in dict.fromkeys(r["model"] for r in peaks):
        full, lora = (next(r for r in peaks if r["model"] == key and r["mode"] == m) for m in MODES)
        rows.append([MODELS[key][0], full["batch"], mib(full["predicted"]), mib(lora["predicted"]),
                     f"{100 * (1 - lora['predicted'] / full['predicted']):.1f}", mib(full["measured"]),
                     mib(lora["measured"]), f"{100 * (1 - lora['measured'] / full['measured']):.1f}"])
    out["saved"] = harness.markdown_table(
        ["model", "batch", "predicted full MiB", "predicted LoRA MiB", "predicted saved %", "measured full MiB",
         "measured LoRA MiB", "measured saved %"], rows)
    if times:
        out["time"] = harness.markdown_table(
            ["model", "batch", "full ms", "LoRA ms", "LoRA/full", "per-round LoRA/full", "spread"],
            [[MODELS[t["model"]][0], t["batch"], f"{1e3 * t['summary']['full']['median']:.2f}",
              f"{1e3 * t['summary']['LoRA']['median']:.2f}",
              f"{t['summary']['LoRA']['median'] / t['summary']['full']['median']:.2f}×", f"{t['paired_ratio']:.2f}×",
              f"{max(s['spread'] for s in t['summary'].values()):.2f}"] for t in times])
    return out


def print_report(report: dict[str, Any]) -> None:
    s = report["settings"]
    print(f"LoRA (rank {RANK}, alpha {ALPHA}, adapters only trainable) vs full fine-tuning, AdamW, CrossEntropy, "
          f"float32, {s['threads']} thread(s); code {report['source']}; load {report['load']}\n")
    print("Peak memory of a training step: predicted by nf.memory.profile; measured by tracemalloc over "
          f"{s['steps']} steps after the first (planning) one, from before the model was built (so the frozen "
          "weights count in both ways). Error = (predicted - measured) / measured:\n")
    print(report["tables"]["memory"])
    print("\nWhat LoRA saves (the article reports 35 % less):\n")
    print(report["tables"]["saved"])
    if "time" in report["tables"]:
        print(f"\nStep time (Trainer.train_step), median of {s['rounds']} interleaved rounds × {s['block']} steps, "
              "each way in its own process:\n")
        print(report["tables"]["time"])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small batches and few steps: a smoke test")
    parser.add_argument("--models", default="mlp,cnn", help=f"comma-separated, from {', '.join(MODELS)} (default mlp,cnn)")
    parser.add_argument("--json", metavar="FILE", help="write settings, every measurement and the tables to FILE")
    parser.add_argument("--threads", type=int, default=1, help="BLAS/OpenMP threads in every process (default 1)")
    parser.add_argument("--steps", type=int, help="measured steps after the planning step (default 3; 1 with --quick)")
    parser.add_argument("--rounds", type=int, help="interleaved timing rounds (default 10; 2 with --quick)")
    parser.add_argument("--block", type=int, help="steps per timed block (default 5; 1 with --quick)")
    parser.add_argument("--no-time", action="store_true", help="memory only")
    # Internal: how the parent starts a measurement process.
    parser.add_argument("--child", choices=["peak", "time"], help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    args.steps = args.steps or (1 if args.quick else 3)
    args.rounds = args.rounds or (2 if args.quick else 10)
    args.block = args.block or (1 if args.quick else 5)
    if min(args.steps, args.rounds, args.block, args.threads) < 1:
        parser.error("--steps, --rounds, --block and --threads must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child == "peak":
        print(json.dumps(measure_peak(args.name, args.mode, args.batch, args.steps)))
        return 0
    if args.child == "time":
        serve_steps(args.name, args.mode, args.batch)
        return 0
    env = harness.thread_env(args.threads)
    common = [__file__, "--threads", str(args.threads), "--steps", str(args.steps)]
    peaks, times = [], []
    for key in args.models:
        title, _, batch, quick_batch, _, needs_vision = MODELS[key]
        if needs_vision and not HAS_VISION:
            print(f"skipping {title}: neuroflow-ops-vision is not installed", file=sys.stderr)
            continue
        batch = quick_batch if args.quick else batch
        for mode in MODES:
            peaks.append(harness.run_child([*common, "--child", "peak", "--name", key, "--mode", mode,
                                            "--batch", str(batch)], env))
        if not args.no_time:
            times.append(time_steps(common, key, batch, args.rounds, args.block, env))
    report = {
        "settings": {"threads": args.threads, "steps": args.steps, "rounds": args.rounds, "block": args.block,
                     "quick": args.quick, "rank": RANK, "alpha": ALPHA},
        "source": harness.source_version(__file__.rsplit("/", 1)[0] or "."), "load": harness.machine_load(),
        "peaks": peaks, "times": times, "tables": tables(peaks, times),
    }
    return harness.emit(report, print_report, args.json)


if __name__ == "__main__":
    sys.exit(main())
