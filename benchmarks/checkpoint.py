"""Model files: size, save and load time against torch.save/torch.load, and what INT8 costs in accuracy.

For each model: the file sizes of ``nf.save`` (float32 and INT8) and of ``torch.save`` of the same
weights (a state_dict of torch tensors); save and load times, the contenders interleaved round by
round in one process, reported as medians and as the median of per-round ratios; and, for the
dequantize-at-load design, the memory an INT8-resident model would save against the time it would
pay per forward to dequantize its weights. The MLP (784-128-64-10) and, when neuroflow-ops-vision
is installed, the NeuroFlow-CNN are trained on MNIST and evaluated on its test set before and after
an INT8 round trip; ResNet-18 (CIFAR stem, 11.2 M parameters) stands for a large file.

    python benchmarks/checkpoint.py                  # full run: MLP 1 epoch, CNN 1 epoch (minutes)
    python benchmarks/checkpoint.py --cnn-steps 300  # CNN trained for 300 steps only
    python benchmarks/checkpoint.py --timing-only    # sizes and timings of untrained models, no accuracy
    python benchmarks/checkpoint.py --quick          # smoke test: 3 rounds, 100 training steps each
    python benchmarks/checkpoint.py --json out.json  # also write every sample

nf.save writes atomically and fsyncs (a crash never leaves half a file); torch.save does neither,
so the ``torch.save+fsync`` column adds the fsync for a like-for-like durability comparison.

What each load includes:

* ``nf.load``: the header, metadata and topology checks, the model rebuilt through the op registry,
  every tensor's CRC-32 verified; the file is mapped (copy-on-write), and a float model's
  parameters view its bytes. ``nf.load read`` is the same with ``mmap=False``: the file is read
  into private memory, as ``torch.load`` does by default.
* ``torch.load``: ``torch.load(weights_only=True)`` of a ``torch.save``d state_dict: a dict of
  tensors, no model, no checksums. ``torch.load mmap`` passes ``mmap=True``.
* ``torch load+copy``: ``torch.load`` plus ``load_state_dict`` into a torch module built beforehand
  (not timed) with the same parameter and buffer names and shapes, for the cost of getting a model
  with the weights in place; building a torch model with its random initialisation would add more.

Every load starts with the process's free memory returned to the OS (see ``_timed_load``).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import harness
import neuroflow as nf
from neuroflow import ops, registry
from neuroflow.checkpoint.quantize import dequantize_int8, quantizable, quantize_int8


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


try:
    _LIBC: Any = ctypes.CDLL("libc.so.6") if sys.platform.startswith("linux") else None
except OSError:
    _LIBC = None


def _timed_load(fn: Callable[[], Any]) -> float:
    """Time one load that starts with the process's free memory handed back to the OS (glibc ``malloc_trim``).

    Otherwise a load reuses the pages the previous round's loads freed, and how many it finds depends
    on what else the round ran: torch.load of ResNet-18 measured 17 to 63 ms here by that alone. A
    process loading its model once pays for fresh pages, and so does each load timed here.
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
    return _timed(fn)


def _torch_state(model: nf.Operator) -> dict[str, Any]:
    import torch

    return {name: torch.from_numpy(np.array(array)) for name, array in model.state_dict().items()}


def _torch_module(model: nf.Operator) -> Any:
    """A torch module tree with ``model``'s parameter and buffer names and shapes (what load_state_dict walks)."""
    import torch

    root = torch.nn.Module()
    parameters = {name for name, _ in model.named_parameters()}
    for name, array in _torch_state(model).items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, torch.nn.Module())
            module = module._modules[part]
        if name in parameters:
            module.register_parameter(leaf, torch.nn.Parameter(torch.empty_like(array)))
        else:
            module.register_buffer(leaf, torch.empty_like(array))
    return root


def _torch_save_fsync(state: dict[str, Any], path: Path) -> None:
    import torch

    with open(path, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())


# --------------------------------------------------------------------------- training
def _train(model: nf.Operator, flat: bool, steps: int | None, epochs: int, lr: float) -> nf.Trainer:
    """AdamW on MNIST for ``epochs`` epochs, or only the first ``steps`` batches when given."""
    trainer = nf.Trainer(model, optimizer=nf.optim.AdamW(lr=lr), batch_size=64, seed=0, progress=False)
    train = nf.data.mnist("train", flat=flat)
    if steps is None:
        trainer.fit(train, epochs=epochs)
    else:
        order = np.random.default_rng(0).permutation(len(train))
        for i in range(steps):
            trainer.train_step(*train[order[i * 64 % len(train):][:64]])
    return trainer


