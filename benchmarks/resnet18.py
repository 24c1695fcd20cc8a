"""ResNet-18 (CIFAR variant) training step, NeuroFlow vs PyTorch CPU eager, batch 32, at 2 threads.

NeuroFlow: ``neuroflow_ops_vision.resnet18(num_classes=10)`` (3×3 stride-1 stem, no max-pool,
11,173,962 parameters), NHWC inside. PyTorch: the same architecture with torchvision's module names
(torchvision itself is not needed), loaded from NeuroFlow's state dict by name. A second NeuroFlow
contender trains with ``update_in_backward=True`` (its kernels' updates applied inside backward), a third
keeps every block's output for backward (``recompute_block_outputs=False``) instead of recomputing it.

    .venv/bin/python benchmarks/resnet18.py             # 2 threads, a few minutes
    .venv/bin/python benchmarks/resnet18.py --quick     # smoke test

See ``convnet_bench.py`` for what a step is and how it is timed.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import convnet_bench


def build_neuroflow(recompute_block_outputs: bool = True) -> Any:
    from neuroflow import registry

    return registry.models.get("resnet18")(num_classes=10, recompute_block_outputs=recompute_block_outputs)


def build_neuroflow_keeping_outputs() -> Any:
    return build_neuroflow(recompute_block_outputs=False)


def build_torch(state: dict[str, np.ndarray]) -> Any:
    import torch

    from neuroflow_ops_vision.models.torch_twin import torch_resnet18

    model = torch_resnet18(num_classes=10)
    result = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()},
                                   strict=False)
    # NeuroFlow keeps no num_batches_tracked; every other name must match both ways.
    if result.unexpected_keys or any(not k.endswith("num_batches_tracked") for k in result.missing_keys):
        raise RuntimeError(f"state dicts differ: missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    return model


STREAMED = "NeuroFlow, update in backward"
KEPT = "NeuroFlow, block outputs kept"
CASE = convnet_bench.Case("ResNet-18 (CIFAR variant) train step", 32, (3, 32, 32), 10, build_neuroflow, build_torch,
                          variants={STREAMED: build_neuroflow, KEPT: build_neuroflow_keeping_outputs},
                          variant_options={STREAMED: {"update_in_backward": True}})

if __name__ == "__main__":
    sys.exit(convnet_bench.main(CASE, __file__, threads="2"))
