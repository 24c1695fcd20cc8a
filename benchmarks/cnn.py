"""Small CNN training step as the spec writes it, NeuroFlow vs PyTorch CPU eager, at 2 threads.

The main contender, ``NeuroFlow``, is the spec's snippet exactly, as a PyTorch user writes it: no layout
argument anywhere, NCHW input, batch 64, SGD lr 0.01 (momentum 0.9)::

    Sequential(ops.Conv2d(3, 32, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
               ops.Conv2d(32, 64, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
               ops.Flatten(), ops.Linear(4096, 10))

against the same model and optimizer in PyTorch, with the same weights. Beside it, ``NeuroFlow, NHWC
hints`` (variant ``hints``, on by default) is the tuned model: the first convolution writes NHWC
(``output_layout="NHWC"``), everything after runs in NHWC (``layout="NHWC"``), so its linear weight's
columns are (h, w, c) and it gets the main model's weight with its columns permuted. ``--variants
streamed`` adds the hint-free model trained with ``update_in_backward=True``.

    .venv/bin/python benchmarks/cnn.py                      # 2 threads, one process, about 30 s
    .venv/bin/python benchmarks/cnn.py --threads 1,2 --repeats 30
    .venv/bin/python benchmarks/cnn.py --separate-processes  # also one process per contender, with RSS
    .venv/bin/python benchmarks/cnn.py --quick               # smoke test

See ``convnet_bench.py`` for what a step is and how it is timed.
"""

from __future__ import annotations

import neuroflow  # noqa: F401 - first, as the spec's snippet does: it shortens OpenBLAS's idle spin (neuroflow.blas_idle)

# isort: split
import sys
from typing import Any

import numpy as np

import convnet_bench


def build_neuroflow() -> Any:
    """The spec's CNN snippet, as written: NCHW, no layout hints."""
    import neuroflow as nf
    from neuroflow import ops

    return nf.Sequential(
        ops.Conv2d(3, 32, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
        ops.Conv2d(32, 64, 3, padding=1), ops.ReLU(), ops.MaxPool2d(2),
        ops.Flatten(), ops.Linear(4096, 10),
    )


def build_neuroflow_with_hints() -> Any:
    """The same model tuned by hand: NHWC from the first convolution's output on, the main model's weights."""
    import neuroflow as nf
    from neuroflow import ops

    state = dict(build_neuroflow().state_dict())
    model = nf.Sequential(
        ops.Conv2d(3, 32, 3, padding=1, output_layout="NHWC"), ops.ReLU(), ops.MaxPool2d(2, layout="NHWC"),
        ops.Conv2d(32, 64, 3, padding=1, layout="NHWC"), ops.ReLU(), ops.MaxPool2d(2, layout="NHWC"),
        ops.Flatten(), ops.Linear(4096, 10),
    )
    # Flatten of an NHWC map orders features (h, w, c); the main model's (and PyTorch's) are (c, h, w).
    state["7.weight"] = np.asarray(state["7.weight"]).reshape(10, 64, 8, 8).transpose(0, 2, 3, 1).reshape(10, 4096)
    model.load_state_dict(state)
    return model


def build_torch(state: dict[str, np.ndarray]) -> Any:
    """The same model in PyTorch, loaded from the main NeuroFlow model's state dict."""
    import torch

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(4096, 10),
    )
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})
    return model


CASE = convnet_bench.Case(
    "Small CNN (2 conv + 2 max-pool + linear, as the spec writes it) train step", 64, (3, 32, 32), 10,
    build_neuroflow, build_torch,
    variants={
        "hints": convnet_bench.Variant("NeuroFlow, NHWC hints", build_neuroflow_with_hints),
        "streamed": convnet_bench.Variant("NeuroFlow, update in backward", build_neuroflow,
                                          {"update_in_backward": True}),
    },
    default_variants=("hints",), threads="2", timing=(15, 5, 5),
)

if __name__ == "__main__":
    sys.exit(convnet_bench.main(CASE, __file__))
