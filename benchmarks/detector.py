"""NeuroFlow-YOLO-lite, NeuroFlow vs its PyTorch twin on the CPU: training step and inference, at 2 threads.

The model is ``registry.models.get("yolo_lite")(num_classes=10)`` as a user calls it (1×96×96 canvases, head
45×12×12); PyTorch runs ``torch_yolo_lite`` (``neuroflow_ops_vision.models.torch_yolo_twin``) loaded from its
state dict by name. Three measurements, each NeuroFlow against PyTorch:

- **train step, batch 16**: forward, the detection loss read back as a float, backward, SGD (lr 0.01,
  momentum 0.9). NeuroFlow: ``nf.Trainer(model, DetectionLoss.for_model(model), SGD).train_step(x, targets)``;
  PyTorch: ``zero_grad``, forward, ``torch_yolo_loss`` (YOLOv5's ``ComputeLoss`` for one level, with the
  gains ``DetectionLoss`` uses), ``backward``, ``step``, ``item``. Same weights, same batch: the first
  losses must agree or the run stops.
- with numba installed, a further contender runs the same NeuroFlow model on numpy alone (``NEUROFLOW_NUMBA=0``:
  no compiled depthwise convolutions or batch normalisations), beside the main one's compiled kernels.
- **inference, batch 1 and batch 16**: decoded boxes (B, 432, 15) from a batch of canvases, the model in
  eval mode. NeuroFlow: ``trainer.predict(x)`` (forward and ``DetectionLoss.predictions``, the YOLOv5
  decode); PyTorch: ``twin(x)`` and the same decode in torch, under ``torch.inference_mode()``.
- **frames**: the batch-1 prediction as a camera feeds it, one image every 1/``--fps`` s (default 30):
  the latency of each prediction after the idle gap, median and 90th percentile. The contenders take turns
  by blocks of frames, so none runs right after another's prediction.

The batch: 16 random canvases with 1–5 boxes of 8–36 px a side each (random classes), padded to 5 rows; timing is
not sensitive to the pixels. Every contender of a measurement runs in one process per thread count,
interleaved (see ``harness.py`` and ``benchmarks/README.md``); ``--separate-processes`` adds the training
step of each contender alone in its own process, with its peak RSS rise over setup.

    .venv/bin/python benchmarks/detector.py                       # 2 threads, about a minute
    .venv/bin/python benchmarks/detector.py --separate-processes  # + peak RSS rise of a training step
    .venv/bin/python benchmarks/detector.py --keep-maps           # NeuroFlow keeping every map to backward
    .venv/bin/python benchmarks/detector.py --measurements train --separate-processes --warm-process  # RSS, code out
    .venv/bin/python benchmarks/detector.py --measurements frames --fps 10  # a slower camera
    .venv/bin/python benchmarks/detector.py --quick               # smoke test: not a measurement
"""

from __future__ import annotations

import neuroflow  # noqa: F401 - first, as the spec's snippet does: it shortens OpenBLAS's idle spin (neuroflow.blas_idle)

# isort: split
import argparse
import functools
import importlib.util
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import harness

LR, MOMENTUM = 0.01, 0.9
BATCH, SIZE, CLASSES, MAX_OBJECTS = 16, 96, 10, 5
MAIN, TORCH = "NeuroFlow", "PyTorch"
#: the main contender on numpy alone (NEUROFLOW_NUMBA=0: no compiled kernels): present where numba is, to show what
#: the compiled depthwise convolutions and batch normalisations give
NUMPY_ONLY = "NeuroFlow, numpy only"
#: --keep-maps: the NeuroFlow contenders keep every feature map from forward to backward
KEEP_MAPS = False
#: measurement key -> (row label, batch, training)
MEASUREMENTS = {"train": ("train step, batch 16", BATCH, True), "infer1": ("inference, batch 1", 1, False),
                "infer16": ("inference, batch 16", BATCH, False)}
#: the measurement of one image at a time with idle gaps between (timed by :func:`frame_latencies`, not the harness)
FRAMES = "frames"


