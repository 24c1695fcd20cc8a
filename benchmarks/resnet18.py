"""ResNet-18 (CIFAR variant) training step, NeuroFlow vs PyTorch CPU eager, batch 32, at 2 threads.

The main contender, ``NeuroFlow``, is ``registry.models.get("resnet18")(num_classes=10)`` as a user calls
it, no layout argument (3×3 stride-1 stem, no max-pool, 11,173,962 parameters; NCHW input), trained with
SGD lr 0.01 momentum 0.9. PyTorch: the same architecture with torchvision's module names (torchvision
itself is not needed), loaded from NeuroFlow's state dict by name, the same optimizer. Further NeuroFlow
contenders on request (``--variants``): ``streamed`` trains with ``update_in_backward=True`` (its kernels'
updates applied inside backward), ``kept`` keeps every block's output for backward
(``recompute_block_outputs=False``) instead of recomputing it.

    .venv/bin/python benchmarks/resnet18.py                     # 2 threads, one process, under a minute
    .venv/bin/python benchmarks/resnet18.py --variants all --repeats 9
    .venv/bin/python benchmarks/resnet18.py --separate-processes  # also one process per contender, with RSS
    .venv/bin/python benchmarks/resnet18.py --quick             # smoke test

See ``convnet_bench.py`` for what a step is and how it is timed.
"""

from __future__ import annotations

import neuroflow  # noqa: F401 - first, as the spec's snippet does: it shortens OpenBLAS's idle spin (neuroflow.blas_idle)

# isort: split
import sys
from typing import Any

import numpy as np

import convnet_bench


def build_neuroflow(recompute_block_outputs: bool = True) -> Any:
    from neuroflow import registry

    if recompute_block_outputs:  # the default, so called exactly as a user calls it
        return registry.models.get("resnet18")(num_classes=10)
    return registry.models.get("resnet18")(num_classes=10, recompute_block_outputs=False)


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


CASE = convnet_bench.Case(
    "ResNet-18 (CIFAR variant) train step", 32, (3, 32, 32), 10, build_neuroflow, build_torch,
    variants={
        "streamed": convnet_bench.Variant("NeuroFlow, update in backward", build_neuroflow,
                                          {"update_in_backward": True}),
        "kept": convnet_bench.Variant("NeuroFlow, block outputs kept", build_neuroflow_keeping_outputs),
    },
    default_variants=(), threads="2", timing=(7, 2, 2),
)

if __name__ == "__main__":
    sys.exit(convnet_bench.main(CASE, __file__))
