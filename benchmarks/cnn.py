"""Small CNN training step, NeuroFlow vs PyTorch CPU eager, at 1 and 2 threads.

conv3×3 3→32 (pad 1), ReLU, max-pool 2, conv3×3 32→64 (pad 1), ReLU, max-pool 2, linear 4096→10, on
3×32×32 inputs, batch 64 (issue 4). NeuroFlow builds it from the vision ops as a user would: the first
convolution reads NCHW and writes NHWC, everything after runs in NHWC, so the linear layer's weight
columns are in (h, w, c) order; the PyTorch copy gets them permuted to (c, h, w). The Trainer runs each
ReLU inside the max-pool after it (``neuroflow.fusion``: relu∘max = max∘relu, a quarter of the ReLU's
passes, no ReLU buffers); the model stays as written. A second NeuroFlow contender trains with
``update_in_backward=True``.

    .venv/bin/python benchmarks/cnn.py              # 1 and 2 threads, about a minute
    .venv/bin/python benchmarks/cnn.py --quick      # smoke test
    .venv/bin/python benchmarks/cnn.py --threads 2 --rounds 30

See ``convnet_bench.py`` for what a step is and how it is timed.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import convnet_bench


def build_neuroflow() -> Any:
    import neuroflow as nf
    from neuroflow import ops

    return nf.Sequential(
        ops.Conv2d(3, 32, 3, padding=1, output_layout="NHWC"), ops.ReLU(), ops.MaxPool2d(2, layout="NHWC"),
        ops.Conv2d(32, 64, 3, padding=1, layout="NHWC"), ops.ReLU(), ops.MaxPool2d(2, layout="NHWC"),
        ops.Flatten(), ops.Linear(4096, 10),
    )


def build_torch(state: dict[str, np.ndarray]) -> Any:
    import torch

    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(4096, 10),
    )
    state = dict(state)
    state["7.weight"] = state["7.weight"].reshape(10, 8, 8, 64).transpose(0, 3, 1, 2).reshape(10, 4096)
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()})
    return model


STREAMED = "NeuroFlow, update in backward"
CASE = convnet_bench.Case("Small CNN (2 conv + 2 max-pool + linear) train step", 64, (3, 32, 32), 10,
                          build_neuroflow, build_torch, variants={STREAMED: build_neuroflow},
                          variant_options={STREAMED: {"update_in_backward": True}})

if __name__ == "__main__":
    sys.exit(convnet_bench.main(CASE, __file__, threads="1,2"))
