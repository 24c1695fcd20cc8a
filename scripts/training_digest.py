"""A digest of fixed training runs, to check that a refactoring leaves training bit for bit as it was.

Trains on cpu, from fixed seeds and random data: an MLP with SGD, an MLP with AdamW, accumulation and
clipping, a small CNN with SGD momentum, a CNN with ``update_in_backward`` and ResNet-18. Each takes four
``train_step`` calls and two epochs of ``fit``. Prints, as JSON, each run's step losses, per-epoch history
(without times) and a sha256 over every parameter. Run it in two checkouts and compare the outputs:

    python scripts/training_digest.py > after.json   # and the same on the other checkout
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

import neuroflow as nf
from neuroflow import ops, optim, registry


def digest(model: nf.Operator) -> str:
    h = hashlib.sha256()
    for name, p in model.named_parameters():
        h.update(name.encode())
        h.update(np.ascontiguousarray(p.data).tobytes())
    return h.hexdigest()


def run(model: nf.Operator, x: np.ndarray, y: np.ndarray, optimizer: Any, **settings: Any) -> dict[str, Any]:
    trainer = nf.Trainer(model, optimizer=optimizer, device="cpu", seed=0, progress=False, **settings)
    losses = [trainer.train_step(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x), 16)]
    history = trainer.fit((x, y), epochs=2)
    epochs = [{k: v for k, v in row.items() if k != "time_s"} for row in history]
    return {"losses": losses, "history": epochs, "digest": digest(model)}


def main() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 784)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    images = rng.standard_normal((64, 3, 16, 16)).astype(np.float32)
    runs = {
        "mlp_sgd": (lambda: ops.Sequential(ops.Linear(784, 128), ops.ReLU(), ops.Linear(128, 64), ops.ReLU(),
                                           ops.Linear(64, 10)), x, lambda: optim.SGD(lr=0.01), {}),
        "mlp_adamw_accumulation_clip": (lambda: ops.Sequential(ops.Linear(784, 64), ops.ReLU(), ops.Linear(64, 10)),
                                        x, lambda: optim.AdamW(lr=1e-3),
                                        {"gradient_accumulation_steps": 2, "clip_grad_norm": 1.0}),
        "cnn_sgd_momentum": (lambda: ops.Sequential(
            ops.Conv2d(3, 8, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2), ops.Conv2d(8, 16, 3, padding=1), ops.ReLU(),
            ops.MaxPool2d(2), ops.Flatten(), ops.Linear(256, 10)), images, lambda: optim.SGD(lr=0.01, momentum=0.9), {}),
        "cnn_update_in_backward": (lambda: ops.Sequential(
            ops.Conv2d(3, 8, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2), ops.Flatten(), ops.Linear(512, 10)),
            images, lambda: optim.SGD(lr=0.01), {"update_in_backward": True}),
        "resnet18_sgd_momentum": (lambda: registry.models.get("resnet18")(num_classes=10), images,
                                  lambda: optim.SGD(lr=0.01, momentum=0.9), {}),
    }
    out = {}
    for seed, (name, (build, inputs, optimizer, settings)) in enumerate(runs.items(), start=1):
        nf.manual_seed(seed)
        out[name] = run(build(), inputs, y, optimizer(), **settings)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