def _accuracy(model: nf.Operator, flat: bool) -> float:
    trainer = nf.Trainer(model, batch_size=500, progress=False)
    return trainer.evaluate(nf.data.mnist("test", flat=flat))["accuracy"]


# --------------------------------------------------------------------------- measurements
def measure_files(name: str, model: nf.Operator, folder: Path, rounds: int) -> dict[str, Any]:
    """Sizes and interleaved save/load timings of one model against torch."""
    import torch

    fp32, int8, pt, pt_sync = (folder / f"{name}{suffix}" for suffix in (".safetensors", ".int8.safetensors",
                                                                         ".pt", ".fsync.pt"))
    state = _torch_state(model)
    quantization = nf.save(model, int8, quantize="int8").quantization
    blocks: dict[str, Callable[[], float]] = {
        "nf.save": lambda: _timed(lambda: nf.save(model, fp32)),
        "torch.save": lambda: _timed(lambda: torch.save(state, pt)),
        "torch.save+fsync": lambda: _timed(lambda: _torch_save_fsync(state, pt_sync)),
        "nf.save int8": lambda: _timed(lambda: nf.save(model, int8, quantize="int8")),
    }
    for block in blocks.values():
        block()  # create the files and warm up before timing the loads
    mirror = _torch_module(model)
    blocks.update({
        "nf.load": lambda: _timed_load(lambda: nf.load(fp32)),
        "nf.load read": lambda: _timed_load(lambda: nf.load(fp32, mmap=False)),
        "nf.load int8": lambda: _timed_load(lambda: nf.load(int8)),
        "torch.load": lambda: _timed_load(lambda: torch.load(pt, weights_only=True)),
        "torch.load mmap": lambda: _timed_load(lambda: torch.load(pt, weights_only=True, mmap=True)),
        "torch load+copy": lambda: _timed_load(lambda: mirror.load_state_dict(torch.load(pt, weights_only=True))),
    })
    for block in list(blocks.values())[-6:]:
        block()
    samples = _shuffled_rounds(blocks, rounds)
    pairs = {
        "nf.load / torch.load": ("nf.load", "torch.load"),
        "nf.load read / torch.load": ("nf.load read", "torch.load"),
        "nf.load / torch.load mmap": ("nf.load", "torch.load mmap"),
        "nf.load / torch load+copy": ("nf.load", "torch load+copy"),
        "nf.load int8 / torch.load": ("nf.load int8", "torch.load"),
        "nf.save / torch.save": ("nf.save", "torch.save"),
        "nf.save / torch.save+fsync": ("nf.save", "torch.save+fsync"),
    }
    return {
        "model": name,
        "parameters": int(sum(p.data.size for p in model.parameters())),
        "bytes": {"nf fp32": fp32.stat().st_size, "nf int8": int8.stat().st_size, "torch.save": pt.stat().st_size},
        "median_s": {key: statistics.median(values) for key, values in samples.items()},
        "ratio": {key: _ratio_quartiles(samples[a], samples[b]) for key, (a, b) in pairs.items()},
        "int8_max_relative_error": quantization.max_relative_error if quantization else 0.0,
        "load_peak_bytes": {"fp32": _load_peak(fp32), "int8": _load_peak(int8)},
        "samples": samples,
    }


