"""A training run for the data-parallel tests, under ``mpiexec -n N`` (or alone, for the reference).

``python worker_train.py OUT.npz --model mlp|cnn|cnnbn|nfcnn --optimizer sgd|adamw --steps S --batch B --accumulation K
[--distributed mpi|none] [--debug] [--dtype float32|float64] [--eval-rows R]`` trains S steps on fixed data with global batch B and
writes (rank 0, or the process alone) the flat parameters, the step losses and each rank's parameter checksums per
step to OUT.npz.
"""

from __future__ import annotations

import argparse
import zlib

import numpy as np

import neuroflow as nf
from neuroflow import ops, optim

# samples: not a multiple of the batches used, so the last batch of an epoch is short and unevenly shared
SAMPLES = 203


def build(model: str, dtype: str) -> nf.Sequential:
    nf.manual_seed(1)
    vision = nf.registry.ops
    if model == "mlp":
        net = nf.Sequential(ops.Linear(12, 32), ops.ReLU(), ops.Linear(32, 16), ops.Tanh(), ops.Linear(16, 5))
    elif model == "cnn":
        conv, pool = vision.get("Conv2d"), vision.get("MaxPool2d")
        net = nf.Sequential(conv(3, 6, 3, padding=1), ops.ReLU(), pool(2), conv(6, 8, 3, padding=1), ops.ReLU(),
                            pool(2), ops.Flatten(), ops.Linear(8 * 2 * 2, 5))
    elif model == "nfcnn":  # the registry's NeuroFlow-CNN: NHWC BatchNorm with a fused ReLU, separable convs, SE
        net = nf.registry.models.get("neuroflow_cnn")(num_classes=5, in_channels=3, width=8)
    else:  # with BatchNorm: per-rank batch statistics unless --sync-bn (then as one process)
        conv, bn, pool = vision.get("Conv2d"), vision.get("BatchNorm2d"), vision.get("MaxPool2d")
        net = nf.Sequential(conv(3, 6, 3, padding=1), bn(6), ops.ReLU(), pool(4), ops.Flatten(),
                            ops.Linear(6 * 2 * 2, 5))
    return net.astype(np.dtype(dtype)) if dtype != "float32" else net


def data(model: str, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    y = rng.integers(0, 5, SAMPLES)
    shape = (12,) if model == "mlp" else (3, 8, 8)
    x = rng.standard_normal((SAMPLES, *shape)) + y.reshape(-1, *[1] * len(shape)) * 0.3
    return x.astype(dtype), y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--distributed", default="mpi")
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--dtype", default="float64")
    parser.add_argument("--bucket-mb", type=float, default=None)
    parser.add_argument("--clip", type=float, default=None)
    parser.add_argument("--sync-bn", action="store_true")
    parser.add_argument("--topk", type=float, default=None, help="gradient_compression='topk' with this ratio")
    parser.add_argument("--eval-rows", type=int, default=None, help="evaluate on the first rows only (default: all)")
    args = parser.parse_args()

    model = build(args.model, args.dtype)
    optimizer = optim.SGD(lr=0.05, momentum=0.9) if args.optimizer == "sgd" else optim.AdamW(lr=3e-3)
    trainer = nf.Trainer(model, optimizer=optimizer, batch_size=args.batch, seed=3, progress=False,
                         gradient_accumulation_steps=args.accumulation, max_steps=args.steps, debug=args.debug,
                         distributed=None if args.distributed == "none" else args.distributed,
                         bucket_mb=args.bucket_mb, clip_grad_norm=args.clip, sync_batchnorm=args.sync_bn,
                         gradient_compression=None if args.topk is None else "topk", compression_ratio=args.topk)

    x, y = data(args.model, args.dtype)
    history = trainer.fit((x, y), epochs=1)
    flat = trainer.flat_parameters
    checksum = zlib.crc32(np.ascontiguousarray(flat.data).tobytes())
    parallel = trainer.parallel
    rank, size = (0, 1) if parallel is None else (parallel.rank, parallel.size)
    buffers = zlib.crc32(b"".join(np.ascontiguousarray(t.data).tobytes() for _, t in model.named_buffers()))
    both = [float(checksum), float(buffers)]
    sums = both if parallel is None else parallel.communicator.allreduce_scalars(both, "max")
    lows = both if parallel is None else parallel.communicator.allreduce_scalars(both, "min")
    metrics = trainer.evaluate((x[:args.eval_rows], y[:args.eval_rows]))
    if trainer.is_root:
        np.savez(args.out, params=np.array(flat.data, dtype=np.float64), steps=trainer.step, size=size, rank=rank,
                 loss=np.array([row["loss"] for row in history]), checksum_max=sums[0], checksum_min=lows[0],
                 buffers_max=sums[1], buffers_min=lows[1],
                 buffers=np.concatenate([np.ravel(t.data) for _, t in model.named_buffers()] or [np.zeros(0)]),
                 eval_loss=metrics["loss"], eval_accuracy=metrics["accuracy"])


if __name__ == "__main__":
    main()