def batch_data(n: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
    """``n`` random canvases and their padded (n, 5, 5) targets: 1–5 boxes of 8–36 px a side (as the ink boxes of
    digits pasted at 16–48 px), random classes."""
    rng = np.random.default_rng(1)
    images = rng.random((n, 1, SIZE, SIZE)).astype(np.float32)
    targets = np.zeros((n, MAX_OBJECTS, 5), np.float32)
    targets[..., 0] = -1
    for b in range(n):
        for row in range(int(rng.integers(1, MAX_OBJECTS + 1))):
            w, h = rng.uniform(8, 36, 2)
            x1, y1 = rng.uniform(0, SIZE - w), rng.uniform(0, SIZE - h)
            targets[b, row] = [rng.integers(0, CLASSES), x1, y1, x1 + w, y1 + h]
    return images, targets


def build_neuroflow() -> Any:
    """The registry's model as a user calls it (seeded: every contender starts from these weights)."""
    import neuroflow as nf
    from neuroflow import registry

    nf.manual_seed(0)
    return registry.models.get("yolo_lite")(num_classes=CLASSES)


def neuroflow_trainer() -> Any:
    import neuroflow as nf
    from neuroflow_ops_vision import SeparableConv2d
    from neuroflow_ops_vision.detection.loss import DetectionLoss

    model = build_neuroflow()
    if KEEP_MAPS:
        for module in model.modules():
            if isinstance(module, (nf.Sequential, SeparableConv2d)):
                module.recompute_outputs = False
    return nf.Trainer(model, DetectionLoss.for_model(model), nf.optim.SGD(lr=LR, momentum=MOMENTUM),
                      batch_size=BATCH, progress=False, seed=0)


def torch_twin() -> tuple[Any, Any]:
    """The twin with the NeuroFlow model's weights, and the NeuroFlow loss (for its gains and anchors)."""
    from neuroflow_ops_vision.detection.loss import DetectionLoss
    from neuroflow_ops_vision.models.torch_yolo_twin import load_neuroflow_weights, torch_yolo_lite

    model = build_neuroflow()
    return load_neuroflow_weights(torch_yolo_lite(CLASSES), model.state_dict()), DetectionLoss.for_model(model)


def torch_decode(output: Any, anchors: np.ndarray, stride: int) -> Any:
    """``boxes.decode`` in torch: (B, A·(5+C), H, W) -> (B, A·H·W, 5+C) x1, y1, x2, y2, objectness, classes."""
    import torch

    batch, channels, height, width = output.shape
    count = len(anchors)
    p = output.view(batch, count, channels // count, height, width).permute(0, 1, 3, 4, 2).sigmoid()
    gy, gx = torch.meshgrid(torch.arange(height, dtype=p.dtype), torch.arange(width, dtype=p.dtype), indexing="ij")
    wh = torch.as_tensor(anchors, dtype=p.dtype).view(1, count, 1, 1, 2)
    centre = (2 * p[..., :2] - 0.5 + torch.stack((gx, gy), -1)) * stride
    size = (2 * p[..., 2:4]) ** 2 * wh
    return torch.cat((centre - size / 2, centre + size / 2, p[..., 4:]), -1).reshape(batch, -1, channels // count)


def stepper(name: str, key: str, rows: int | None = None) -> Callable[[], float]:
    """One step of contender ``name`` for measurement ``key`` (on the first ``rows`` canvases of its batch where
    given); returns its loss (training) or a checksum."""
    _, n, training = MEASUREMENTS[key]
    x, targets = batch_data(BATCH)
    x, targets = x[:rows or n], targets[:rows or n]
    if name in (MAIN, NUMPY_ONLY):
        trainer = neuroflow_trainer()
        run = (lambda: trainer.train_step(x, targets)) if training else (lambda: float(trainer.predict(x).sum()))
        return run if name == MAIN else numpy_only(run)
    import torch

    from neuroflow_ops_vision.models.torch_yolo_twin import torch_yolo_loss

    model, loss = torch_twin()
    xt = torch.from_numpy(x)
    if not training:
        model.eval()

        def infer() -> float:
            with torch.inference_mode():
                return float(torch_decode(model(xt), loss.anchors, loss.stride).sum())

        return infer
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    box, obj, cls = loss.gains

    def step() -> float:
        optimizer.zero_grad()
        value, _ = torch_yolo_loss(model(xt), targets, loss.anchors, loss.stride, CLASSES, box=box, obj=obj, cls=cls)
        value.backward()
        optimizer.step()
        return value.item()

    return step


def numpy_only(run: Callable[[], float]) -> Callable[[], float]:
    """``run`` with every op on numpy alone, the other contenders' setting kept."""
    from neuroflow_ops_vision import compiled

    def step() -> float:
        compiled.use_numba(False)
        try:
            return run()
        finally:
            compiled.use_numba(True)

    return step


def contenders() -> list[str]:
    names = [MAIN]
    if importlib.util.find_spec("numba") is not None:
        names.append(NUMPY_ONLY)
    return names + ([TORCH] if importlib.util.find_spec("torch") is not None else [])


# ---------------------------------------------------------------------------------------------- children
def one_process_child(args: argparse.Namespace) -> None:
    """Every measurement's contenders in this process, timed interleaved; one JSON line."""
    keys = [key for key in args.measurements if key != FRAMES]
    steppers = {key: {name: stepper(name, key) for name in contenders()} for key in keys}
    # a batch-1 prediction takes a few ms: its blocks take the images of a batch-16 block (16× the steps), so
    # that the wake-up after each pause is as small a part of them as of the others
    multiples = {key: BATCH // MEASUREMENTS[key][1] for key in keys}
    results, threads = harness.measure_in_child(steppers, args, functools.partial(harness.first_values_agree,
                                                                                 what="first value"), multiples)
    payload: dict[str, Any] = {"measurements": results}
    if FRAMES in args.measurements:
        payload[FRAMES] = frame_latencies({name: stepper(name, "infer1") for name in contenders()}, args.fps,
                                          args.repeats, args.frames_per_block, args.warmup)
    harness.print_child_line(payload, threads)


def frame_latencies(steppers: dict[str, Callable[[], float]], fps: float, rounds: int, frames: int,
                    warmup: int) -> dict[str, Any]:
    """Seconds of each batch-1 prediction made 1/``fps`` s after the previous one ended: ``rounds`` rounds in
    which every contender (in turn, the order rotating) takes a block of ``frames`` frames."""
    harness.warm_up(steppers, warmup, functools.partial(harness.first_values_agree, what="first value"))
    gap = 1.0 / fps

    def block(step: Callable[[], float]) -> list[float]:
        latencies = []
        for _ in range(frames):
            time.sleep(gap)
            start = time.perf_counter()
            step()
            latencies.append(time.perf_counter() - start)
        return latencies

    blocks = harness.interleave({name: functools.partial(block, step) for name, step in steppers.items()}, rounds)
    return {"fps": fps, "samples_s": {name: [t for one in runs for t in one] for name, runs in blocks.items()}}


def frames_table(results: list[dict[str, Any]]) -> str:
    """Median and 90th-percentile latency of a prediction after the idle gap, and the medians' ratio to PyTorch's."""
    names = contenders()
    headers = ["threads", "fps", *(f"{n} median ms" for n in names), *(f"{n} p90 ms" for n in names)]
    headers += [f"{n}/PyTorch" for n in names if n != TORCH] if TORCH in names else []
    table = []
    for result in results:
        frames = result[FRAMES]
        samples = {n: np.asarray(frames["samples_s"][n]) * 1e3 for n in names}
        median = {n: float(np.median(samples[n])) for n in names}
        cells: list[object] = [result["threads"], f"{frames['fps']:g}", *(f"{median[n]:.2f}" for n in names)]
        cells += [f"{np.percentile(samples[n], 90):.2f}" for n in names]
        cells += [f"{median[n] / median[TORCH]:.2f}×" for n in names if n != TORCH] if TORCH in names else []
        table.append(cells)
    return harness.markdown_table(headers, table)


def worker(args: argparse.Namespace) -> None:
    """One contender's training step alone in this process: RSS through its first steps, then timed blocks."""
    name, threads = args.contender, args.threads_child
    info = harness.worker_info(name, threads, name == TORCH)
    if args.warm_process:  # code loaded on first use (numba's kernels, PyTorch's lazy set-up) goes into setup
        stepper(name, "train", rows=2)()
    harness.start_worker(stepper(name, "train"), args.warmup, info)


def measure_separately(script: str, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    workers: dict[str, harness.Worker] = {}
    try:
        for name in contenders():
            argv = [script, "--child", "--contender", name, "--threads-child", str(threads), "--warmup", str(args.warmup)]
            argv += ["--keep-maps"] if args.keep_maps else []
            workers[name] = harness.Worker(argv + (["--warm-process"] if args.warm_process else []),
                                           env=harness.thread_env(threads))
        harness.first_values_agree({name: w.info["first_losses"] for name, w in workers.items()})
        samples = harness.interleave({name: functools.partial(w.run, args.steps, args.settle) for name, w in workers.items()},
                                     args.repeats, harness.pause_for(threads, args.pause))
    finally:
        for w in workers.values():
            w.close()
    return {"threads": threads, "samples_s": samples, "workers": {name: w.info for name, w in workers.items()}}


# ---------------------------------------------------------------------------------------------- report
def rows_of(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ratio-table row group per (measurement, thread count)."""
    return [{"what": MEASUREMENTS[key][0], "threads": r["threads"], **m}
            for r in results for key, m in r["measurements"].items()]


def throughput_table(rows: list[dict[str, Any]]) -> str:
    """Images per second of every contender (batch / median step time) and NeuroFlow's over PyTorch's."""
    names = contenders()
    headers = ["what", "threads", *(f"{n} images/s" for n in names)] + (["NeuroFlow/PyTorch"] if TORCH in names else [])
    table = []
    for row in rows:
        batch = next(b for label, b, _ in MEASUREMENTS.values() if label == row["what"])
        rate = {n: batch / statistics.median(row["samples_s"][n]) for n in names}
        cells: list[object] = [row["what"], row["threads"], *(f"{rate[n]:.1f}" for n in names)]
        if TORCH in names:
            cells.append(f"{rate[MAIN] / rate[TORCH]:.2f}×")
        table.append(cells)
    return harness.markdown_table(headers, table)


def rss_table(separate: list[dict[str, Any]]) -> str:
    """Per thread count: each contender's step time, its peak RSS rise over setup, and its whole process's peak
    (setup, which holds the interpreter and the framework's code, plus that rise: what the machine must have)."""
    names = contenders()
    headers = ["threads", *(f"{n} ms" for n in names), *(f"{n} RSS rise MB" for n in names),
               *(f"{n} process peak MB" for n in names)]
    headers += ["ms NeuroFlow/PyTorch", "RSS rise NeuroFlow/PyTorch", "process peak NeuroFlow/PyTorch"] \
        if TORCH in names else []
    table = []
    for result in separate:
        rise: dict[str, int | None] = {n: result["workers"][n]["peak_rise_kb"] for n in names}
        peak = {n: None if kb is None else result["workers"][n]["rss_setup_kb"] + kb for n, kb in rise.items()}
        cells: list[object] = [result["threads"], *(f"{statistics.median(result['samples_s'][n]) * 1e3:.1f}" for n in names)]
        for kb in (rise, peak):
            cells += ["—" if value is None else f"{value / 1024:.1f}" for value in (kb[n] for n in names)]
        if TORCH in names:
            cells.append(f"{harness.paired_ratio(result['samples_s'][MAIN], result['samples_s'][TORCH]):.2f}×")
            for kb in (rise, peak):
                ours, theirs = kb[MAIN], kb[TORCH]
                cells.append(f"{ours / theirs:.2f}×" if ours and theirs else "—")
        table.append(cells)
    return harness.markdown_table(headers, table)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="NeuroFlow-YOLO-lite: training step and inference vs PyTorch")
    parser.add_argument("--quick", action="store_true", help="few repeats and steps: a smoke test, not a measurement")
    parser.add_argument("--json", metavar="FILE", help="write settings, every sample and the tables to FILE")
    parser.add_argument("--threads", default="2", help="comma-separated thread counts (default 2)")
    parser.add_argument("--repeats", type=int, help="interleaved repetitions (default 9; 2 with --quick)")
    parser.add_argument("--steps", type=int, help="steps per timed block (default 3; 1 with --quick; 16× at batch 1)")
    parser.add_argument("--warmup", type=int, help="untimed steps per contender first (default 3; 0 with --quick)")
    parser.add_argument("--pause", type=float, help=f"seconds idle before each block (default {harness.SPIN_PAUSE_S} "
                                                    "above one thread, 0 at one)")
    harness.add_settle_argument(parser)
    parser.add_argument("--measurements", default=",".join([*MEASUREMENTS, FRAMES]),
                        help=f"comma-separated, of {', '.join([*MEASUREMENTS, FRAMES])} (default all)")
    parser.add_argument("--fps", type=float, default=30.0,
                        help="frames: images per second the camera sends (default 30)")
    parser.add_argument("--frames-per-block", type=int,
                        help="frames: predictions per contender's block in a round (default 20; 3 with --quick)")
    parser.add_argument("--separate-processes", action="store_true",
                        help="also time each contender's training step alone in its own process, with peak RSS rise")
    parser.add_argument("--keep-maps", action="store_true",
                        help="NeuroFlow keeps every feature map from forward to backward (recompute_outputs False on "
                             "the Sequentials and SeparableConv2ds): what letting the maps go costs and saves")
    parser.add_argument("--warm-process", action="store_true",
                        help="with --separate-processes: each worker first takes a training step of its own model at "
                             "batch 2, so the RSS rise leaves out code loaded on first use (numba, PyTorch's set-up)")
    parser.add_argument("--one-process-child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads-child", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    harness.fill_defaults(args, {"repeats": (2, 9), "steps": (1, 3), "warmup": (0, 3), "frames_per_block": (3, 20)})
    if args.repeats < 1 or args.steps < 1 or args.warmup < 0 or args.frames_per_block < 1:
        parser.error("--repeats, --steps and --frames-per-block must be at least 1, --warmup at least 0")
    if not 0 < args.fps <= 1000:
        parser.error(f"--fps must be above 0 and at most 1000; got {args.fps}")
    args.measurements = [k for k in args.measurements.split(",") if k]
    unknown = [k for k in args.measurements if k not in MEASUREMENTS and k != FRAMES]
    if unknown or not args.measurements:
        parser.error(f"unknown --measurements {unknown}; expected some of {[*MEASUREMENTS, FRAMES]}")
    return args


def main(argv: list[str] | None = None) -> int:
    global KEEP_MAPS
    args = parse_args(argv)
    KEEP_MAPS = args.keep_maps
    if args.one_process_child is not None:
        one_process_child(args)
        return 0
    if args.child:
        worker(args)
        return 0
    script = os.path.abspath(__file__)
    threads = [int(t) for t in args.threads.split(",")]
    child = [*harness.timing_argv(args), "--measurements", ",".join(args.measurements), "--fps", str(args.fps),
             "--frames-per-block", str(args.frames_per_block)]
    child += ["--keep-maps"] if args.keep_maps else []
    load_before = harness.machine_load()
    results = [harness.one_process_run(script, t, child) for t in threads]
    separate = [measure_separately(script, t, args) for t in threads] if args.separate_processes else []
    rows = rows_of(results)
    references = {name: TORCH for name in contenders() if name != TORCH} if TORCH in contenders() else {}
    report: dict[str, Any] = {
        "case": "NeuroFlow-YOLO-lite (yolo_lite, 10 classes, 1×96×96)", "contenders": contenders(),
        "settings": {"repeats": args.repeats, "steps": args.steps, "warmup": args.warmup, "settle": args.settle,
                     "measurements": args.measurements},
        "source": harness.source_version(os.path.dirname(script)),
        "load_average_before": load_before, "load_average_after": harness.machine_load(), "results": results,
        "table": harness.ratio_table(rows, references, keys=("what", "threads")), "throughput": throughput_table(rows),
    }
    print(f"NeuroFlow-YOLO-lite vs its PyTorch twin: SGD lr {LR} momentum {MOMENTUM}, DetectionLoss vs YOLOv5's loss, "
          f"float32. Every contender in one process per thread count, interleaved: median of {args.repeats} repeats × "
          f"{args.steps} steps ({args.steps * BATCH} at batch 1: the same images per block) after "
          f"{3 + args.warmup} untimed steps (and {args.settle} at the start of each block)")
    for result in results:
        print(f"  threads={result['threads']}: {harness.describe_threads(result['thread_report'])}")
    print(f"  code {report['source']}, numpy {results[0]['numpy']}, torch {results[0]['torch']}; load average before "
          f"{load_before}, after {report['load_average_after']}\n")
    if rows:
        print(report["table"] + "\n\n" + report["throughput"])
    if FRAMES in args.measurements:
        report["frames_table"] = frames_table(results)
        print(f"\nInference, batch 1, one image every 1/{args.fps:g} s (a camera): latency of each prediction after the "
              f"idle gap, {args.repeats} rounds × {args.frames_per_block} frames per contender\n\n{report['frames_table']}")
    line = harness.summary("detector", rows, references, keys=("what", "threads"))
    if FRAMES in args.measurements:
        line["frames_median_ms"] = [{n: round(float(np.median(r[FRAMES]["samples_s"][n])) * 1e3, 3) for n in contenders()}
                                    for r in results]
    if separate:
        report["separate_processes"], report["rss_table"] = separate, rss_table(separate)
        print(f"\nTraining step, each contender alone in its own process: peak RSS rise over setup through the first "
              f"{3 + args.warmup} steps; ms ratio = median of per-round ratios\n\n{report['rss_table']}")
        line["separate_processes"] = harness.summary("", separate, references)["results"]
        line["rss_rise_kb"] = [{n: s["workers"][n]["peak_rise_kb"] for n in contenders()} for s in separate]
    print("\n" + json.dumps(line), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