def _shuffled_rounds(blocks: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """One sample per round from each block, in a new random order every round.

    A block's time depends on the block before it (a load right after an fsynced save ran about
    15 % slower than the same load after another load), which a fixed order would turn into bias.
    """
    order = random.Random(0)
    samples: dict[str, list[float]] = {name: [] for name in blocks}
    for _ in range(rounds):
        names = list(blocks)
        order.shuffle(names)
        for name in names:
            samples[name].append(blocks[name]())
    return samples


def _ratio_quartiles(numerator: list[float], denominator: list[float]) -> dict[str, float]:
    """Median and quartiles of the per-round ratios (blocks of one round ran moments apart, so load drift cancels)."""
    ratios = sorted(a / b for a, b in zip(numerator, denominator, strict=True))
    q1, median, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    return {"median": median, "q1": q1, "q3": q3}


def _load_peak(path: Path) -> int:
    """Peak of Python and numpy allocations while loading, reading the file (tracemalloc cannot see a mapping)."""
    tracemalloc.start()
    try:
        nf.load(path, mmap=False)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def measure_int8_residency(model: nf.Operator, input_shape: tuple[int, ...], rounds: int) -> dict[str, Any]:
    """Dequantize at load vs keep INT8 resident: bytes held, and the per-forward cost of dequantizing."""
    parameters = dict(model.named_parameters())
    quantized = {name: quantize_int8(t.data) for name, t in parameters.items() if quantizable(t.data)}
    float_bytes = sum(t.data.nbytes for t in parameters.values())
    kept_float = sum(t.data.nbytes for name, t in parameters.items() if name not in quantized)
    int8_bytes = kept_float + sum(q.nbytes + s.nbytes for q, s in quantized.values())
    largest = max(parameters[name].data.nbytes for name in quantized)  # one scratch buffer, reused per layer
    scratch = {name: np.empty(parameters[name].shape, np.float32) for name in quantized}

    def dequantize_all() -> None:
        for name, (q, s) in quantized.items():
            dequantize_int8(q, s, scratch[name])

    model.eval()
    x = np.random.default_rng(0).random(input_shape, dtype=np.float32)
    samples = harness.interleave({
        "forward": lambda: _timed(lambda: model.forward(x)),
        "dequantize": lambda: _timed(dequantize_all),
    }, rounds)
    return {
        "resident_bytes_float": float_bytes,
        "resident_bytes_int8": int8_bytes + largest,
        "forward_s": statistics.median(samples["forward"]),
        "dequantize_s": statistics.median(samples["dequantize"]),
        "dequantize_over_forward": harness.paired_ratio(samples["dequantize"], samples["forward"]),
        "input_shape": list(input_shape),
    }


def _train_and_measure(
    name: str, model: nf.Operator, flat: bool, steps: int | None, lr: float, folder: Path
) -> dict[str, Any]:
    """Train on MNIST, then test accuracy of the float model and of its INT8 file loaded back."""
    start = time.perf_counter()
    _train(model, flat=flat, steps=steps, epochs=1, lr=lr)
    trained = f"{steps} steps" if steps else "1 epoch"
    print(f"{name} trained ({trained}) in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    path = folder / "trained.int8.safetensors"
    report = nf.save(model, path, quantize="int8").quantization
    fp32 = _accuracy(model, flat)
    int8 = _accuracy(nf.load(path), flat)
    return {"model": name, "trained": trained, "fp32": fp32, "int8": int8, "drop_points": 100 * (fp32 - int8),
            "max_relative_error": report.max_relative_error if report else 0.0}


# --------------------------------------------------------------------------- report
def _mb(n: int) -> str:
    return f"{n / 1e6:.3f}"


def _r(f: dict[str, Any], key: str) -> str:
    r = f["ratio"][key]
    return f"{r['median']:.2f}× [{r['q1']:.2f}–{r['q3']:.2f}]"


def report(files: list[dict[str, Any]], residency: dict[str, dict[str, Any]], accuracy: list[dict[str, Any]]) -> str:
    lines = ["## File size (MB)", ""]
    lines.append(harness.markdown_table(
        ["model", "params", "nf fp32", "nf int8", "torch.save", "int8 / fp32", "int8 / torch"],
        [[f["model"], f"{f['parameters']:,}", _mb(f["bytes"]["nf fp32"]), _mb(f["bytes"]["nf int8"]),
          _mb(f["bytes"]["torch.save"]), f"{f['bytes']['nf int8'] / f['bytes']['nf fp32']:.3f}",
          f"{f['bytes']['nf int8'] / f['bytes']['torch.save']:.3f}"] for f in files]))
    lines += ["", "## Save, median ms (ratios: median [quartiles] of per-round ratios)", ""]
    keys = ["nf.save", "nf.save int8", "torch.save", "torch.save+fsync"]
    lines.append(harness.markdown_table(
        ["model", *keys, "save / torch", "save / torch+fsync"],
        [[f["model"], *(f"{1e3 * f['median_s'][k]:.2f}" for k in keys), _r(f, "nf.save / torch.save"),
          _r(f, "nf.save / torch.save+fsync")] for f in files]))
    lines += ["", "## Load, median ms (what each includes: see the module docstring)", ""]
    keys = ["nf.load", "nf.load read", "nf.load int8", "torch.load", "torch.load mmap", "torch load+copy"]
    lines.append(harness.markdown_table(
        ["model", *keys], [[f["model"], *(f"{1e3 * f['median_s'][k]:.3f}" for k in keys)] for f in files]))
    lines += ["", "## Load ratios: median [quartiles] of per-round ratios", ""]
    ratios = ["nf.load / torch.load", "nf.load read / torch.load", "nf.load / torch.load mmap",
              "nf.load / torch load+copy", "nf.load int8 / torch.load"]
    lines.append(harness.markdown_table(["model", *ratios], [[f["model"], *(_r(f, k) for k in ratios)] for f in files]))
    lines += ["", "## INT8 kept resident vs dequantized at load", ""]
    lines.append(harness.markdown_table(
        ["model", "float MB", "int8 MB (+1 scratch)", "saved MB", "forward ms", "dequantize-all ms", "dequant / fwd",
         "load peak fp32 MB (read)", "load peak int8 MB (read)"],
        [[f["model"], _mb(r["resident_bytes_float"]), _mb(r["resident_bytes_int8"]),
          _mb(r["resident_bytes_float"] - r["resident_bytes_int8"]), f"{1e3 * r['forward_s']:.2f}",
          f"{1e3 * r['dequantize_s']:.2f}", f"{r['dequantize_over_forward']:.2f}×",
          _mb(f["load_peak_bytes"]["fp32"]), _mb(f["load_peak_bytes"]["int8"])]
         for f in files if (r := residency.get(f["model"]))]))
    if accuracy:
        lines += ["", "## MNIST test accuracy, float32 vs INT8 file", ""]
        lines.append(harness.markdown_table(
            ["model", "trained", "fp32 %", "int8 %", "drop (points)", "max rel. L2 error"],
            [[a["model"], a["trained"], f"{100 * a['fp32']:.2f}", f"{100 * a['int8']:.2f}", f"{a['drop_points']:.2f}",
              f"{100 * a['max_relative_error']:.2f}%"] for a in accuracy]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 rounds, 100 training steps per model")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (default 15)")
    parser.add_argument("--mlp-steps", type=int, default=None, help="train the MLP this many steps (default 1 epoch)")
    parser.add_argument("--cnn-steps", type=int, default=None, help="train the CNN this many steps (default 1 epoch)")
    parser.add_argument("--timing-only", action="store_true", help="untrained models: no MNIST, no accuracy")
    parser.add_argument("--json", type=Path, help="also write all results and samples here")
    args = parser.parse_args(argv)
    rounds = 3 if args.quick else args.rounds
    mlp_steps = 100 if args.quick and args.mlp_steps is None else args.mlp_steps
    cnn_steps = 100 if args.quick and args.cnn_steps is None else args.cnn_steps
    vision = "neuroflow_cnn" in registry.models.names()

    files, accuracy, residency = [], [], {}
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        nf.manual_seed(0)
        mlp = nf.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(), ops.Linear(64, 10))
        if not args.timing_only:
            accuracy.append(_train_and_measure("MLP 784-128-64-10", mlp, True, mlp_steps, 1e-3, folder))
        models: list[tuple[str, nf.Operator, tuple[int, ...]]] = [("MLP 784-128-64-10", mlp, (64, 784))]
        if vision:
            nf.manual_seed(0)
            cnn = registry.models.get("neuroflow_cnn")()
            if not args.timing_only:
                accuracy.append(_train_and_measure("NeuroFlow-CNN", cnn, False, cnn_steps, 2e-3, folder))
            models.append(("NeuroFlow-CNN", cnn, (64, 1, 28, 28)))
            models.append(("ResNet-18 (CIFAR)", registry.models.get("resnet18")(), (8, 3, 32, 32)))
        else:
            print("neuroflow-ops-vision is not installed: no CNN, no ResNet-18", file=sys.stderr)
        for name, model, shape in models:
            files.append(measure_files(name, model, folder, rounds))
            residency[name] = measure_int8_residency(model, shape, rounds)
            print(f"measured {name}", file=sys.stderr)

    print(f"# Checkpoint benchmark ({harness.source_version(str(Path(__file__).parent))}, "
          f"load {harness.machine_load()}, {rounds} rounds)\n")
    print(report(files, residency, accuracy))
    if args.json:
        args.json.write_text(json.dumps({"files": files, "residency": residency, "accuracy": accuracy}, indent=1))


if __name__ == "__main__":
    main()
