"""ResNet-18 (CIFAR variant) training step, NeuroFlow vs PyTorch CPU eager, batch 32, at 2 threads.

NeuroFlow: ``neuroflow_ops_vision.resnet18(num_classes=10)`` (3×3 stride-1 stem, no max-pool,
11,173,962 parameters), NHWC inside. PyTorch: the same architecture with torchvision's module names
(torchvision itself is not needed), loaded from NeuroFlow's state dict by name.

    .venv/bin/python benchmarks/resnet18.py             # 2 threads, a few minutes
    .venv/bin/python benchmarks/resnet18.py --quick     # smoke test

See ``convnet_bench.py`` for what a step is and how it is timed.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import convnet_bench


def build_neuroflow() -> Any:
    from neuroflow import registry

    return registry.models.get("resnet18")(num_classes=10)


def build_torch(state: dict[str, np.ndarray]) -> Any:
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.relu = nn.ReLU(inplace=True)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            identity = x if self.downsample is None else self.downsample(x)
            out = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(out)) + identity)

    class ResNet18(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            cin = 64
            for i, cout in enumerate((64, 128, 256, 512)):
                stride = 1 if i == 0 else 2
                setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
                cin = cout
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(512, 10)

        def forward(self, x: Any) -> Any:
            x = self.relu(self.bn1(self.conv1(x)))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    model = ResNet18()
    result = model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in state.items()},
                                   strict=False)
    # NeuroFlow keeps no num_batches_tracked; every other name must match both ways.
    if result.unexpected_keys or any(not k.endswith("num_batches_tracked") for k in result.missing_keys):
        raise RuntimeError(f"state dicts differ: missing {result.missing_keys}, unexpected {result.unexpected_keys}")
    return model


CASE = convnet_bench.Case("ResNet-18 (CIFAR variant) train step", 32, (3, 32, 32), 10, build_neuroflow, build_torch)

if __name__ == "__main__":
    sys.exit(convnet_bench.main(CASE, __file__, threads="2"))
